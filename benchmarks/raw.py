"""The baseline: the same ingest and search done directly with the raw drivers.

What someone would write without lcm: ``sqlite3`` with a messages table, an FTS5 external-content
index kept by a trigger (same tokenizer as lcm, WAL + synchronous=NORMAL as lcm sets), and
``psycopg`` with a generated ``tsvector`` column and a GIN index. Each stores the message's JSON
and its searchable text (content plus tool-call arguments), like lcm. No identity checks, no
token counting, no sessions table, no summaries: the floor lcm's numbers are compared with.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Sequence
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from lcm.messages import message_text

_WORD = re.compile(r"\w+", re.UNICODE)


def _row(session: int, seq: int, message: dict[str, Any]) -> tuple:
    return (session, seq, message.get("role"), message_text(message), json.dumps(message, ensure_ascii=False))


class RawSQLite:
    def __init__(self, path: str):
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript("""
            CREATE TABLE IF NOT EXISTS msg (id INTEGER PRIMARY KEY, session INTEGER, seq INTEGER,
                                            role TEXT, body TEXT, data TEXT);
            CREATE INDEX IF NOT EXISTS msg_session ON msg(session, id);
            CREATE VIRTUAL TABLE IF NOT EXISTS msg_fts USING fts5(body, content='msg', content_rowid='id',
                                                                  tokenize='unicode61 remove_diacritics 2');
            CREATE TRIGGER IF NOT EXISTS msg_ai AFTER INSERT ON msg BEGIN
                INSERT INTO msg_fts(rowid, body) VALUES (new.id, new.body);
            END;
        """)

    def insert(self, session: int, first_seq: int, messages: Sequence[dict[str, Any]]) -> None:
        """One transaction."""
        self.conn.execute("BEGIN")
        self.conn.executemany("INSERT INTO msg (session, seq, role, body, data) VALUES (?, ?, ?, ?, ?)",
                              [_row(session, first_seq + i, m) for i, m in enumerate(messages)])
        self.conn.execute("COMMIT")

    def search(self, query: str, *, session: int | None, sort: str, limit: int = 10) -> list[int]:
        match = " ".join(f'"{w}"' for w in _WORD.findall(query)) or '""'
        where = "msg_fts MATCH ?" + (" AND m.session = ?" if session is not None else "")
        order = "m.id DESC" if sort == "recency" else "bm25(msg_fts)"
        params: list[Any] = [match] + ([session] if session is not None else [])
        rows = self.conn.execute(
            f"SELECT m.id FROM msg_fts JOIN msg m ON m.id = msg_fts.rowid WHERE {where} "
            f"ORDER BY {order} LIMIT {int(limit)}", params).fetchall()
        return [r[0] for r in rows]

    def close(self) -> None:
        self.conn.close()


class RawPostgres:
    def __init__(self, sqlalchemy_url: str):
        url = make_url(sqlalchemy_url)
        options = url.query.get("options")
        self.conn = psycopg.connect(host=url.host, port=url.port or 5432, user=url.username,
                                    password=url.password, dbname=url.database,
                                    options=options if isinstance(options, str) else None)
        with self.conn.transaction():
            self.conn.execute("""
                CREATE TABLE IF NOT EXISTS raw_msg (
                    id bigserial PRIMARY KEY, session integer, seq integer, role text, body text,
                    data text, tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple', body)) STORED)""")
            self.conn.execute("CREATE INDEX IF NOT EXISTS raw_msg_tsv ON raw_msg USING gin (tsv)")
            self.conn.execute("CREATE INDEX IF NOT EXISTS raw_msg_session ON raw_msg (session, id)")

    def insert(self, session: int, first_seq: int, messages: Sequence[dict[str, Any]]) -> None:
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.executemany("INSERT INTO raw_msg (session, seq, role, body, data) VALUES (%s, %s, %s, %s, %s)",
                            [_row(session, first_seq + i, m) for i, m in enumerate(messages)])

    def analyze(self) -> None:
        """VACUUM ANALYZE after the bulk load, as autovacuum soon would (outside a transaction)."""
        self.conn.commit()
        self.conn.autocommit = True
        try:
            self.conn.execute("VACUUM (ANALYZE) raw_msg")
        finally:
            self.conn.autocommit = False

    def search(self, query: str, *, session: int | None, sort: str, limit: int = 10) -> list[int]:
        where = "tsv @@ plainto_tsquery('simple', %s)" + (" AND session = %s" if session is not None else "")
        order = "id DESC" if sort == "recency" else "ts_rank_cd(tsv, plainto_tsquery('simple', %s)) DESC"
        params: list[Any] = [query] + ([session] if session is not None else [])
        params += [query] if sort != "recency" else []
        rows = self.conn.execute(f"SELECT id FROM raw_msg WHERE {where} ORDER BY {order} LIMIT {int(limit)}",
                                 params).fetchall()
        self.conn.commit()
        return [r[0] for r in rows]

    def close(self) -> None:
        self.conn.close()


def raw_for(backend: str, lcm_url: str) -> RawSQLite | RawPostgres:
    """The baseline store next to an lcm database (same directory / same schema)."""
    if backend == "sqlite":
        path = make_url(lcm_url).database
        return RawSQLite(str(path) + ".raw")
    return RawPostgres(lcm_url)
