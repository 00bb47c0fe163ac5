"""Statements sent on psycopg's own connection, for the hot paths where SQLAlchemy's
per-statement work (compiling the cache key, the result's metadata, a ``Row`` per row) costs
more than the server takes to answer: the turn's fused append (0.1 ms a turn) and a search's
word lookups (about 20 an auto-recall).

A driver error comes out as SQLAlchemy's, and one that means the connection is gone invalidates
it first, as SQLAlchemy would (the store reports it retryable, and the pool never hands the
dead connection out again)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from lcm.backends import named_rows

#: Result column names by statement text (``driver_row``).
_COLUMN_NAMES: dict[str, list[str]] = {}
#: SQL written with ``:name`` placeholders, as psycopg takes it (``%(name)s``, ``%`` doubled).
_COMPILED: dict[str, str] = {}
_COMPILED_MAX = 1_024


@contextmanager
def _cursor(conn: Connection, sql: str, params: dict[str, Any]) -> Iterator[Any]:
    driver: Any = conn.connection.driver_connection
    dbapi: Any = conn.dialect.loaded_dbapi  # psycopg, imported by SQLAlchemy (an optional extra)
    try:
        with driver.cursor() as cursor:
            cursor.execute(sql, params)
            yield cursor
    except dbapi.Error as exc:
        gone = conn.dialect.is_disconnect(exc, driver, None)
        if gone:
            conn.invalidate(exc)
        raise DBAPIError.instance(sql, params, exc, dbapi.Error, hide_parameters=True,
                                  connection_invalidated=gone, dialect=conn.dialect) from exc


def driver_row(conn: Connection, sql: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """The first row of ``sql`` (``%(name)s`` placeholders) as a dict, or None."""
    with _cursor(conn, sql, params) as cursor:
        row = cursor.fetchone()
        if row is None:
            return None
        names = _COLUMN_NAMES.get(sql)
        if names is None:  # the same for every run of a statement: read once
            names = _COLUMN_NAMES[sql] = [d.name for d in cursor.description]
        return dict(zip(names, row, strict=True))


def driver_rows(conn: Connection, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Every row of ``sql``, written with ``:name`` placeholders (as for ``text()``)."""
    compiled = _COMPILED.get(sql)
    if compiled is None:
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.clear()
        compiled = _COMPILED[sql] = str(text(sql).compile(dialect=conn.dialect))
    with _cursor(conn, compiled, params) as cursor:
        return list(cursor.fetchall())


def driver_named_rows(conn: Connection, compiled_sql: str, params: dict[str, Any]) -> list[Any]:
    """Every row of ``compiled_sql`` (already in psycopg's placeholders), read by attribute."""
    with _cursor(conn, compiled_sql, params) as cursor:
        return named_rows(cursor.description, cursor.fetchall())
