"""The engine core without a database: the shared engine behaviours
(``tests/support/engine_behaviours.py``) over the in-memory store of ``tests/support``."""

from __future__ import annotations

from tests.support.engine_behaviours import *  # noqa: F403 - every shared behaviour, collected here
