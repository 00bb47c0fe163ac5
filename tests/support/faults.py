"""Faults planted on purpose, so tests can prove the doctor finds them and repair fixes them."""

from __future__ import annotations

from sqlalchemy import Connection, text

from lcm.store import Store


def _unindex_sqlite(conn: Connection, store_id: int) -> str:
    """Remove a message's FTS5 entry (as a lost trigger write would); returns its scope."""
    body, scope = conn.execute(text(
        "SELECT body, scope FROM lcm_messages_fts_src WHERE id = :i"), {"i": store_id}).one()
    conn.execute(text("INSERT INTO lcm_messages_fts(lcm_messages_fts, rowid, body, scope) "
                      "VALUES ('delete', :i, :b, :s)"), {"i": store_id, "b": body, "s": scope})
    return scope


def drop_from_index(store: Store, store_id: int) -> None:
    """The row stays, its search index entry is gone (a lost trigger write)."""
    store.search.catch_up()  # only an indexed row can lose its entry
    with store.engine.begin() as conn:
        if store.backend_name == "sqlite":
            _unindex_sqlite(conn, store_id)
        else:
            conn.execute(text("UPDATE lcm_messages SET search_vector = NULL WHERE id = :i"),
                         {"i": store_id})


def corrupt_index_entry(store: Store, store_id: int) -> None:
    """The row stays indexed, but under words it does not contain."""
    store.search.catch_up()
    with store.engine.begin() as conn:
        if store.backend_name == "sqlite":
            scope = _unindex_sqlite(conn, store_id)
            conn.execute(text("INSERT INTO lcm_messages_fts(rowid, body, scope) VALUES (:i, 'bogus words', :s)"),
                         {"i": store_id, "s": scope})
        else:
            conn.execute(text("UPDATE lcm_messages SET search_vector = "
                              "to_tsvector('simple', 'bogus words') WHERE id = :i"), {"i": store_id})
