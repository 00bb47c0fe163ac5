"""Shared CLI plumbing: the --url/--agent/--json options, opening the store or an context,
output, and turning every failure into one line on stderr."""

from __future__ import annotations

import json
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from lcm.config import LcmConfig, set_default_application_name
from lcm.context.ports import StorePorts
from lcm.context.session import ContextSession
from lcm.errors import LcmError, NotFoundError, first_line
from lcm.store import Store
from lcm.store import connection as db

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)

url_option = click.option(
    "--url", envvar="LCM_DATABASE_URL", default=None, metavar="URL",
    help="Database URL (sqlite:///path or postgresql+psycopg://user@host/db); "
         "default: $LCM_DATABASE_URL, else ~/.lcm/lcm.db.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
tsv_option = click.option("--tsv", "as_tsv", is_flag=True,
                          help="Print tab-separated values with a header line (for cut, awk, spreadsheets).")


def emit_tsv(columns: list[str], rows: list[list[Any]]) -> None:
    """A header line and one line per row, tab-separated; tabs, newlines and backslashes in a
    value are escaped (\\t, \\n, \\\\) so every row stays one line."""
    def cell(value: Any) -> str:
        text = "" if value is None else str(value)
        return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\r", "\\r").replace("\n", "\\n")

    click.echo("\t".join(columns))
    for row in rows:
        click.echo("\t".join(cell(v) for v in row))
agent_option = click.option(
    "--agent", envvar="LCM_AGENT_ID", default="default", show_default=True, metavar="NAME",
    help="Agent scope (a Hermes profile name; $LCM_AGENT_ID).")


class LineProgress:
    """rich's ``Progress`` calls, for a stderr that is not a terminal (CI logs, pipes): a line
    per task and per update, and one every ``LINE_EVERY`` seconds while a task advances, so a
    log never goes quiet for a minute."""

    LINE_EVERY = 5.0

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def add_task(self, description: str, total: int, unit: str = "turns") -> int:
        self.total, self.done, self.shown, self.unit = total, 0, time.monotonic(), unit
        stderr.print(f"{description}: {total} {unit.removesuffix('s') if total == 1 else unit}", markup=False)
        return 0

    def update(self, task: int, description: str) -> None:
        stderr.print(description, markup=False)

    def advance(self, task: int, steps: int = 1) -> None:
        self.done += steps
        if time.monotonic() - self.shown >= self.LINE_EVERY:
            self.shown = time.monotonic()
            stderr.print(f"  {self.done}/{self.total} {self.unit}", markup=False)


def progress_bar(enabled: bool) -> Any:
    """Progress on stderr (stdout stays clean for --json and pipes): a live bar in a terminal,
    plain lines elsewhere (:class:`LineProgress`), nothing when not ``enabled``. Used as a
    context manager; ``add_task(description, total, unit=...)`` and ``advance(task, n)``."""
    if not enabled:
        return nullcontext(None)
    if not stderr.is_terminal:
        return LineProgress()
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(), console=stderr, transient=True)


def require_existing(url: str | None) -> None:
    """A command that only reads refuses a SQLite file that does not exist (a typo in a path
    must not quietly create an empty database)."""
    resolved = db.resolve_url(url)
    if resolved.get_backend_name() == "sqlite" and resolved.database not in (None, "", ":memory:"):
        path = Path(resolved.database).expanduser()
        if not path.exists():
            raise NotFoundError(f"no lcm database at {path} (lcm demo or lcm ingest creates one; "
                                "--url or LCM_DATABASE_URL picks another)")


def open_store(url: str | None, *, create: bool = False) -> Store:
    """The store at ``url`` (see :func:`require_existing` unless ``create``)."""
    if not create:
        require_existing(url)
    return Store.open(db.resolve_url(url))


def open_context(url: str | None, agent: str, *, create: bool = False, context_length: int | None = None,
                 **settings: Any) -> ContextSession:
    """A context session of ``agent`` on the store at ``url`` (settings from the environment,
    then ``settings``; ``context_length``: the model window compaction aims for)."""
    return context_on(open_store(url, create=create), agent, context_length=context_length, **settings)


def context_on(store: Store, agent: str, *, context_length: int | None = None, **settings: Any) -> ContextSession:
    """A context session of ``agent`` on an open store (see :func:`open_context`)."""
    config = LcmConfig.from_env(agent_id=agent, **settings)
    # A command is over in seconds: what it stores is embedded before it exits, not by a thread.
    return ContextSession(config, store, agent_id=agent, context_length=context_length or 0,
                          background_embedding=False, apply_filters=False)


def latest_session_key(store: StorePorts, agent: str) -> str:
    """The agent's most recently active session (the default for describe and status)."""
    best = None
    for s in store.sessions.each(agent):
        if best is None or s.updated_at >= best.updated_at:
            best = s
    if best is None:
        raise NotFoundError(f"agent {agent!r} has no sessions in this store (lcm sessions --all-agents lists agents)")
    return best.session_key


def when(ts: float | None) -> str:
    """A Unix time as a short UTC ISO string."""
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))


def marked(snippet: str) -> Text:
    """A search snippet with its ``**matched**`` words in bold (never parsed as markup)."""
    text = Text()
    for i, part in enumerate(snippet.split("**")):
        text.append(part, style="bold yellow" if i % 2 else "")
    return text


def name_connections(ctx: click.Context) -> None:
    """Name this process's PostgreSQL connections after the command being run (a group calls
    it again with its own subcommand): pg_stat_activity shows ``lcm-cli db upgrade`` next to
    the agents' ``lcm``. ``LCM_APPLICATION_NAME`` overrides it."""
    words = [*ctx.command_path.split()[1:], ctx.invoked_subcommand or ""]
    set_default_application_name(" ".join(["lcm-cli", *filter(None, words)]))


#: Columns a table may take when stdout is a pipe or a file: as wide as its content, never wrapped.
PIPED_WIDTH = 10_000


def show_table(table: Table) -> None:
    """Print a table: boxed in a terminal; to a pipe or a file, plain space-aligned columns as
    wide as their content (no box characters, no wrapping at 80 columns), for grep, cut and awk
    (``--tsv`` or ``--json`` where a script wants exact fields)."""
    if stdout.is_terminal:
        stdout.print(table)
        return
    table.box = None
    table.pad_edge = False
    before = stdout._width  # rich caps print(width=) at the console's own width
    stdout.width = PIPED_WIDTH
    try:
        stdout.print(table, crop=False)
    finally:
        stdout._width = before


def say(text: str) -> None:
    """Print a plain line (never parsed as rich markup: paths and ids contain brackets)."""
    stdout.print(text, markup=False)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, ensure_ascii=False, indent=2, default=str))


def run_guarded(cli: click.Group, argv: list[str] | None) -> int:
    """Run the click app; lcm errors become one line on stderr and exit status 1."""
    try:
        # Without standalone mode click *returns* the code of a click.exceptions.Exit.
        code = cli.main(args=argv, prog_name="lcm", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.UsageError as exc:
        # One error style: the words of the command line, and where to look (exit 2: usage).
        where = exc.ctx.command_path if exc.ctx is not None else "lcm"
        stderr.print(f"lcm: error: {exc.format_message()} ({where} --help lists what it takes)", markup=False)
        return exc.exit_code
    except click.ClickException as exc:
        stderr.print(f"lcm: error: {exc.format_message()}", markup=False)
        return exc.exit_code
    except click.exceptions.Abort as exc:
        if isinstance(exc.__context__, KeyboardInterrupt):  # click turns Ctrl-C into Abort
            stderr.print("lcm: interrupted")
            return 130  # the shell's convention for SIGINT
        stderr.print("lcm: aborted")
        return 1
    except (LcmError, ValueError) as exc:
        stderr.print(f"lcm: error: {first_line(exc)}", markup=False)
        return 1
    except KeyboardInterrupt:
        stderr.print("lcm: interrupted")
        return 130
    except BrokenPipeError:  # `lcm export | head`: the reader left; not an error of ours
        return 0
    except OSError as exc:
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        stderr.print(f"lcm: error: {exc.strerror or exc}{where}", markup=False)
        return 1
    except Exception as exc:
        if os.environ.get("LCM_DEBUG"):
            raise
        kind = "database error" if _from_database(exc) else f"internal error ({type(exc).__name__})"
        stderr.print(f"lcm: {kind}: {first_line(exc)} "
                     "(LCM_DEBUG=1 shows the traceback)", markup=False)
        return 1


def _from_database(exc: BaseException) -> bool:
    """An error the database driver layer raised (SQLAlchemy's, which only lcm.store imports)."""
    return any(cls.__module__.startswith("sqlalchemy.") for cls in type(exc).__mro__)




