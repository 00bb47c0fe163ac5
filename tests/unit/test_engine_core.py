"""The engine core without a database: the shared engine behaviours
(``tests/support/engine_behaviours.py``) over the in-memory store of ``tests/support``."""

from __future__ import annotations

from tests.support.engine_behaviours import (  # noqa: F401 - collected here
    test_a_backlog_is_worked_off_in_bounded_calls,
    test_a_compacting_turn_reads_the_view_once_and_plans_the_tail_once,
    test_a_host_that_only_calls_compress_loses_nothing,
    test_a_message_larger_than_the_window_is_handed_back_cut_and_recognised,
    test_a_message_that_cannot_be_stored_never_blocks_the_others,
    test_a_session_hermes_reloads_in_a_new_process_is_not_stored_twice,
    test_a_tail_bigger_than_the_cap_is_reported,
    test_a_tail_bigger_than_the_cap_shrinks_to_the_newest_turn,
    test_a_tool_group_is_never_split_and_a_giant_message_is_its_own_leaf,
    test_api_content_stamped_later_is_the_same_message,
    test_assembly_cap_holds_whenever_the_tail_fits,
    test_compaction_gets_under_the_threshold_and_records_why,
    test_compaction_then_host_transcript_adds_only_new_messages,
    test_compress_output_follows_the_contract,
    test_compression_boundary_continues_the_same_conversation,
    test_condensation_fanin_and_max_depth,
    test_copies_share_the_store_not_the_session,
    test_every_entry_point_stores_exactly_once,
    test_focus_topic_and_llm_summaries,
    test_force_runs_a_pass_below_the_threshold,
    test_get_status_clamps_the_host_sentinel,
    test_host_hooks_tolerate_unknown_keyword_arguments,
    test_new_session_carries_deep_summaries_and_keeps_raw_messages,
    test_nothing_outside_the_fresh_tail_is_a_reason_not_a_loop,
    test_own_summary_message_is_never_stored,
    test_passes_are_bounded_and_the_rest_continues_next_time,
    test_repeated_content_is_kept_and_uids_are_identities,
    test_resending_the_full_transcript_after_compaction_adds_nothing,
    test_retain_depth_zero_carries_nothing,
    test_should_compress_and_cheap_preflights,
    test_the_system_message_comes_back_without_the_host_marker,
)
