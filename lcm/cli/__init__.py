"""The ``lcm`` command line: one module per concern — ``demo``; ``transfer`` (ingest, export);
``recall`` (sessions, grep, describe, expand, load: the agent tools for people); ``inspect``
(status, doctor, backup); ``embed`` (vectors for semantic search); ``db`` (migrations).

Every command takes ``--url`` (or ``LCM_DATABASE_URL``) and ``--json``. Failures print one
line to stderr and exit non-zero; a traceback is a bug.
"""

from __future__ import annotations

import sys

import click

from lcm.cli.common import name_connections, run_guarded
from lcm.cli.db import db_group
from lcm.cli.demo import demo_command
from lcm.cli.embed import embed_command
from lcm.cli.forget import forget_command
from lcm.cli.hermes import hermes_group
from lcm.cli.importing import import_command
from lcm.cli.inspect import backup_command, doctor_command, status_command
from lcm.cli.migrate import migrate_command
from lcm.cli.recall import describe_command, expand_command, grep_command, load_command, sessions_command
from lcm.cli.transfer import export_command, ingest_command
from lcm.cli.ui import ui_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lossless-context", prog_name="lcm")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Lossless Context Management: every message kept, a summary DAG, recall tools."""
    name_connections(ctx)


for command in (demo_command, ingest_command, export_command, sessions_command, status_command,
                grep_command, describe_command, expand_command, load_command, doctor_command,
                backup_command, embed_command, migrate_command, forget_command, import_command, db_group,
                hermes_group, ui_command):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    sys.exit(run_guarded(cli, argv))
