"""Times on the command line (``--since``, ``--until``): the words people type.

Accepted, all turned into Unix seconds:

- Unix seconds (``1767225600``);
- an ISO-8601 time (``2026-03-05T09:00:00Z``, ``2026-03-05T09:00+02:00``);
- a bare date (``2026-03-05``): the start of that day; a date and time without a zone is
  taken as **UTC**, like every time lcm stores (the same command means the same thing on every
  machine);
- ``today``, ``yesterday`` (the start of that day, UTC) and ``now``;
- an age: a number and a unit, ``30m``, ``3h``, ``2d``, ``1w`` (that long before now).

Anything else is refused in the option's own words, with the forms above.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import click

_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d|w)", re.IGNORECASE)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
FORMS = ("Unix seconds, a date (2026-03-05, UTC), an ISO-8601 time (2026-03-05T09:00:00Z), "
         "today, yesterday, now, or an age such as 30m, 3h, 2d, 1w")


def parse_time(text: str, *, now: float | None = None) -> float:
    """``text`` as Unix seconds (see the module docstring); ValueError when it is none of them."""
    value = text.strip()
    current = time.time() if now is None else now
    word = value.lower()
    today = datetime.fromtimestamp(current, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if word == "now":
        return current
    if word == "today":
        return today.timestamp()
    if word == "yesterday":
        return (today - timedelta(days=1)).timestamp()
    age = _AGE.fullmatch(value)
    if age:
        return current - float(age.group(1)) * _UNITS[age.group(2).lower()]
    try:
        return float(value)
    except ValueError:
        pass
    parsed = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value)
    return (parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)).timestamp()


class TimeParam(click.ParamType):  # type: ignore[type-arg]  # generic only in click >= 8.2
    """A click parameter type for :func:`parse_time` (its errors name the option)."""

    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_time(str(value))
        except ValueError:
            self.fail(f"{value!r} is not a time: use {FORMS}", param, ctx)


TIME = TimeParam()
#: The help of a time option.
TIME_HELP = "Unix seconds, a date (UTC), an ISO-8601 time, today, yesterday, or an age (30m, 3h, 2d, 1w)."
