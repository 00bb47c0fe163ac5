"""The explorer served for a test: a real uvicorn on 127.0.0.1 (a free port) in a thread, over a
store the test filled; stopped when the test ends."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn

from lcm.store import Store
from lcm.ui.app import create_app
from lcm.ui.serve import bind


@contextmanager
def serving(store: Store, *, token: str | None = None) -> Iterator[str]:
    """The base URL (``http://127.0.0.1:PORT``) of the explorer over ``store``."""
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_app(store, token=token), log_level="warning",
                                           access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the explorer did not start")
        time.sleep(0.02)
    try:
        httpx.get(base + "/static/lcm.css", params={"token": token} if token else None, timeout=10).raise_for_status()
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()
