"""Message identity v2: a message's identity hashes its substance, not its annotations; lcm's
own recall traffic leaves the search index.

Hermes reloads a session (``--resume``, every new process) with keys added and dropped
(``timestamp`` and ``tool_name`` in, ``reasoning`` and ``finish_reason`` out), and identity v1
hashed every key, so a reloaded message was stored a second time. v2 hashes only role, content,
tool calls, the answered call and the speaker name (``lcm.messages.substance``). This revision
recomputes every stored message's ``content_hash`` and chained ``identity`` with the v2 rule,
and clears the search text of calls to lcm's own tools and their results (so ``lcm_grep`` stops
finding its own calls). Duplicates that v1 already stored stay stored (nothing is deleted).

No schema change. Downgrading keeps the v2 values: v1 code reading them only risks the
duplicates this revision exists to stop.

Revision ID: 0004_message_identity_v2
Revises: 0003_engine_state
Create Date: 2026-11-22
"""
from __future__ import annotations

from alembic import op

revision = "0004_message_identity_v2"
down_revision = "0003_engine_state"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from lcm.backends.postgres import PostgresBackend
    from lcm.store.upgrades import recompute_message_identities

    bind = op.get_bind()
    reindex = PostgresBackend().rewrite_exact_vectors if bind.dialect.name == "postgresql" else None
    recompute_message_identities(bind, reindex=reindex)


def downgrade() -> None:
    pass
