"""Hosts holding lcm's context on one session, on SQLite and PostgreSQL: the behaviours of
``tests/support/host_view_behaviours.py``."""

from tests.support.host_view_behaviours import *  # noqa: F403 - every shared behaviour, collected here
