"""Pure text work of the summarizer: reasoning blocks stripped, the expand line ensured, a
deterministic extractive summary, and a marked truncation as the last resort."""

from __future__ import annotations

import re
from collections import Counter

from lcm.context.summarize.prompts import EXPAND_PREFIX, EXTRACTIVE_MARKER, TRUNCATED_MARKER
from lcm.context.summarize.request import SummaryRequest
from lcm.tokens import CHARS_PER_TOKEN_ESTIMATE as CHARS_PER_TOKEN
from lcm.tokens import TokenCounter

_REASONING_TAGS = ("think", "thinking", "reasoning", "reflection", "analysis")
_OPEN_TAG = re.compile(r"<(%s)\b[^>]*>" % "|".join(_REASONING_TAGS), re.I)


def strip_reasoning(text: str) -> str | None:
    """Remove reasoning blocks; None if one is left unclosed (a failed, cut-off answer)."""
    out = text
    while True:
        m = _OPEN_TAG.search(out)
        if m is None:
            break
        close = re.compile(r"</%s\s*>" % re.escape(m.group(1)), re.I).search(out, m.end())
        if close is None:
            return None
        out = out[: m.start()] + out[close.end():]
    # A closing tag without its opening one: reasoning streamed before the answer.
    stray = list(re.finditer(r"</(%s)\s*>" % "|".join(_REASONING_TAGS), out, re.I))
    if stray:
        out = out[stray[-1].end():]
    return out.strip()


_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_.\-/]{3,}")
_STOP = frozenset("""this that with from have were what when will would there their about which
into they them then than been also just only some more most other such your yours very each
make made like used using user assistant tool message messages content summary summaries
should could does done here after before because while where these those being over under
again please thanks okay sure need want call conversation covers depth node extractive
configured expand details exact text lcm_expand lcm_grep""".split())


def keywords(text: str, limit: int = 8) -> list[str]:
    """Distinctive words of a text: identifiers (with digits, dots, slashes) weigh triple;
    most weighty first, ties broken alphabetically. Deterministic."""
    counts = Counter(w.strip("./-").lower() for w in _WORD.findall(text))

    def weight(w: str) -> int:
        return counts[w] * (3 if re.search(r"[\d./_]", w) else 1)

    ranked = sorted((w for w in counts if w not in _STOP and len(w) > 3), key=lambda w: (-weight(w), w))
    return ranked[:limit]


def ensure_expand_line(text: str, source: str) -> tuple[str, str]:
    """(text ending with an "Expand for details about:" line, the hint after the prefix)."""
    lines = text.rstrip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        stripped = lines[i].strip().lstrip("*_ ").rstrip("*_ ")
        if stripped.lower().startswith(EXPAND_PREFIX.lower()):
            hint = stripped[len(EXPAND_PREFIX):].strip(" :")
            body = "\n".join(lines[:i] + lines[i + 1:]).rstrip()
            hint = hint or ", ".join(keywords(source))
            return f"{body}\n{EXPAND_PREFIX} {hint}".strip(), hint
    hint = ", ".join(keywords(source)) or "the exact messages"
    return f"{text.rstrip()}\n{EXPAND_PREFIX} {hint}", hint


# --------------------------------------------------------------------------- extractive

_SALIENT = re.compile(
    r"(?:/[\w.\-]+){2,}|\b\w+\.(?:py|js|ts|go|rs|md|json|ya?ml|toml|ini|sql|sh|txt|cfg)\b"
    r"|`[^`\n]{2,80}`|\$ \S.*|https?://\S+|\b\d+\.\d+(?:\.\d+)+\b|\b[0-9a-f]{7,40}\b"
    r"|\b(?:error|failed|failure|exception|traceback|decid|must|never|always|todo|next step|"
    r"remember|important|deadline|because)\w*",
    re.I,
)
_TURN_HEAD = re.compile(r"^\[#\d+ [^\]]*\]")
_NODE_HEAD = re.compile(r'^<summary node="(\d+)" depth="\d+" covers="messages (\d+)-(\d+)">$')


def _units(request: SummaryRequest) -> list[tuple[str, list[str]]]:
    """(heading, body lines) per message of a leaf source, or per child of a condensed one."""
    units: list[tuple[str, list[str]]] = []
    for raw in request.source.splitlines():
        line = raw.strip()
        if not line or line in ("<conversation>", "</conversation>", "<summaries>",
                                "</summaries>", "</summary>"):
            continue
        node = _NODE_HEAD.match(line)
        if node:
            units.append((f"(messages {node.group(2)}-{node.group(3)})", []))
        elif _TURN_HEAD.match(line):
            units.append((line, []))
        elif units and not line.startswith((EXTRACTIVE_MARKER[:20], EXPAND_PREFIX, "[truncated")):
            units[-1][1].append(line)
    return units


def _clip_line(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: max(10, chars - 1)].rstrip() + "…"


def extractive_summary(request: SummaryRequest, tokens: TokenCounter, marker: str = EXTRACTIVE_MARKER) -> str:
    """A deterministic summary made of the source's own words: every message (or child
    summary) keeps its opening, clipped to a fair share of the budget, then lines carrying
    paths, commands, values, decisions or errors fill what is left."""
    units = _units(request)
    budget_chars = int(max(20, request.target_tokens) * CHARS_PER_TOKEN * 0.9)
    if not units:
        return marker + "\n" + request.source.strip()[:budget_chars]
    share = max(60, budget_chars // len(units))
    picked: list[list[str]] = []
    used = 0
    rests: list[list[str]] = []
    for heading, body in units:
        first, rest = heading, body
        if request.depth > 0 and body:  # a child summary: its heading and its first line
            first, rest = f"{heading} {body[0]}", body[1:]
        line = _clip_line(first, share)
        picked.append([line])
        rests.append(rest)
        used += len(line) + 1
    for rest, out in zip(rests, picked, strict=True):
        for line in rest:
            if used >= budget_chars:
                break
            if request.depth > 0 or _SALIENT.search(line):
                piece = _clip_line(line, 200)
                if used + len(piece) + 1 <= budget_chars:
                    out.append("  " + piece)
                    used += len(piece) + 3
    text = marker + "\n" + "\n".join(line for block in picked for line in block)
    while tokens.count_text(text) > request.target_tokens and len(text) > 200:
        text = text[: int(len(text) * 0.85)].rstrip() + "…"
    return text


def truncation(request: SummaryRequest, tokens: TokenCounter, reason: str) -> tuple[str, str] | None:
    """(text, hint): the head of the source cut to fit, marked and with its expand line; None
    if no such text can be shorter than the source."""
    marker = TRUNCATED_MARKER.format(reason=reason[:80])
    limit = min(request.target_tokens, request.source_tokens - 1)
    body = request.source
    for tag in ("<conversation>", "</conversation>", "<summaries>", "</summaries>"):
        body = body.replace(tag, "")
    body = body.strip()
    chars = max(0, limit - tokens.count_text(marker)) * CHARS_PER_TOKEN
    while chars >= 40:
        text, hint = ensure_expand_line(f"{marker}\n{body[:chars].rstrip()} …", request.source)
        if tokens.count_text(text) <= limit:
            return text, hint
        chars = int(chars * 0.75)
    return None
