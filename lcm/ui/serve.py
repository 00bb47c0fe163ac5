"""Serving the explorer: a socket bound first (port 0 picks a free one, known before the server
starts), then uvicorn on it."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from lcm.errors import ConfigError


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one), or a ConfigError that says why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror}): "
                          "pick another --port, or 0 for a free one") from None
    # Accepted connections inherit it: without, a keep-alive client waits ~40 ms per response
    # (Nagle's algorithm holding the body behind the headers until a delayed ACK; measured).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def run(app: Any, sock: socket.socket, *, lifespan: bool = False) -> None:
    """Serve ``app`` on ``sock`` until interrupted (``lifespan``: run the app's start-up and
    shut-down handler)."""
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on" if lifespan else "off")
    uvicorn.Server(config).run(sockets=[sock])
