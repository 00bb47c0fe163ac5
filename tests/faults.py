"""Faults planted on purpose, so tests can prove the doctor finds them and repair fixes them."""

from __future__ import annotations

from sqlalchemy import text

from lcm.store import Store


def drop_from_index(store: Store, store_id: int) -> None:
    """The row stays, its search index entry is gone (a lost trigger write)."""
    with store.engine.begin() as conn:
        if store.backend_name == "sqlite":
            body, scope = conn.execute(text(
                "SELECT body, scope FROM lcm_messages_fts_src WHERE id = :i"), {"i": store_id}).one()
            conn.execute(text("INSERT INTO lcm_messages_fts(lcm_messages_fts, rowid, body, scope) "
                              "VALUES ('delete', :i, :b, :s)"), {"i": store_id, "b": body, "s": scope})
        else:
            conn.execute(text("UPDATE lcm_messages SET search_vector = NULL WHERE id = :i"),
                         {"i": store_id})


def corrupt_index_entry(store: Store, store_id: int) -> None:
    """The row stays indexed, but under words it does not contain."""
    with store.engine.begin() as conn:
        if store.backend_name == "sqlite":
            body, scope = conn.execute(text(
                "SELECT body, scope FROM lcm_messages_fts_src WHERE id = :i"), {"i": store_id}).one()
            conn.execute(text("INSERT INTO lcm_messages_fts(lcm_messages_fts, rowid, body, scope) "
                              "VALUES ('delete', :i, :b, :s)"), {"i": store_id, "b": body, "s": scope})
            conn.execute(text("INSERT INTO lcm_messages_fts(rowid, body, scope) VALUES (:i, 'bogus words', :s)"),
                         {"i": store_id, "s": scope})
        else:
            conn.execute(text("UPDATE lcm_messages SET search_vector = "
                              "to_tsvector('simple', 'bogus words') WHERE id = :i"), {"i": store_id})
