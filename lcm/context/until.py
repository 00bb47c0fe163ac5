"""The session as a host whose transcript ends before the session's end sees it.

Several hosts write one session (a gateway and a CLI, two workers). Each holds the context lcm
handed *it* and appends its own turns to it, so a context handed to a host must end where that
host's transcript ends: a message another host stored after that point is one this host never
had, and it would send it back beside its own copy of it (issue 30: a turn stored twice, or a
fork of a conversation that never diverged).

:func:`view_until` turns the session's compaction view into the view of the session as it was
up to the host's last message ``end``: the summaries that cover only messages up to a cut
before the host's newest user message, and the raw region from that cut to ``end``. When the
session's own summaries end before that cut (the usual case: the host is a turn or two
behind), that is the session's view with ``last_seq = end``. When another host has since
summarized past it, the DAG is walked down along the summary that straddles the cut (a few
reads, one per depth), so the host still gets summaries plus a verbatim tail that holds its
newest turn, and never a summary of messages it has not had.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from lcm.context.ports import StorePorts
from lcm.records import CompactionView, SummaryRecord
from lcm.transcript import is_real_user

#: User messages looked at (newest first) for the host's newest real user message.
USER_LOOKBACK = 64


def newest_user_until(store: StorePorts, session_pk: int, end: int) -> int | None:
    """The seq of the newest user message a person wrote at or before ``end`` (else the newest
    user message at all there), or None."""
    users = store.messages.latest(session_pk, roles=("user",), limit=USER_LOOKBACK, max_seq=end)
    for record in users:
        if is_real_user(record.message):
            return record.seq
    return users[0].seq if users else None


def _covering(store: StorePorts, nodes: Sequence[SummaryRecord], bound: int) -> list[SummaryRecord]:
    """The highest summaries that together cover the session's messages from its first up to
    the end of the last leaf that ends at or before ``bound`` (chronological)."""
    out: list[SummaryRecord] = []
    todo = sorted(nodes, key=lambda n: n.first_seq)
    while todo:
        node = todo.pop(0)
        if node.last_seq <= bound:
            out.append(node)
        elif node.first_seq <= bound and node.depth > 0:  # straddles: its children may not
            children, _ = store.summaries.expand(node.id)
            todo[:0] = [c for c in children if isinstance(c, SummaryRecord)]
        else:
            break  # a leaf that straddles, or everything from here on is later
    return out


def view_until(store: StorePorts, view: CompactionView, end: int) -> CompactionView | None:
    """The compaction view of ``view.session`` as a host whose last message is ``end`` sees it
    (``view`` itself when ``end`` is the session's end); None when that host has no user
    message in the session."""
    session = view.session
    if end >= session.last_seq:
        return view
    newest_user = newest_user_until(store, session.id, end)
    if newest_user is None:
        return None
    nodes = _covering(store, view.uncondensed, newest_user - 1)
    covered = nodes[-1].last_seq if nodes else 0
    # Token totals only steer the backlog shortcut of ``load_raw``; here the raw region is at
    # most one leaf plus the host's newest turns, so it is read whole.
    return replace(view, uncondensed=tuple(nodes), session=replace(
        session, last_seq=end, covered_seq=covered, token_count=session.covered_tokens))
