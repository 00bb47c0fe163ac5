"""PostgreSQL: the search indexes' pending lists stay small (``gin_pending_list_limit`` 1 MB).

A GIN index with ``fastupdate`` (PostgreSQL's default) adds new rows' entries to an unsorted
pending list, which every search of the index then reads in full, and merges the list into the
index only when it outgrows ``gin_pending_list_limit`` (4 MB by default) or at VACUUM (which
autovacuum runs after 20% of a table's rows are new). On a store past 100k messages the list
of the messages' index therefore holds up to 512 pages most of the time: measured at 100k
messages with 200 pending pages in each of the two messages' indexes, the 20 word lookups of one
auto-recall took 85 ms, and 26 ms once the lists were merged. Capping each list at 1 MB (128
pages) bounds what a search reads there; the insert that crosses the cap merges the list.

Why 1 MB (docs/benchmarks.md, "PostgreSQL's GIN pending lists"): after 6,000 new messages on a
100k store, one auto-recall took 96-116 ms at the default, 73-74 ms at 1 MB, 56-71 ms at 256 kB;
with every pass's pending lists merged at its end (the server-cost benchmark), a turn wrote 43.7
KiB of WAL at the default, 46.3 at 1 MB and 58.5 at 256 kB (smaller merges rewrite the same
index pages more often). 1 MB keeps most of the search's gain for 6% more WAL.

A storage parameter of four indexes: a catalog change, no rewrite, nothing on SQLite (FTS5 has
no pending list).

Revision ID: 0014_small_gin_pending_lists
Revises: 0013_generated_coverage
Create Date: 2026-11-28
"""
from __future__ import annotations

from alembic import op

revision = "0014_small_gin_pending_lists"
down_revision = "0013_generated_coverage"
branch_labels = None
depends_on = None

#: kB: 128 pages of 8 kB.
PENDING_LIST_KB = 1024
GIN_INDEXES = ("ix_lcm_messages_search_vector", "ix_lcm_summaries_search_vector",
               "ix_lcm_message_stems_search_stems", "ix_lcm_summaries_search_stems")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for index in GIN_INDEXES:
        op.execute(f"ALTER INDEX {index} SET (gin_pending_list_limit = {PENDING_LIST_KB})")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for index in GIN_INDEXES:
        op.execute(f"ALTER INDEX {index} RESET (gin_pending_list_limit)")
