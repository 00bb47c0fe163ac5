"""``lcm proxy`` for tests: the real app served by uvicorn on a free 127.0.0.1 port, in a thread
(or, for kill -9 tests, the real ``lcm proxy`` command in its own process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx
import uvicorn

from lcm.config import LcmConfig
from lcm.proxy.app import ProxySettings, create_app
from lcm.proxy.callers import Callers
from lcm.proxy.conversations import Conversations
from lcm.proxy.windows import Windows
from lcm.store import Store
from lcm.ui.serve import bind


class ProxyThread:
    """The proxy app over ``store`` in front of ``upstream``, served until :meth:`close`."""

    def __init__(self, store: Store, upstream: str, *, agent: str = "default", tokens: Mapping[str, str] | None = None,
                 context_length: int | None = 32_000, timeout: float = 30.0, tools: bool = True,
                 settings: Mapping[str, Any] | None = None):
        config = LcmConfig.from_env({"LCM_EMBEDDINGS": "off", **(settings or {})}, agent_id=agent)
        self.conversations = Conversations(store, config, Windows(context_length), upstream)
        app = create_app(ProxySettings(upstream=upstream, timeout=timeout, tools=tools), self.conversations,
                         Callers(agent, tokens))
        self._sock = bind("127.0.0.1", 0)
        self.port = self._sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the proxy did not start within 10 s")
            time.sleep(0.01)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


class ProxyProcess:
    """``lcm proxy`` as users run it, in its own process (``kill`` for crash tests)."""

    def __init__(self, db_url: str, upstream: str, *extra: str, env: Mapping[str, str] | None = None):
        command = [sys.executable, "-m", "lcm", "proxy", "--upstream", upstream, "--url", db_url,
                   "--port", "0", "--json", *extra]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, "LCM_EMBEDDINGS": "off", **(env or {})})
        assert self.process.stdout is not None
        lines = []
        while True:  # the JSON object printed before serving
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"lcm proxy exited: {self.process.stderr.read() if self.process.stderr else ''}")
            lines.append(line)
            if line.startswith("}"):
                break
        self.info = json.loads("".join(lines))
        self.url = self.info["base_url"]
        deadline = time.monotonic() + 15
        while True:
            try:
                if httpx.get(self.url.replace("/v1", "/health"), timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("lcm proxy did not answer /health within 15 s")
            time.sleep(0.05)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
