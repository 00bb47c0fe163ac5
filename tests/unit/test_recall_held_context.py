"""Auto-recall's "is this hit already in the context", kept between the recalls of a
conversation (``HeldContext``): whatever the host does to its list between two recalls, the
answer is the one a fresh index of the list gives."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lcm.messages import RECALL_CLOSE, RECALL_HEADER
from lcm.tools.autorecall import HeldContext, _Held

WORDS = ["alpha", "beta", "gamma", "delta"]


def message(role: str, word: str, block: bool) -> dict[str, Any]:
    text = f"the {word} plan"
    if block:  # a user message as it went out, with its recall block after the text
        text += f"\n\n{RECALL_HEADER}\n[store_id=1 user] old\n{RECALL_CLOSE}"
    return {"role": role, "content": text}


messages = st.builds(message, st.sampled_from(["user", "assistant"]), st.sampled_from(WORDS), st.booleans())
#: What a host does to its list between two recalls.
steps = st.lists(st.one_of(
    st.tuples(st.just("extend"), st.lists(messages, max_size=3)),
    st.tuples(st.just("drop_head"), st.integers(1, 3)),  # a compaction: the oldest messages replaced
    st.tuples(st.just("edit_in_place"), st.integers(0, 10), st.sampled_from(WORDS)),
    st.tuples(st.just("copy"), st.just(0)),  # the same messages as new objects
), max_size=8)


@settings(max_examples=200, deadline=None)
@given(st.lists(messages, max_size=6), steps)
def test_a_kept_index_answers_as_a_fresh_one_after_any_change_to_the_list(start, changes):
    kept = HeldContext()
    context = list(start)
    probes = [{"role": role, "content": f"the {word} plan"} for role in ("user", "assistant") for word in WORDS]
    for change in [("extend", []), *changes]:
        kind = change[0]
        if kind == "extend":
            context = [*context, *change[1]]
        elif kind == "drop_head":
            context = [{"role": "user", "content": "a summary"}, *context[change[1]:]]
        elif kind == "edit_in_place" and context:
            context[change[1] % len(context)]["content"] = f"the {change[2]} plan"
        elif kind == "copy":
            context = [dict(m) for m in context]
        held = kept.update(context)
        fresh = _Held(context)
        assert [held.holds(p) for p in probes] == [fresh.holds(p) for p in probes]
