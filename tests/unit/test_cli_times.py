"""Times on the command line in people's words (issue 33.3)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from lcm.cli.times import parse_time

NOW = datetime(2026, 3, 5, 15, 30, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(("text", "expected"), [
    ("1767225600", 1767225600.0),
    ("2026-03-05", datetime(2026, 3, 5, tzinfo=UTC).timestamp()),
    ("2026-03-05T09:00", datetime(2026, 3, 5, 9, tzinfo=UTC).timestamp()),
    ("2026-03-05T09:00:00Z", datetime(2026, 3, 5, 9, tzinfo=UTC).timestamp()),
    ("2026-03-05T09:00+02:00", datetime(2026, 3, 5, 7, tzinfo=UTC).timestamp()),
    ("today", datetime(2026, 3, 5, tzinfo=UTC).timestamp()),
    ("Yesterday", datetime(2026, 3, 4, tzinfo=UTC).timestamp()),
    ("now", NOW),
    ("30m", NOW - 1800), ("3h", NOW - 3 * 3600), ("2d", NOW - 2 * 86_400), ("1w", NOW - 604_800),
    ("1.5h", NOW - 5400),
])
def test_accepted_forms(text, expected):
    assert parse_time(text, now=NOW) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["last tuesday", "2d ago", "", "2026-13-01", "3 parsecs"])
def test_anything_else_is_refused(text):
    with pytest.raises(ValueError):
        parse_time(text, now=NOW)
