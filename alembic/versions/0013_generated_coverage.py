"""What lcm's summary message stands in for: the session and the last message it covers.

* ``lcm_generated.session_id`` and ``lcm_generated.through_seq`` (nullable integers): for the
  summary message lcm put at the head of a context it handed a host, the session and the last
  of its messages that summary stands in for. A host that sends the summary back (a restarted
  host reloading the list it kept, in a fork of its conversation, say) is then known to
  continue that session right after that message, without searching for it. Rows written
  before keep NULL: such a summary is known as lcm's own, as before, and its host's transcript
  is aligned by content.

Revision ID: 0013_generated_coverage
Revises: 0012_stems_off_the_turn
Create Date: 2026-11-27
"""
from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0013_generated_coverage"
down_revision = "0012_stems_off_the_turn"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable columns without a default: a catalog change on both backends, no rewrite.
    op.add_column("lcm_generated", sa.Column("session_id", sa.Integer(), nullable=True))
    op.add_column("lcm_generated", sa.Column("through_seq", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("lcm_generated", "through_seq")
    op.drop_column("lcm_generated", "session_id")
