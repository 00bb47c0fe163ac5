"""Running the command line: every failure becomes one line on stderr with the right exit code
(a traceback is a bug), and PostgreSQL connections are named after the command. Light on
purpose: ``lcm --version`` and ``lcm --help`` load this and click, little else."""

from __future__ import annotations

import os

import click

from lcm.config import set_default_application_name
from lcm.errors import LcmError, first_line


def _error(text: str) -> None:
    """One line on stderr, exactly as given (the output module is loaded only now)."""
    from lcm.cli.common import stderr

    stderr.print(text, markup=False)


def name_connections(ctx: click.Context) -> None:
    """Name this process's PostgreSQL connections after the command being run (a group calls
    it again with its own subcommand): pg_stat_activity shows ``lcm-cli db upgrade`` next to
    the agents' ``lcm``. ``LCM_APPLICATION_NAME`` overrides it."""
    words = [*ctx.command_path.split()[1:], ctx.invoked_subcommand or ""]
    set_default_application_name(" ".join(["lcm-cli", *filter(None, words)]))


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
        _error(f"lcm: error: {exc.format_message()} ({where} --help lists what it takes)")
        return exc.exit_code
    except click.ClickException as exc:
        _error(f"lcm: error: {exc.format_message()}")
        return exc.exit_code
    except click.exceptions.Abort as exc:
        if isinstance(exc.__context__, KeyboardInterrupt):  # click turns Ctrl-C into Abort
            _error("lcm: interrupted")
            return 130  # the shell's convention for SIGINT
        _error("lcm: aborted")
        return 1
    except (LcmError, ValueError) as exc:
        _error(f"lcm: error: {first_line(exc)}")
        return 1
    except KeyboardInterrupt:
        _error("lcm: interrupted")
        return 130
    except BrokenPipeError:  # `lcm export | head`: the reader left; not an error of ours
        return 0
    except OSError as exc:
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        _error(f"lcm: error: {exc.strerror or exc}{where}")
        return 1
    except Exception as exc:
        if os.environ.get("LCM_DEBUG"):
            raise
        kind = "database error" if _from_database(exc) else f"internal error ({type(exc).__name__})"
        _error(f"lcm: {kind}: {first_line(exc)} (LCM_DEBUG=1 shows the traceback)")
        return 1


def _from_database(exc: BaseException) -> bool:
    """An error the database driver layer raised (SQLAlchemy's, which only lcm.store imports)."""
    return any(cls.__module__.startswith("sqlalchemy.") for cls in type(exc).__mro__)
