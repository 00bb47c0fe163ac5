"""Shared CLI plumbing: the --url/--json options, output, and turning errors into one line."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console

from lcm.errors import LcmError

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)

url_option = click.option(
    "--url", envvar="LCM_DATABASE_URL", default=None, metavar="URL",
    help="Database URL (sqlite:///path or postgresql+psycopg://user@host/db); "
         "default: $LCM_DATABASE_URL, else ~/.lcm/lcm.db.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")


def say(text: str) -> None:
    """Print a plain line (never parsed as rich markup: paths and ids contain brackets)."""
    stdout.print(text, markup=False)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, ensure_ascii=False, indent=2, default=str))


def run_guarded(cli: click.Group, argv: list[str] | None) -> int:
    """Run the click app; lcm errors become one line on stderr and exit status 1."""
    try:
        cli.main(args=argv, prog_name="lcm", standalone_mode=False)
        return 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        stderr.print("lcm: aborted")
        return 1
    except (LcmError, ValueError) as exc:
        stderr.print(f"lcm: error: {exc}", markup=False)
        return 1
    except KeyboardInterrupt:
        stderr.print("lcm: interrupted")
        return 130


