"""Statements sent on SQLite's own driver connection (``sqlite3``), for the hot paths where
SQLAlchemy's per-statement work (building the statement, the result's metadata, a ``Row`` per
row) costs more than SQLite takes to answer: the turn's inserts and a search's word lookups."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError


def driver_execute(conn: Connection, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> Any:
    """``sql`` on the driver's own connection, inside the transaction ``conn`` holds; a driver
    error comes out as SQLAlchemy's (what the store's error handling catches)."""
    import sqlite3

    driver: Any = conn.connection.driver_connection
    try:
        return driver.execute(sql, params)
    except sqlite3.Error as exc:
        raise DBAPIError.instance(sql, params, exc, sqlite3.Error) from exc
