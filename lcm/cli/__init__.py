"""The ``lcm`` command line: one module per concern — ``demo``; ``transfer`` (ingest, export);
``recall`` (sessions, grep, describe, expand, load: the agent tools for people); ``inspect``
(status, doctor, backup); ``embed`` (vectors for semantic search); ``db`` (migrations);
``importing``, ``migrate``, ``forget``, ``hermes``, ``ui``, ``proxy``.

Every command takes ``--url`` (or ``LCM_DATABASE_URL``) and ``--json``. Failures print one
line to stderr and exit non-zero; a traceback is a bug.

A command's module is imported when that command runs, not before (:class:`LazyGroup`):
``lcm --version`` and ``lcm --help`` load click and little else, and ``lcm grep`` loads what
grep uses. The one-line help of each command is written here for ``lcm --help``; a test keeps
it equal to the command's own.
"""

from __future__ import annotations

import importlib
import sys
from typing import NamedTuple

import click

from lcm.cli.guard import name_connections, run_guarded


class Lazy(NamedTuple):
    """Where a command lives, and the first paragraph of its help (what ``lcm --help`` lists)."""

    module: str
    attribute: str
    summary: str


#: Every command of ``lcm``, in the order ``lcm --help`` lists them.
COMMANDS: dict[str, Lazy] = {
    "backup": Lazy("lcm.cli.inspect", "backup_command",
        "A consistent copy of a SQLite store, taken while it is in use (SQLite's backup API)."),
    "db": Lazy("lcm.cli.db", "db_group",
        "Create, upgrade and inspect the database schema."),
    "demo": Lazy("lcm.cli.demo", "demo_command",
        "Watch lcm compact a long agent transcript and recall an early fact exactly."),
    "describe": Lazy("lcm.cli.recall", "describe_command",
        "The summary DAG of a session, or one summary node (NODE: 7 or node:7)."),
    "doctor": Lazy("lcm.cli.inspect", "doctor_command",
        "Check database integrity, schema, search index, the summary DAG and the settings."),
    "embed": Lazy("lcm.cli.embed", "embed_command",
        "Embed every message and summary that has no vector of the configured model yet "
        "(LCM_EMBEDDINGS; resumable, idempotent)."),
    "expand": Lazy("lcm.cli.recall", "expand_command",
        "Exact original text: REF is msg:ID (a stored message) or node:ID (a summary's sources)."),
    "export": Lazy("lcm.cli.transfer", "export_command",
        "Write sessions as JSONL that `lcm ingest` reads back into an identical store."),
    "forget": Lazy("lcm.cli.forget", "forget_command",
        "Erase messages for good: from the messages, the search index, the vectors and every "
        "summary that covers them (summaries are then rebuilt from what remains). Shows what "
        "would go first; every condition given must hold."),
    "grep": Lazy("lcm.cli.recall", "grep_command",
        "Search stored messages and summaries (the lcm_grep tool): every word first, then any of "
        "the content words, best first."),
    "hermes": Lazy("lcm.cli.hermes", "hermes_group",
        "Install lcm as the Hermes agent's context engine, or remove it."),
    "import": Lazy("lcm.cli.importing", "import_command",
        "Import another store: hermes (Hermes' state.db: every session, message, tool call and "
        "system prompt), hermes-lcm or lossless-claw (their lcm.db: every message and their summary "
        "DAG), or jsonl (what lcm export writes). Idempotent; the file is only read."),
    "ingest": Lazy("lcm.cli.transfer", "ingest_command",
        "Store a transcript (OpenAI-format JSON or JSONL, or - for stdin), each message once."),
    "load": Lazy("lcm.cli.recall", "load_command",
        "A whole session in order (the lcm_load_session tool, every page)."),
    "migrate": Lazy("lcm.cli.migrate", "migrate_command",
        "Copy every agent, session, message, summary and vector of the store into another "
        "database (e.g. SQLite to a team's PostgreSQL), then verify both sides. Run it again to "
        "copy what was added since, or to finish an interrupted run."),
    "proxy": Lazy("lcm.cli.proxy", "proxy_command",
        "Serve the OpenAI chat API on HOST:PORT in front of --upstream: every message stored once, "
        "the model handed lcm's context within its window, the lcm tools and auto-recall added."),
    "recall": Lazy("lcm.cli.recall", "recall_command",
        "The auto-recall block lcm would add before the model answers MESSAGE: the stored turns "
        "of any of the agent's sessions that best match it, verbatim, with their store ids."),
    "sessions": Lazy("lcm.cli.recall", "sessions_command",
        "List sessions: messages, tokens, summaries and how much is compacted."),
    "status": Lazy("lcm.cli.inspect", "status_command",
        "Show the store (backend, location, size, row counts) or one session's state."),
    "ui": Lazy("lcm.cli.ui", "ui_command",
        "Explore the store in a browser: agents, sessions, messages, the summary DAG, search, "
        "status and health. Read-only. --json prints the address as JSON, then serves."),
}


class LazyGroup(click.Group):
    """A group whose commands are imported on first use (see the module docstring)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        lazy = COMMANDS.get(cmd_name)
        if lazy is None:
            return super().get_command(ctx, cmd_name)
        command: click.Command = getattr(importlib.import_module(lazy.module), lazy.attribute)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their one-line help, without importing any of them (click's own
        version imports every command to ask for its help)."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        # A stand-in with the same help text shortens it exactly as the command itself would.
        rows = [(name, (click.Command(name, help=COMMANDS[name].summary) if name in COMMANDS
                        else self.commands[name]).get_short_help_str(limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lossless-context", prog_name="lcm")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Lossless Context Management: every message kept, a summary DAG, recall tools."""
    name_connections(ctx)


def main(argv: list[str] | None = None) -> None:
    sys.exit(run_guarded(cli, argv))
