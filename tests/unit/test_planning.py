"""The pure planning functions of compaction: fresh tail and leaf chunk boundaries."""

from __future__ import annotations

from lcm.context.planning import leaf_end_index, tail_start_index

# u = user, a = assistant, t = tool
ROLES = {"u": "user", "a": "assistant", "t": "tool"}


def roles(pattern: str) -> list[str]:
    return [ROLES[c] for c in pattern]


def test_tail_starts_at_an_assistant_and_keeps_the_newest_user():
    r = roles("uatauatauata")  # the newest user message is at 8
    # the last 3 would start mid-turn: moved back to the assistant message before the user's turn
    assert tail_start_index(r, [10] * len(r), newest_user=8, count=3, max_tokens=0) == 7
    assert tail_start_index(r, [10] * len(r), newest_user=8, count=6, max_tokens=0) == 5


def test_tail_token_cap_never_drops_the_newest_user():
    r = roles("uatauata")
    sizes = [10, 10, 500, 10, 10, 10, 500, 10]
    assert tail_start_index(r, sizes, newest_user=4, count=8, max_tokens=100) == 3
    assert tail_start_index(r, sizes, newest_user=4, count=8, max_tokens=5_000) == 0  # all of it


def test_no_assistant_before_the_tail_means_nothing_compactable():
    r = roles("uuua")
    assert tail_start_index(r, [10] * 4, newest_user=2, count=1, max_tokens=0) == 0


def test_leaf_ends_before_an_assistant_within_the_limit():
    r = roles("uatauatauata")
    sizes = [10] * len(r)
    assert leaf_end_index(r, sizes, limit=8, chunk_tokens=45) == 2  # [u a t] | a u ...
    assert leaf_end_index(r, sizes, limit=8, chunk_tokens=1000) == 7


def test_an_indivisible_turn_bigger_than_the_limit_is_one_chunk():
    r = roles("attttttau")  # an assistant with six tool results cannot be cut
    assert leaf_end_index(r, [10] * len(r), limit=9, chunk_tokens=25) == 6


def test_a_chunk_too_small_to_be_worth_a_summary_extends_to_the_next_boundary():
    r = roles("uauauauaua")
    sizes = [10] * len(r)
    assert leaf_end_index(r, sizes, limit=9, chunk_tokens=25, min_tokens=0) == 0
    assert leaf_end_index(r, sizes, limit=9, chunk_tokens=25, min_tokens=55) == 6


def test_the_chunk_never_reaches_the_tail():
    r = roles("uauauaua")
    assert leaf_end_index(r, [10] * 8, limit=3, chunk_tokens=1000) == 2
    assert leaf_end_index(r, [10] * 8, limit=0, chunk_tokens=1000) is None
