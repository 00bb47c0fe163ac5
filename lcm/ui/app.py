"""The explorer's routes: every page is a GET, rendered from one dict that is also its JSON twin.

``?format=json`` (or ``Accept: application/json``) on any page returns the dict the page was
drawn from, so what a person sees and what a script reads never disagree. Nothing here writes:
there is no route but GET, and the store is only read (the recall tools' own reads).

Bounded work per request, whatever the store's size: a page of messages is at most
``PAGE_MAX`` rows by seq range (an index range scan), a DAG shows at most ``DAG_NODES_PER_DEPTH``
nodes per depth (the rest counted), a node's sources are one page of ``lcm_expand``, and search
is ``lcm_grep`` with its own limits. Message text is always escaped (Jinja2 autoescape); text is
never turned into a link, so a ``javascript:`` URL in a message stays text.
"""

from __future__ import annotations

import hmac
import json
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from lcm.config import LcmConfig, in_range
from lcm.context.session import ContextSession
from lcm.errors import LcmError, NotFoundError
from lcm.store import Store
from lcm.tools import call_tool

HERE = Path(__file__).parent
PAGE_DEFAULT = 50
PAGE_MAX = 200
SESSIONS_PER_AGENT = 200
AGENTS_PER_PAGE = 25
DAG_NODES_PER_DEPTH = 120
PREVIEW_CHARS = 2_000
SOURCES_PER_PAGE = 50

_templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))
_templates.filters["when"] = lambda ts: time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "-"
_templates.filters["tojson_pretty"] = lambda v: json.dumps(v, ensure_ascii=False, indent=2)
#: lcm_grep marks matched words **like this**: escaped first, then the marks become <mark>.
_templates.filters["marked"] = lambda text: Markup(re.sub(r"\*\*(.+?)\*\*", r"<mark>\1</mark>", str(escape(text))))


class Explorer:
    """The store the app reads, and the recall tools bound to it per agent."""

    def __init__(self, store: Store):
        self.store = store

    def context(self, agent: str, session_key: str | None = None) -> ContextSession:
        config = LcmConfig.from_env(agent_id=agent)
        context = ContextSession(config, self.store, agent_id=agent, background_embedding=False,
                                 apply_filters=False)
        if session_key is not None:
            context.attach(session_key)
        return context

    def tool(self, agent: str, name: str, session_key: str | None = None, **args: Any) -> dict[str, Any]:
        return call_tool(self.context(agent, session_key), name, **args)

    def session(self, agent: str, session_key: str) -> Any:
        found = self.store.sessions.find(agent, session_key)
        if found is None:
            raise NotFoundError(f"agent {agent!r} has no session {session_key!r}")
        return found


def _int(request: Request, name: str, default: int | None = None, *, low: int = 0,
         high: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(str(raw))
    except ValueError:
        raise LcmError(f"{name} must be a whole number, got {raw!r}") from None
    try:
        return in_range(name, value, low, high)
    except ValueError as exc:
        raise LcmError(str(exc)) from None


def _wants_json(request: Request) -> bool:
    return request.query_params.get("format") == "json" or \
        "application/json" in request.headers.get("accept", "").split(",")[0]


def _page(request: Request, template: str, data: dict[str, Any]) -> Response:
    if _wants_json(request):
        return JSONResponse(data)
    html = _templates.get_template(template).render(data=data, request=request, title=data.get("title", "lcm"))
    return HTMLResponse(html)


View = Callable[[Explorer, Request], dict[str, Any]]


def _view(template: str, build: View) -> Callable[[Request], Awaitable[Response]]:
    """A GET route: ``build`` runs in a worker thread (the store is synchronous); lcm errors
    become a page (or JSON) with the message and status 404 (not found) or 400."""

    async def endpoint(request: Request) -> Response:
        explorer: Explorer = request.app.state.explorer
        try:
            data = await run_in_threadpool(build, explorer, request)
        except NotFoundError as exc:
            return _error(request, 404, str(exc))
        except LcmError as exc:
            return _error(request, 400, str(exc))
        return _page(request, template, data)

    return endpoint


def _error(request: Request, status: int, message: str) -> Response:
    if _wants_json(request):
        return JSONResponse({"error": message}, status_code=status)
    html = _templates.get_template("error.html").render(data={"error": message}, request=request, title="lcm: error")
    return HTMLResponse(html, status_code=status)


async def _not_found(request: Request, exc: Exception) -> Response:
    """An address the explorer does not have: its own page (or JSON), with the way back."""
    return _error(request, 404, f"no page at {request.url.path}: the explorer starts at / (agents and sessions)")


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return _error(request, 405, f"{request.method} is not allowed here: the explorer only reads (GET)")


# ------------------------------------------------------------------------------------- views


def agents_view(ex: Explorer, request: Request) -> dict[str, Any]:
    """The agents, ``AGENTS_PER_PAGE`` at a time (oldest first), each with its sessions: a page
    reads its agents' sessions, never the whole store (a fleet's store holds thousands)."""
    names = ex.store.sessions.agents()
    pages = max(1, -(-len(names) // AGENTS_PER_PAGE))
    page = _int(request, "page", 0, high=pages - 1) or 0
    agents = []
    for name in names[page * AGENTS_PER_PAGE:(page + 1) * AGENTS_PER_PAGE]:
        listed = list(ex.store.sessions.each(name))
        # Last activity: the session's last message's own time (an imported session's is when it
        # was said, not when it was imported); a session without messages, its row's time.
        last = ex.store.sessions.last_message_times([s.id for s in listed])
        sessions = sorted(listed, key=lambda s: last.get(s.id, s.updated_at), reverse=True)
        agents.append({
            "agent": name, "session_count": len(sessions),
            "messages": sum(s.message_count for s in sessions), "tokens": sum(s.token_count for s in sessions),
            "sessions": [{
                "session_id": s.session_key, "platform": s.platform, "messages": s.message_count,
                "tokens": s.token_count, "compacted_messages": s.covered_seq, "summaries_in_context": s.summary_count,
                "created_at": s.created_at, "updated_at": s.updated_at,
                "last_activity": last.get(s.id, s.updated_at),
                "source": (s.origin or {}).get("format") if isinstance(s.origin, dict) else None,
            } for s in sessions[:SESSIONS_PER_AGENT]],
            "sessions_clamped_from": len(sessions) if len(sessions) > SESSIONS_PER_AGENT else None,
        })
    return {"title": "lcm: agents and sessions", "database": ex.store.location, "agents": agents,
            "agent_count": len(names), "page": page, "pages": pages, "per_page": AGENTS_PER_PAGE}


def _message_item(record: Any, *, preview: int | None = PREVIEW_CHARS) -> dict[str, Any]:
    msg = record.message
    content = msg.get("content")
    text = content if isinstance(content, str) else (
        "" if content is None else json.dumps(content, ensure_ascii=False, indent=2))
    extra = {k: v for k, v in msg.items() if k not in ("role", "content", "tool_calls")}
    return {
        "store_id": record.store_id, "seq": record.seq, "role": record.role, "timestamp": record.ts,
        "token_count": record.token_count, "chars": len(text),
        "text": text if preview is None or len(text) <= preview else text[:preview],
        "truncated": preview is not None and len(text) > preview,
        "tool_calls": msg.get("tool_calls"), "fields": extra,
    }


def session_view(ex: Explorer, request: Request) -> dict[str, Any]:
    agent, key = request.path_params["agent"], request.path_params["session"]
    session = ex.session(agent, key)
    size = _int(request, "limit", PAGE_DEFAULT, low=1, high=PAGE_MAX) or PAGE_DEFAULT
    before = _int(request, "before", low=1)
    after = _int(request, "after", low=0)
    last = session.last_seq
    if after is not None:
        first_seq, last_seq = after + 1, min(last, after + size)
    else:
        end = min(last, (before - 1) if before is not None else last)
        first_seq, last_seq = max(1, end - size + 1), end
    records = ex.store.messages.get_range(session.id, first_seq=first_seq, last_seq=last_seq) if last_seq >= 1 else []
    return {
        "title": f"lcm: {agent} / {key}", "agent": agent, "session_id": key, "platform": session.platform,
        "messages_total": session.message_count, "last_seq": last, "compacted_messages": session.covered_seq,
        "first_seq": first_seq, "page_last_seq": last_seq,
        "older": {"before": first_seq} if first_seq > 1 else None,
        "newer": {"after": last_seq} if last_seq < last else None,
        "messages": [_message_item(r) for r in records],
        "origin": _origin(session.origin),
    }


def _origin(origin: Any) -> dict[str, Any] | None:
    """Where an imported session came from, and the notes its import kept (another program's
    summaries that did not map onto lcm's DAG, Hermes' compressor summaries)."""
    if not isinstance(origin, dict):
        return None
    found = origin.get("notes")
    notes: list[Any] = found if isinstance(found, list) else []
    return {"format": origin.get("format"), "path": origin.get("path"),
            "details": {k: v for k, v in origin.items() if k not in ("format", "path", "notes")},
            "notes": [n for n in notes if isinstance(n, dict)]}


def dag_view(ex: Explorer, request: Request) -> dict[str, Any]:
    agent, key = request.path_params["agent"], request.path_params["session"]
    session = ex.session(agent, key)
    depths = []
    for stats in sorted(ex.store.summaries.depth_stats(session.id), key=lambda d: -d.depth):
        nodes = ex.store.summaries.of_session(session.id, depth=stats.depth, limit=DAG_NODES_PER_DEPTH)
        depths.append({
            "depth": stats.depth, "count": stats.count, "uncondensed": stats.uncondensed, "tokens": stats.tokens,
            "clamped": stats.count > len(nodes),
            "nodes": [{"node_id": n.id, "token_count": n.token_count, "first_seq": n.first_seq,
                       "last_seq": n.last_seq, "earliest_at": n.earliest_at, "latest_at": n.latest_at,
                       "source_count": n.source_count, "condensed_into": n.parent_id} for n in nodes],
        })
    return {"title": f"lcm: summary DAG of {agent} / {key}", "agent": agent, "session_id": key,
            "messages_total": session.message_count, "compacted_messages": session.covered_seq,
            "depths": depths, "svg": _dag_svg(depths)}


def _dag_svg(depths: list[dict[str, Any]]) -> dict[str, Any]:
    """Node boxes, depth by depth (the highest on top), and an edge from each node to the one it
    was condensed into: coordinates only, the template draws them. The lowest depth is laid out
    in conversation order; each node above sits over the middle of its drawn children (pushed
    right where that would overlap), so edges rarely cross."""
    box_w, box_h, gap_x, gap_y = 96, 34, 12, 70
    step = box_w + gap_x
    slots: dict[int, float] = {}  # node id -> x slot (in box widths)
    for depth in reversed(depths):  # lowest depth first
        children: dict[int, list[float]] = {}
        for lower in depths:
            if lower["depth"] == depth["depth"] - 1:
                for node in lower["nodes"]:
                    if node["condensed_into"] is not None and node["node_id"] in slots:
                        children.setdefault(node["condensed_into"], []).append(slots[node["node_id"]])
        free = 0.0
        for node in depth["nodes"]:
            below = children.get(node["node_id"])
            wanted = (min(below) + max(below)) / 2 if below else free
            slots[node["node_id"]] = max(wanted, free)
            free = slots[node["node_id"]] + 1
    width = int((max(slots.values(), default=0) + 1) * step + gap_x)
    boxes, at = [], {}
    for row, depth in enumerate(depths):
        for node in depth["nodes"]:
            x, y = int(gap_x + slots[node["node_id"]] * step), 20 + row * (box_h + gap_y)
            at[node["node_id"]] = (x, y)
            boxes.append({"x": x, "y": y, "w": box_w, "h": box_h, **node, "depth": depth["depth"]})
    edges = []
    for box in boxes:
        parent = at.get(box["condensed_into"]) if box["condensed_into"] else None
        if parent is not None:
            edges.append({"x1": box["x"] + box_w // 2, "y1": box["y"], "x2": parent[0] + box_w // 2,
                          "y2": parent[1] + box_h})
    return {"width": width, "height": 20 + len(depths) * (box_h + gap_y), "boxes": boxes, "edges": edges}


def node_view(ex: Explorer, request: Request) -> dict[str, Any]:
    agent, node_id = request.path_params["agent"], int(request.path_params["node"])
    node = ex.store.summaries.get(node_id, agent=agent)
    if node is None:
        raise NotFoundError(f"agent {agent!r} has no summary node {node_id}")
    session_key = ex.store.sessions.get(node.session_pk).session_key
    offset = _int(request, "offset", 0, low=0) or 0
    expanded = ex.tool(agent, "lcm_expand", session_key, node_id=node_id, source_offset=offset,
                       source_limit=SOURCES_PER_PAGE, max_tokens=16_000)
    described = ex.tool(agent, "lcm_describe", session_key, node_id=node_id)
    return {"title": f"lcm: node {node_id}", "agent": agent, "session_id": session_key, "node": described,
            "sources": expanded["expanded"], "pagination": expanded["pagination"]}


def message_view(ex: Explorer, request: Request) -> dict[str, Any]:
    agent, store_id = request.path_params["agent"], int(request.path_params["message"])
    record = ex.store.messages.get(store_id, agent=agent)
    if record is None:
        raise NotFoundError(f"agent {agent!r} has no message {store_id}")
    return {"title": f"lcm: message {store_id}", "agent": agent, "session_id": record.session_key,
            "message": _message_item(record, preview=None), "raw": record.message}


SEARCH_ARGS = ("session", "mode", "sort", "role", "since", "until", "source")


def search_view(ex: Explorer, request: Request) -> dict[str, Any]:
    q = request.query_params.get("q", "").strip()
    agents = ex.store.sessions.agents()
    agent = request.query_params.get("agent") or (agents[0] if agents else "default")
    params = {name: request.query_params.get(name) or None for name in SEARCH_ARGS}
    limit = _int(request, "limit", 20, low=1, high=200)
    data: dict[str, Any] = {"title": "lcm: search", "q": q, "agent": agent, "agents": agents, **params,
                            "limit": limit, "results": None}
    if q:
        args: dict[str, Any] = {"query": q, "limit": limit, "sort": params["sort"], "mode": params["mode"],
                                "role": params["role"], "source": params["source"],
                                "session_scope": "current" if params["session"] else "all"}
        for name, arg in (("since", "time_from"), ("until", "time_to")):
            raw = params[name]
            if raw:
                try:
                    args[arg] = float(raw)
                except ValueError:
                    args[arg] = raw  # ISO-8601: lcm_grep checks it
        data["results"] = ex.tool(agent, "lcm_grep", params["session"], **args)
    return data


def status_view(ex: Explorer, request: Request) -> dict[str, Any]:
    """Store-wide counts and size: a count per table, cheap at any size."""
    return {"title": "lcm: status", "agents": ex.store.sessions.agents(), "database": ex.store.location,
            "backend": ex.store.backend_name, "stats": ex.store.health.stats()}


def doctor_view(ex: Explorer, request: Request) -> dict[str, Any]:
    """``lcm_doctor``: its checks cost about 0.3-0.6 s per 100k messages they read
    (docs/benchmarks.md), so they run only on this page, when asked for, and a big store is
    checked by its most recently active sessions (``lcm doctor --all`` reads every one)."""
    agents = ex.store.sessions.agents()
    agent = request.query_params.get("agent") or (agents[0] if agents else "default")
    return {"title": "lcm: health", "agent": agent, "agents": agents, "doctor": ex.tool(agent, "lcm_doctor")}


# ------------------------------------------------------------------------------------- app


def create_app(store: Store, *, token: str | None = None) -> Starlette:
    """The explorer over ``store``. With ``token``, every request must carry it (``?token=``
    once, which sets a cookie, or ``Authorization: Bearer``); without, serve loopback only."""
    routes = [
        Route("/", _view("agents.html", agents_view), methods=["GET"]),
        Route("/search", _view("search.html", search_view), methods=["GET"]),
        Route("/status", _view("status.html", status_view), methods=["GET"]),
        Route("/doctor", _view("doctor.html", doctor_view), methods=["GET"]),
        Route("/a/{agent}/s/{session}", _view("session.html", session_view), methods=["GET"]),
        Route("/a/{agent}/s/{session}/dag", _view("dag.html", dag_view), methods=["GET"]),
        Route("/a/{agent}/node/{node:int}", _view("node.html", node_view), methods=["GET"]),
        Route("/a/{agent}/msg/{message:int}", _view("message.html", message_view), methods=["GET"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    middleware = [Middleware(SecurityHeaders)]
    if token is not None:
        middleware.insert(0, Middleware(RequireToken, token=token))
    app = Starlette(routes=routes, middleware=middleware, exception_handlers={404: _not_found, 405: _not_allowed})
    app.state.explorer = Explorer(store)
    return app


class SecurityHeaders(BaseHTTPMiddleware):
    """No script but our own files, no inline handlers, no framing: escaped text stays text."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = (
            "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; base-uri 'none'; "
            "form-action 'self'; frame-ancestors 'none'")
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        return response


class RequireToken(BaseHTTPMiddleware):
    """Every request carries the token: ``?token=`` (which sets a cookie for the pages after),
    the cookie, or ``Authorization: Bearer``."""

    def __init__(self, app: ASGIApp, token: str):
        super().__init__(app)
        self.token = token.encode()

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        given = request.query_params.get("token") or request.cookies.get("lcm_token") or \
            request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), self.token):
            return JSONResponse({"error": "this lcm ui needs its token: open the URL `lcm ui` printed "
                                          "(it carries ?token=...)"}, status_code=401)
        response = await call_next(request)
        if request.query_params.get("token"):
            response.set_cookie("lcm_token", self.token.decode(), httponly=True, samesite="strict")
        return response
