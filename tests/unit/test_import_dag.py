"""Where another program's summaries go in lcm's DAG (``lcm.importers.dag.plan_dag``): the
shapes the peer-store fixtures do not have — a gap, an overlap, a leaf that is only a tool call,
a condensed node over leaves that could not be placed or are not consecutive."""

from __future__ import annotations

from lcm.importers.dag import plan_dag
from lcm.transfer import ImportedSummary


def _conversation() -> list[dict]:
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}
    return [{"role": "user", "content": "u0"}, {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "u2"}, call, {"role": "tool", "tool_call_id": "c1", "content": "r4"},
            {"role": "assistant", "content": "a5"}, {"role": "user", "content": "u6"},
            {"role": "assistant", "content": "a7"}]


def leaf(peer_id: str, *indexes: int, order: int = 0) -> ImportedSummary:
    return ImportedSummary(peer_id, 0, f"summary {peer_id}", tuple(indexes), order=order)


def condensed(peer_id: str, *children: str, depth: int = 1) -> ImportedSummary:
    return ImportedSummary(peer_id, depth, f"summary {peer_id}", children)


def spans(plan) -> list[tuple[str, int, int]]:
    return [(n.summary.peer_id, n.start, n.end) for n in plan.leaves]


def test_clean_leaves_and_a_condensed_node_are_placed_as_they_are():
    plan = plan_dag(_conversation(), [leaf("a", 0, 1), leaf("b", 2, 3, 4), condensed("c", "a", "b")])
    assert spans(plan) == [("a", 0, 2), ("b", 2, 5)] and not plan.notes
    assert plan.nodes[-1].children == ("a", "b")


def test_a_leaf_that_ends_on_a_tool_call_moves_back_before_the_call():
    plan = plan_dag(_conversation(), [leaf("a", 0, 1, 2, 3), leaf("b", 4, 5)])
    assert spans(plan) == [("a", 0, 3), ("b", 3, 6)]
    assert plan.nodes[0].moved_from == (0, 4) and plan.nodes[1].moved_from == (4, 6)


def test_the_last_leaf_moves_back_too_so_the_verbatim_part_opens_with_the_call():
    plan = plan_dag(_conversation(), [leaf("a", 0, 1, 2, 3)])
    assert spans(plan) == [("a", 0, 3)]


def test_a_leaf_that_is_only_the_call_gives_its_message_to_the_next_leaf_and_becomes_a_note():
    plan = plan_dag(_conversation(), [leaf("a", 0, 1, 2), leaf("b", 3), leaf("c", 4, 5)])
    assert spans(plan) == [("a", 0, 3), ("c", 3, 6)]
    assert [n["id"] for n in plan.notes] == ["b"]
    assert plan.nodes[1].moved_from == (4, 6)  # the program's own span, kept in the node's meta


def test_a_gap_stops_the_placing_and_the_rest_become_notes():
    plan = plan_dag(_conversation(), [leaf("a", 0, 1), leaf("b", 5, 6), leaf("c", 7), condensed("d", "a", "b")])
    assert spans(plan) == [("a", 0, 2)]
    assert [(n["id"], n["kind"]) for n in plan.notes] == [("b", "leaf"), ("c", "leaf"), ("d", "condensed")]
    assert "does not start where the previous summary ended" in plan.notes[0]["why"]
    assert "earlier summary" in plan.notes[1]["why"]
    assert plan.notes[0]["content"] == "summary b"  # the program's text is kept


def test_overlaps_missing_messages_and_holes_are_notes():
    assert [n["id"] for n in plan_dag(_conversation(), [leaf("a", 0, 1, 2), leaf("b", 2, 3)]).notes] == ["b"]
    assert [n["id"] for n in plan_dag(_conversation(), [leaf("a", 0, -1)]).notes] == ["a"]
    assert [n["id"] for n in plan_dag(_conversation(), [leaf("a", 0, 2)]).notes] == ["a"]
    assert [n["id"] for n in plan_dag(_conversation(), [leaf("a", 0, 1, 2, 3, 4, 5, 6, 7, 8)]).notes] == ["a"]


def test_a_condensed_node_over_leaves_that_are_not_consecutive_or_already_condensed_is_a_note():
    leaves = [leaf("a", 0, 1), leaf("b", 2), leaf("c", 3, 4, 5)]
    plan = plan_dag(_conversation(), [*leaves, condensed("x", "a", "c")])
    assert [n["id"] for n in plan.notes] == ["x"] and "not consecutive" in plan.notes[0]["why"]
    plan = plan_dag(_conversation(), [*leaves, condensed("x", "a", "b"), condensed("y", "b", "c")])
    assert [n["id"] for n in plan.notes] == ["y"]
    plan = plan_dag(_conversation(), [*leaves, condensed("x", "a", "b"), condensed("z", "x", depth=2)])
    assert not plan.notes and plan.nodes[-1].children == ("x",)
