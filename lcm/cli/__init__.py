"""The ``lcm`` command line: one group per concern (``db``, ``status``, ``doctor``, ...).

Every command takes ``--url`` (or ``LCM_DATABASE_URL``) and ``--json``. Failures print one
line to stderr and exit non-zero; a traceback is a bug.
"""

from __future__ import annotations

import sys

import click

from lcm.cli.common import run_guarded
from lcm.cli.db import db_group
from lcm.cli.inspect import doctor_command, status_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lossless-context", prog_name="lcm")
def cli() -> None:
    """Lossless Context Management: every message kept, a summary DAG, recall tools."""


cli.add_command(db_group)
cli.add_command(status_command)
cli.add_command(doctor_command)


def main(argv: list[str] | None = None) -> None:
    sys.exit(run_guarded(cli, argv))
