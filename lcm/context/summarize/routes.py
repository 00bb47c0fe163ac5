"""Routes to an LLM: an OpenAI-compatible endpoint (httpx), or one a host provides; per-route
circuit breakers; a wall-clock bound on every call.

A host adds its own route by handing the summarizer a factory (the Hermes adapter gives its
auxiliary client, ``lcm.hermes.routes``); the engine core knows no host.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

AUTH_COOLDOWN_FACTOR = 12
#: A completion larger than this is refused (a runaway or hostile server), not read to the end.
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
_UNSENDABLE = re.compile("[\x00\ud800-\udfff]")


def sendable(text: str) -> str:
    """Text any JSON encoder and HTTP client accepts: NUL and unpaired surrogates (which a
    stored message may hold) become U+FFFD in what is sent to a model."""
    return _UNSENDABLE.sub("\ufffd", text) if _UNSENDABLE.search(text) else text


def bounded_call(fn: Callable[[], T], timeout: float, what: str) -> T:
    """``fn()`` on a thread of its own, given at most ``timeout`` seconds of wall clock
    (RouteError "timeout" past that); what ``fn`` raises is raised here.

    Why a thread and not a per-read timeout: a server dripping one byte a second defeats the
    latter. Why a thread per call and not a pool: a call past its bound is abandoned (the caller
    moves on at once, the thread ends at its own next check), and abandoned calls held in a
    fixed pool would queue every later call behind them until each timed out unstarted. A
    thread costs tens of microseconds against an LLM call's hundreds of milliseconds.
    """
    future: Future[T] = Future()

    def run() -> None:  # nothing cancels the future: the caller only stops waiting for it
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who re-raises it
            future.set_exception(exc)

    threading.Thread(target=run, name="lcm-llm", daemon=True).start()
    try:
        return future.result(timeout=max(0.0, timeout))
    except FuturesTimeout:
        raise RouteError("timeout", f"{what}: no complete answer within {timeout:.1f} s") from None


def post_json(url: str, body: dict[str, Any], headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
    """POST ``body`` as JSON: the response's status and body, read in chunks against the call's
    deadline and refused past ``MAX_RESPONSE_BYTES`` (RouteError timeout, http or network)."""
    import httpx

    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    size = 0
    try:
        with httpx.stream("POST", url, json=body, headers=headers, timeout=timeout) as resp:
            for chunk in resp.iter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_RESPONSE_BYTES:
                    raise RouteError("http", f"the answer is larger than {MAX_RESPONSE_BYTES} bytes")
                if time.monotonic() > deadline:
                    raise RouteError("timeout", f"no complete answer within {timeout:.1f} s")
            return resp.status_code, b"".join(chunks)
    except httpx.TimeoutException as exc:
        raise RouteError("timeout", f"no answer within {timeout:.1f} s") from exc
    except httpx.HTTPError as exc:
        raise RouteError("network", f"{type(exc).__name__}: {exc}") from exc


class RouteError(Exception):
    """A route failed: ``kind`` is auth, timeout, http, network, empty or config."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class Route(Protocol):
    name: str
    model: str | None

    def complete(self, messages: list[dict[str, str]], *, max_tokens: int, timeout: float) -> str:
        """The assistant text of one chat completion; raises RouteError."""


def as_route_error(exc: BaseException) -> RouteError:
    """Any failure of a route call, as the route failing (a UnicodeEncodeError, a host bug)."""
    if isinstance(exc, RouteError):
        return exc
    return RouteError("internal", f"{type(exc).__name__}: {str(exc)[:300]}")


class OpenAICompatibleRoute:
    """``POST {base_url}/chat/completions`` with httpx (any OpenAI-compatible server)."""

    def __init__(self, base_url: str, model: str, api_key: str | None):
        self.base_url = base_url.rstrip("/")
        self.model: str | None = model
        self.api_key = api_key
        self.name = f"endpoint:{model}@{self.base_url}"

    def complete(self, messages: list[dict[str, str]], *, max_tokens: int, timeout: float) -> str:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                "temperature": 0.2}
        status, raw = bounded_call(lambda: self._post(body, headers, timeout), timeout, self.name)
        text = raw.decode("utf-8", "replace")
        if status in (401, 403):
            raise RouteError("auth", f"HTTP {status}: the endpoint refused the API key "
                                     "(check LCM_SUMMARY_API_KEY)")
        if status >= 400:
            raise RouteError("http", f"HTTP {status}: {text[:200]}")
        try:
            data = json.loads(text)
            content = data["choices"][0]["message"].get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise RouteError("http", f"unreadable completion: {text[:200]}") from exc
        if not isinstance(content, str) or not content.strip():
            raise RouteError("empty", "the model returned no text")
        return content


    def _post(self, body: dict[str, Any], headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
        return post_json(f"{self.base_url}/chat/completions", body, headers, timeout)


@dataclass
class BreakerState:
    failures: int = 0
    open_until: float = 0.0
    last_error: str | None = None
    auth_failed: bool = False


class Breakers:
    """Per-route circuit breakers: skip a route after repeated failures, retry after cooldown."""

    def __init__(self, failures: int, cooldown: float):
        self.threshold = failures
        self.cooldown = cooldown
        self._state: dict[str, BreakerState] = {}
        self._lock = threading.Lock()

    def available(self, route: str, now: float | None = None) -> bool:
        with self._lock:
            st = self._state.get(route)
            return st is None or st.open_until <= (now or time.monotonic())

    def success(self, route: str) -> None:
        with self._lock:
            self._state[route] = BreakerState()

    def failure(self, route: str, error: RouteError | str, now: float | None = None) -> None:
        now = now or time.monotonic()
        kind = error.kind if isinstance(error, RouteError) else "invalid"
        with self._lock:
            st = self._state.setdefault(route, BreakerState())
            st.failures += 1
            st.last_error = f"{kind}: {error}"
            if kind == "auth":
                st.auth_failed = True
                st.open_until = now + self.cooldown * AUTH_COOLDOWN_FACTOR
                log.error("lcm summarizer route %s: authentication failed (%s); the route is "
                          "disabled for %d s. Fix the credentials.", route, error,
                          int(self.cooldown * AUTH_COOLDOWN_FACTOR))
            elif st.failures >= self.threshold:
                st.open_until = now + self.cooldown
                log.warning("lcm summarizer route %s failed %d times (%s); skipping it for %d s",
                            route, st.failures, error, int(self.cooldown))

    def snapshot(self) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        with self._lock:
            return {
                name: {"state": "auth_failed" if st.auth_failed and st.open_until > now else
                       ("open" if st.open_until > now else "closed"),
                       "failures": st.failures, "last_error": st.last_error,
                       "retry_in_s": max(0, int(st.open_until - now))}
                for name, st in self._state.items()
            }
