"""``lcm ui``: the web explorer (the ``ui`` extra)."""

from __future__ import annotations

import secrets
import webbrowser
from importlib.util import find_spec

import click

from lcm.cli.common import emit_json, json_option, say, url_option
from lcm.cli.stores import read_url_option, require_existing
from lcm.config import install_command
from lcm.errors import ConfigError
from lcm.store import Store
from lcm.store import connection as db


@click.command("ui")
@url_option
@json_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback requires a token.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="0: a free port.")
@click.option("--token", default=None, help="Require this token on every request (generated when --host is not "
                                            "loopback and none is given).")
@click.option("--no-browser", is_flag=True, help="Do not open the page in a browser.")
def ui_command(url: str | None, as_json: bool, host: str, port: int, token: str | None, no_browser: bool) -> None:
    """Explore the store in a browser: agents, sessions, messages, the summary DAG, search,
    status and health. Read-only. --json prints the address as JSON, then serves."""
    if find_spec("starlette") is None or find_spec("uvicorn") is None or find_spec("jinja2") is None:
        raise ConfigError(f"lcm ui needs the ui extra: {install_command('ui')}")
    from lcm.ui.app import create_app
    from lcm.ui.serve import bind, is_loopback, run

    if not is_loopback(host) and token is None:
        token = secrets.token_urlsafe(24)
    require_existing(url)
    # Not even a schema upgrade; reads from the replica when --read-url / LCM_DATABASE_READ_URL names one.
    store = Store.open(db.resolve_url(url), upgrade=False, read_only=True, read_url=read_url_option())
    sock = bind(host, port)
    shown_host = f"[{host}]" if ":" in host else host
    address = f"http://{shown_host}:{sock.getsockname()[1]}/" + (f"?token={token}" if token else "")
    if as_json:
        emit_json({"url": address, "database": store.location, "read_only": True})
    else:
        say(f"lcm ui: {address}  (read-only view of {store.location}; Ctrl-C stops it)")
    if not no_browser:
        webbrowser.open(address)
    run(create_app(store, token=token), sock)
