"""Ingest alignment on SQLite and PostgreSQL: the shared behaviours of
``tests/support/alignment_behaviours.py``."""

from __future__ import annotations

from tests.support.alignment_behaviours import *  # noqa: F403 - every shared behaviour, collected here
