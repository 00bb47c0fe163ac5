"""``lcm proxy``: lcm between any OpenAI chat-API client and its model provider (the ``ui``
extra: starlette and uvicorn)."""

from __future__ import annotations

import secrets
import sys
from importlib.util import find_spec

import click

from lcm.cli.common import agent_option, emit_json, json_option, say, url_option
from lcm.cli.stores import open_store
from lcm.config import LcmConfig, install_command
from lcm.errors import ConfigError


@click.command("proxy")
@click.option("--upstream", required=True, metavar="URL",
              help="The provider's OpenAI-compatible base URL, e.g. https://api.openai.com/v1.")
@url_option
@agent_option
@json_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback requires tokens (--tokens; one is generated "
                   "for the default agent when none is given).")
@click.option("--port", type=click.IntRange(0, 65535), default=8787, show_default=True, help="0: a free port.")
@click.option("--tokens", "tokens_file", default=None, metavar="FILE",
              help='JSON object of token -> agent ({"long-random-token": "agent-name"}, mode 600): every request '
                   "must carry one (X-LCM-Token, or the base URL http://HOST:PORT/t/TOKEN/v1).")
@click.option("--context-length", type=click.IntRange(1024), default=None,
              help="The model's context window in tokens, for every model (default: by model name, docs/proxy.md).")
@click.option("--windows", "windows_file", default=None, metavar="FILE",
              help="JSON object of model-name prefix -> context window, over the built-in table.")
@click.option("--timeout", type=click.FloatRange(1.0), default=600.0, show_default=True,
              help="Seconds the upstream may stay silent (before its answer, or between two streamed bytes).")
@click.option("--no-tools", is_flag=True, help="Do not offer the lcm tools to the model.")
def proxy_command(upstream: str, url: str | None, agent: str, as_json: bool, host: str, port: int,
                  tokens_file: str | None, context_length: int | None, windows_file: str | None, timeout: float,
                  no_tools: bool) -> None:
    """Serve the OpenAI chat API on HOST:PORT in front of --upstream: every message stored once,
    the model handed lcm's context within its window, the lcm tools and auto-recall added.

    Clients set their base URL to http://HOST:PORT/v1; their API key goes upstream untouched.
    --json prints the address as JSON, then serves."""
    if any(find_spec(name) is None for name in ("starlette", "uvicorn", "aiohttp")):
        raise ConfigError(f"lcm proxy needs the ui extra (starlette, uvicorn, aiohttp): {install_command('ui')}")
    if not upstream.startswith(("http://", "https://")):
        raise ConfigError(f"--upstream must be an http(s) URL such as https://api.openai.com/v1, got {upstream!r}")
    from lcm.proxy.app import ProxySettings, create_app
    from lcm.proxy.callers import Callers, load_tokens
    from lcm.proxy.conversations import Conversations
    from lcm.proxy.windows import Windows, load_windows
    from lcm.ui.serve import bind, is_loopback, run

    tokens = load_tokens(tokens_file) if tokens_file else {}
    generated = None
    if not is_loopback(host) and not tokens:
        generated = secrets.token_urlsafe(24)
        tokens = {generated: agent}
    windows = Windows(context_length, load_windows(windows_file) if windows_file else None)
    store = open_store(url, create=True)
    config = LcmConfig.from_env(agent_id=agent)
    conversations = Conversations(store, config, windows, upstream)
    app = create_app(ProxySettings(upstream=upstream, timeout=timeout, tools=not no_tools), conversations,
                     Callers(agent, tokens))
    sock = bind(host, port)
    shown_host = f"[{host}]" if ":" in host else host
    address = f"http://{shown_host}:{sock.getsockname()[1]}/v1"
    info = {"base_url": address, "upstream": upstream, "database": store.location, "agent": agent,
            "agents_by_token": sorted(set(tokens.values())), "tools": not no_tools,
            **({"token": generated, "base_url_with_token": address.replace("/v1", f"/t/{generated}/v1")}
               if generated else {})}
    if as_json:
        emit_json(info)
    else:
        say(f"lcm proxy: {address} -> {upstream}  (store {store.location}; Ctrl-C stops it)")
        if generated:
            say(f"token for agent {agent!r}: {generated}  (base URL {info['base_url_with_token']})")
    sys.stdout.flush()
    run(app, sock, lifespan=True)  # its lifespan closes the upstream connections
