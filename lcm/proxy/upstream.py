"""The proxy's HTTP client to the upstream provider: one pooled, keep-alive aiohttp session.

Why aiohttp and not httpx (which lcm uses everywhere else, synchronously): on this hot path,
one upstream call per proxied request, httpx's async client cost 1.1 ms a call against 0.63 ms
for aiohttp's (same upstream on 127.0.0.1, uvloop, p50 of 400 alternated calls; httpcore alone
0.77). Through a whole pass-through proxy that was 1.6 against 1.0 ms added per request.

The app sees only this module's small surface: a whole answer (:meth:`Upstream.call`), a
streamed one (:meth:`Upstream.open`, or :meth:`Upstream.forward` for a request passed through
as bytes, then :meth:`Streamed.chunks`), and two errors,
:class:`UpstreamTimeout` (nothing from the upstream for ``timeout`` seconds: between two bytes,
as a stream waits) and :class:`UpstreamUnreachable` (refused, reset, cut mid-stream). Bodies are
sent as the JSON the app built; answers come back as bytes, untouched (decompressed when the
upstream compressed them, as the client asked nothing of the encoding: the app drops its
``Accept-Encoding``). Redirects are not followed. ``HTTP(S)_PROXY`` and ``NO_PROXY`` are read
once, when the proxy starts (aiohttp's ``trust_env`` reads them, and ``~/.netrc``, on every
request: 0.45 ms a call, measured).
"""

from __future__ import annotations

import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from lcm.proxy.wire import json_bytes

#: Connections to the upstream at once, and kept open between requests.
MAX_CONNECTIONS = 256
KEEPALIVE_SECONDS = 60.0

#: Response headers of the upstream's that the client does not get: the hop-by-hop ones, and
#: those that describe bytes the proxy sends differently (the body arrives decompressed and is
#: re-framed, and the content type travels on its own). The rest (``retry-after``, the
#: provider's rate-limit counters, ``x-request-id``, ``openai-processing-ms``, cookies) go back
#: as received: a client's retry back-off and its request ids read them.
NOT_PASSED_BACK = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-connection", "te",
                             "trailer", "transfer-encoding", "upgrade", "content-length", "content-encoding",
                             "content-type", "date", "server"})


class UpstreamTimeout(Exception):
    """The upstream sent nothing for the proxy's ``--timeout`` seconds."""


class UpstreamUnreachable(Exception):
    """The upstream refused, reset or cut the connection (the message says which)."""


#: A query string's (name, value) pairs, repeats kept (``?include=a&include=b``).
Params = Sequence[tuple[str, str]]
#: Raw (name, value) header lines, as received.
Headers = list[tuple[bytes, bytes]]


def passed_back(response: aiohttp.ClientResponse) -> Headers:
    """The upstream's response headers the client gets (see ``NOT_PASSED_BACK``), byte for
    byte, repeated ones (``set-cookie``) each on its own line."""
    return [(k, v) for k, v in response.raw_headers if k.decode("latin-1").lower() not in NOT_PASSED_BACK]


@dataclass
class Answer:
    """A whole answer: status, content type, the body's bytes as received, and the headers
    the client gets."""

    status: int
    content_type: str | None
    content: bytes
    headers: Headers = field(default_factory=list)


class Streamed:
    """An answer whose head has arrived; its body is read with :meth:`chunks`, then closed."""

    def __init__(self, response: aiohttp.ClientResponse):
        self._response = response
        self.status = response.status
        self.content_type: str | None = response.headers.get("content-type")
        self.headers = passed_back(response)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (raises UpstreamTimeout / UpstreamUnreachable)."""
        try:
            async for piece in self._response.content.iter_any():
                yield piece
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _translated(exc) from exc

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _translated(exc) from exc
        finally:
            self.close()

    def close(self) -> None:
        self._response.release()


def _translated(exc: BaseException) -> Exception:
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout(str(exc) or "timed out")
    return UpstreamUnreachable(str(exc) or type(exc).__name__)


def proxy_for(url: str) -> str | None:
    """The HTTP proxy the environment names for ``url`` (``HTTPS_PROXY``/``HTTP_PROXY``,
    ``NO_PROXY`` honoured), or None."""
    parts = urllib.parse.urlsplit(url)
    found = urllib.request.getproxies().get(parts.scheme)
    if not found or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return found


class Upstream:
    """One provider's base URL and the session that calls it (made on first use, inside the
    server's event loop, as aiohttp requires; closed by :meth:`close`)."""

    def __init__(self, base: str, timeout: float):
        self.base = base.rstrip("/")
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self.via = proxy_for(self.base)

    def _client(self) -> aiohttp.ClientSession:
        # aiohttp sets TCP_NODELAY on its connections (its base protocol does): without it a
        # request's head and body, two writes, waited for the upstream's delayed ACK, 40 ms a
        # call (measured with httpx before it was set there).
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, limit_per_host=0,
                                               keepalive_timeout=KEEPALIVE_SECONDS),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=min(10.0, self.timeout),
                                              sock_read=self.timeout),
                auto_decompress=True)
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()

    async def _send(self, method: str, path: str, headers: Mapping[str, str], data: bytes | None,
                    params: Params | None = None) -> aiohttp.ClientResponse:
        try:
            return await self._client().request(method, self.base + path, data=data, headers=dict(headers),
                                                params=params, allow_redirects=False, proxy=self.via)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _translated(exc) from exc

    async def _send_json(self, method: str, path: str, headers: Mapping[str, str], body: Any) -> aiohttp.ClientResponse:
        """``body`` as the app built it, sent as JSON (the client's own ``Content-Type`` replaced)."""
        sent = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        sent["Content-Type"] = "application/json"
        return await self._send(method, path, sent, json_bytes(body))

    async def call(self, method: str, path: str, headers: Mapping[str, str], body: Any) -> Answer:
        """The whole answer to one request."""
        streamed = Streamed(await self._send_json(method, path, headers, body))
        content = await streamed.read()
        return Answer(streamed.status, streamed.content_type, content, streamed.headers)

    async def open(self, path: str, headers: Mapping[str, str], body: Any) -> Streamed:
        """A POST whose answer is read as it arrives."""
        return Streamed(await self._send_json("POST", path, headers, body))

    async def forward(self, method: str, path: str, headers: Mapping[str, str], content: bytes,
                      params: Params | None = None) -> Streamed:
        """Any other request of the API, its body's bytes as the client sent them (its own
        ``Content-Type``); the answer read as it arrives."""
        return Streamed(await self._send(method, path, headers, content or None, params))
