"""Which rows of a compacted Hermes conversation are messages (``sort_generations``): the shapes
the end-to-end files may not show — a stub result, a merged copy whose original was rewound, a
user who really did say the same thing twice, a conversation never compacted."""

from __future__ import annotations

from lcm.importers.hermes_generations import MERGED_DELIMITER, MERGED_HEADER, SUMMARY_PREFIXES, sort_generations


def u(text: str, ts: float) -> dict:
    return {"role": "user", "content": text, "timestamp": ts}


def a(text: str | None, ts: float, calls: tuple[str, ...] = ()) -> dict:
    message = {"role": "assistant", "content": text, "timestamp": ts}
    if calls:
        message["tool_calls"] = [{"id": c, "type": "function", "function": {"name": "ls", "arguments": "{}"}}
                                 for c in calls]
    return message


def t(call: str, text: str, ts: float) -> dict:
    return {"role": "tool", "tool_call_id": call, "content": text, "timestamp": ts}


def merged(own: str, summary: str, ts: float, role: str = "assistant") -> dict:
    return {"role": role, "timestamp": ts,
            "content": f"{MERGED_HEADER}\n{own}\n\n{MERGED_DELIMITER}\n\n{SUMMARY_PREFIXES[0]} {summary}"}


def test_a_conversation_never_compacted_is_all_messages_even_if_it_quotes_a_summary():
    rows = [u("hi", 1), a(f"{SUMMARY_PREFIXES[0]} quoted", 2), u("hi", 3)]
    verdicts = sort_generations(rows, compacted=False)
    assert verdicts.kept == [0, 1, 2] and not verdicts.summaries


def test_copies_summaries_and_new_turns_of_an_in_place_generation():
    first = [u("task", 1), a("ok", 2), u("more", 3), a(None, 4, ("c1",)), t("c1", "out", 5), a("done", 6)]
    second = [u("task", 1), merged("ok", "S1", 2), t("c1", "[pruned]", 5), a("done", 6), u("new", 7), a("sure", 8)]
    verdicts = sort_generations(first + second, compacted=True)
    assert verdicts.kept == [0, 1, 2, 3, 4, 5, 10, 11]
    assert verdicts.copies == [6, 7, 8, 9]
    assert [text for _, text in verdicts.summaries] == [f"{SUMMARY_PREFIXES[0]} S1"]


def test_a_stub_result_for_a_call_that_has_its_result_is_a_copy():
    rows = [u("go", 1), a(None, 2, ("c1",)), t("c1", "real", 3), a("ok", 4),
            a(f"{SUMMARY_PREFIXES[0]} S", 9), t("c1", "[Result from earlier conversation]", 10), u("next", 11)]
    verdicts = sort_generations(rows, compacted=True)
    assert verdicts.kept == [0, 1, 2, 3, 6] and verdicts.copies == [5] and len(verdicts.summaries) == 1


def test_a_merged_copy_whose_original_is_gone_keeps_its_own_text():
    verdicts = sort_generations([merged("only here", "S", 5), u("q", 6)], compacted=True)
    assert verdicts.kept == [0, 1] and verdicts.own_text == {0: "only here"}


def test_the_same_words_twice_with_an_answer_between_are_two_messages():
    rows = [u("again", 1), a("ok", 2), u("again", 3), a("ok", 4)]
    assert sort_generations(rows, compacted=True).kept == [0, 1, 2, 3]


def test_the_turn_in_progress_written_again_after_a_rotation_is_a_copy_and_so_are_its_later_copies():
    rows = [u("a", 1), a("b", 2), u("turn", 3.000),  # the parent, its last turn not answered yet
            u("a", 1), a(f"{SUMMARY_PREFIXES[0]} S", 9), u("turn", 3.007),  # the child: copies, summary, re-sent
            u("a", 1), a(f"{SUMMARY_PREFIXES[0]} S", 9), u("turn", 3.007),  # written twice
            a("answer", 10)]
    verdicts = sort_generations(rows, compacted=True)
    assert verdicts.kept == [0, 1, 2, 9] and len(verdicts.summaries) == 1


def test_a_turn_in_progress_written_again_with_the_compaction_s_own_stamp_is_a_copy():
    """hermes-agent 0.19 compacting mid-turn: the user's message, the call and its result are
    written again with the compaction's timestamp, after a summary merged into an earlier summary."""
    rows = [u("t5", 31), a(None, 32, ("c5",)), t("c5", "out", 33),
            merged(f"{SUMMARY_PREFIXES[0]} S1", "S2", 34),  # the tail copy was the previous summary
            u("t5", 34), a(None, 34, ("c5",)), t("c5", "out", 34),  # the turn again, stamped 34
            a("done", 35), u("t6", 36),
            u("t5", 34)]  # a later copy of the re-stamped copy
    verdicts = sort_generations(rows, compacted=True)
    assert verdicts.kept == [0, 1, 2, 7, 8]
    assert [text for _, text in verdicts.summaries] == [f"{SUMMARY_PREFIXES[0]} S2", f"{SUMMARY_PREFIXES[0]} S1"]


def test_a_finished_turn_said_again_after_a_compaction_is_a_new_message():
    rows = [u("continue", 1), a("ok", 2), a(f"{SUMMARY_PREFIXES[0]} S", 3), u("continue", 4), a("ok again", 5)]
    assert sort_generations(rows, compacted=True).kept == [0, 1, 3, 4]
