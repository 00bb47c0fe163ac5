"""What a fork's context holds of the conversation before its fork point.

A fork (``<key>/fork-N``) shares its parent's messages up to the fork point; its own messages
start at seq 1. When it was made it carried the parent's summaries of what the two share
(``lcm_carried_summaries``), but the parent's messages after the last of those summaries, up
to the fork point, are no summary's: they are the most recent turns the forking host had, and
its context must still hold them. :func:`inherited` names them (per ancestor, oldest first:
a fork of a fork inherits from both), and :func:`inherited_records` reads them, so assembly
hands them over verbatim before the fork's own messages, as long as the fork has no summary of
its own. Once it has (its summaries come after them in time, and a context is one summary
block then verbatim messages), they are named as left out in the summary block instead:
still stored, found by ``lcm_grep``, shown by ``lcm_load_session`` on the parent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lcm.context.ports import StorePorts
from lcm.records import MessageRecord, SessionRecord, SummaryRecord

#: How many ancestors a fork's inheritance is followed through (a fork of a fork of ...).
MAX_ANCESTORS = 32


@dataclass(frozen=True)
class Inherited:
    """A run of an ancestor's messages a fork's context holds verbatim."""

    session_pk: int
    session_key: str
    first_seq: int
    last_seq: int

    @property
    def count(self) -> int:
        return self.last_seq - self.first_seq + 1


def inherited(store: StorePorts, session: SessionRecord, carried: Sequence[SummaryRecord]) -> list[Inherited]:
    """The runs of ancestors' messages up to ``session``'s fork point that none of its carried
    summaries covers, oldest first (empty for a session that is no fork)."""
    runs: list[Inherited] = []
    child = session
    for _ in range(MAX_ANCESTORS):
        if child.parent_id is None or not child.fork_seq:
            break
        parent = store.sessions.get(child.parent_id)
        bound = child.fork_seq
        covered = max((n.last_seq for n in carried if n.session_pk == parent.id and n.last_seq <= bound), default=0)
        if covered < bound:
            runs.insert(0, Inherited(parent.id, parent.session_key, covered + 1, bound))
        child = parent
    return runs


def inherited_records(store: StorePorts, runs: Sequence[Inherited]) -> list[MessageRecord]:
    """The messages of ``runs``, in order."""
    out: list[MessageRecord] = []
    for run in runs:
        out.extend(store.messages.get_range(run.session_pk, first_seq=run.first_seq, last_seq=run.last_seq))
    return out
