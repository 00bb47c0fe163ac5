"""Shared CLI plumbing: the --url/--agent/--json/--tsv options and output (tables, JSON, TSV,
progress). Opening a store or a context is in ``stores``; turning a failure into one line on
stderr in ``guard``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])

_url_option = click.option(
    "--url", envvar="LCM_DATABASE_URL", default=None, metavar="URL",
    help="Database URL (sqlite:///path or postgresql+psycopg://user@host/db); "
         "default: $LCM_DATABASE_URL, else ~/.lcm/lcm.db.",
)
#: Where ``--read-url`` is kept for ``lcm.cli.stores.open_store`` (the click context's meta).
READ_URL_KEY = "lcm.read_url"


def _remember_read_url(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value:
        ctx.meta[READ_URL_KEY] = value
    return value


_read_url_option = click.option(
    "--read-url", envvar="LCM_DATABASE_READ_URL", default=None, metavar="URL", expose_value=False,
    callback=_remember_read_url,
    help="A streaming replica of the PostgreSQL store for searches, expand, describe, exports and "
         "lcm ui (default: $LCM_DATABASE_READ_URL); a replica that lags or is down costs a fallback to --url.")


def url_option(command: F) -> F:
    """``--url`` and ``--read-url``: the store, and optionally a read replica of it."""
    return _url_option(_read_url_option(command))
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
        with stdout.capture() as captured:
            stdout.print(table, crop=False)
    finally:
        stdout._width = before
    # Cells are padded to their column's width: no line ends in spaces for the next tool.
    stdout.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


@contextmanager
def resumable(command: str, kept: str) -> Iterator[None]:
    """Ctrl-C inside: say what is kept and that the same command continues (then exit 130)."""
    try:
        yield
    except KeyboardInterrupt:
        stderr.print(f"{command}: interrupted; {kept}: run the same command again to continue", markup=False)
        raise


def say(text: str) -> None:
    """Print a plain line (never parsed as rich markup: paths and ids contain brackets)."""
    stdout.print(text, markup=False)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, ensure_ascii=False, indent=2, default=str))
