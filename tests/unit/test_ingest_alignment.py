"""Ingest alignment over the in-memory store (no database): the shared behaviours of
``tests/support/alignment_behaviours.py``."""

from __future__ import annotations

from tests.support.alignment_behaviours import (  # noqa: F401 - collected here
    test_a_resumed_engine_with_the_tail_of_a_long_session_stores_nothing_twice,
    test_a_transcript_starting_anywhere_adds_only_its_new_messages,
    test_nothing_is_lost_and_nothing_unique_is_stored_twice,
)
