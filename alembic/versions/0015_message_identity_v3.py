"""Message identity v3: the same words in a string or in one text part, with or without a
prompt-cache mark, are one message; so are the same tool-call arguments however spaced.

Chat clients re-send their history on every request, and some re-encode it on the way: SDKs
switch a message's content between a string and a list of one text part, and clients that use
Anthropic-style prompt caching (Cline, Roo Code, aider and others through OpenRouter or an
OpenAI-compatible gateway) put ``cache_control`` on the newest messages' parts and take it off
once newer messages carry it. Identity v2 hashed the parts as sent, so such a client's every
request looked like an edited history: measured with ``lcm proxy`` and ``on_turn_complete``,
an 11-message conversation became 19 stored rows in 4 forks, with messages out of order.
v3 (``lcm.messages.content_substance``) hashes a one-text-part list as its text and leaves the
parts' ``cache_control`` out. Clients that keep tool calls as parsed objects (LangChain, the
Vercel AI SDK) serialise the arguments again, with their own spacing and key order, every time
they re-send an assistant turn: v3 (``arguments_substance``) hashes JSON arguments as their
value. This revision recomputes the ``content_hash`` of every stored message whose content is
a list or that calls tools, and re-chains the identities after the first one that
changed, in its session and in the forks that branch off after it. The stored messages
themselves are untouched (still as first sent); duplicates v2 already stored stay stored.

A proxy conversation without ``X-LCM-Session`` that opened with a one-text-part list is known
by a new opening key from now on: a client continuing it across the upgrade continues in a new
session (its history is stored there once; nothing is lost).

Cost: most rows of an agent store are rewritten (every message after a session's first tool
call): 2.5 s on SQLite and 14.0 s on PostgreSQL for the proxy benchmark's 100,000 messages.

No schema change. Downgrading keeps the v3 values: v2 code reading them only risks the
duplicates this revision exists to stop.

Revision ID: 0015_message_identity_v3
Revises: 0014_small_gin_pending_lists
Create Date: 2026-11-29
"""
from __future__ import annotations

from alembic import op

revision = "0015_message_identity_v3"
down_revision = "0014_small_gin_pending_lists"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from lcm.store.upgrades import rehash_identity_v3

    rehash_identity_v3(op.get_bind())


def downgrade() -> None:
    pass
