"""PostgreSQL row-level security: each agent's database role reaches only its own rows.

Opt-in (``lcm db secure --per-agent-roles``), for a shared server where agents should be
walled off from each other by the database itself, not only by lcm's own scoping: a process
holding agent A's credentials cannot read agent B's rows even with raw SQL.

How it works (all objects live in the lcm schema; the table owner, who runs upgrades and
maintenance, is not subject to the policies):

* ``lcm_agent_role(name)``: the role of an agent, ``lcm_agent_<name>`` for a name of lowercase
  letters, digits and underscores (up to 40), else ``lcm_agent_<16 hex of md5(name)>``. One SQL
  function, so the policies and the command agree by construction.
* ``lcm_current_agent()``: the agent whose role is ``current_user`` (NULL for any other role).
  STABLE, so a policy ``agent_id = lcm_current_agent()`` is an index condition, evaluated once.
* Policies: rows with an ``agent_id`` match it; rows hanging off a session or a summary match
  when that parent is visible (which its own policy decides); the agent row itself matches its
  role; a payload (content-addressed, shared by every agent that stored the same text) is
  visible when one of the agent's own messages references it, or when the agent names its
  SHA-256 in the transaction-local ``lcm.payload_claim`` setting: lcm does that when storing a
  payload, to learn its id, and naming the hash of a text means already having the text.
* Grants (to each agent role): SELECT, INSERT, UPDATE, DELETE on the lcm tables, USAGE on the
  schema and its sequences, SELECT on the version table. No DDL, no ownership: an agent role
  cannot change the schema or the policies, nor turn row security off for itself.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, text

#: Tables with an agent_id column: visible when it is the current agent's.
AGENT_TABLES = ("lcm_sessions", "lcm_session_aliases", "lcm_generated", "lcm_messages", "lcm_message_stems",
                "lcm_summaries", "lcm_vectors")
#: Tables hanging off a visible parent: (table, condition on the parent).
CHILD_TABLES = (
    ("lcm_system_prompts", "EXISTS (SELECT 1 FROM lcm_sessions s WHERE s.id = lcm_system_prompts.session_id)"),
    ("lcm_carried_summaries",
     "EXISTS (SELECT 1 FROM lcm_sessions s WHERE s.id = lcm_carried_summaries.session_id)"),
    ("lcm_summary_sources", "EXISTS (SELECT 1 FROM lcm_summaries s WHERE s.id = lcm_summary_sources.summary_id)"),
)
PAYLOAD_VISIBLE = (
    "EXISTS (SELECT 1 FROM lcm_messages m WHERE m.payload_id = lcm_payloads.id) OR "
    "sha256 = ANY (string_to_array(current_setting('lcm.payload_claim', true), ','))")
#: A payload may be inserted by anyone (it reveals nothing), read and deleted when visible.
PAYLOAD_POLICIES = (("read", f"FOR SELECT USING ({PAYLOAD_VISIBLE})"),
                    ("write", "FOR INSERT WITH CHECK (true)"),
                    ("delete", f"FOR DELETE USING ({PAYLOAD_VISIBLE})"))
POLICY = "lcm_agent_isolation"
ALL_TABLES = ("lcm_agents", *AGENT_TABLES, *(t for t, _ in CHILD_TABLES), "lcm_payloads")

#: Names in function bodies are resolved when the function runs, by the caller's search_path:
#: a role able to create a table named lcm_agents earlier on its path could answer for another
#: agent. So the bodies name the lcm schema outright ({schema} is filled in).
FUNCTIONS = r"""
CREATE OR REPLACE FUNCTION {schema}.lcm_agent_role(agent text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT 'lcm_agent_' || CASE WHEN agent ~ '^[a-z0-9_]{{1,40}}$' THEN agent
                              ELSE substr(md5(agent), 1, 16) END
$$;
CREATE OR REPLACE FUNCTION {schema}.lcm_current_agent() RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT id FROM {schema}.lcm_agents WHERE {schema}.lcm_agent_role(name) = current_user
$$;
"""


@dataclass(frozen=True, slots=True)
class AgentRole:
    agent: str
    role: str
    created: bool  # False: the role existed and was left as it was (its password too)
    password: str | None  # set only for a role created now


def _ident(conn: Connection, name: str) -> str:
    return str(conn.execute(text("SELECT quote_ident(:n)"), {"n": name}).scalar_one())


def enable(conn: Connection, agents: Sequence[str], *, passwords: bool = True) -> list[AgentRole]:
    """Turn row-level security on (idempotent) and give each agent a login role.

    The policies apply to every role but the tables' owner (and superusers): a role that is no
    agent's sees no rows at all."""
    schema = _ident(conn, str(conn.execute(text("SELECT current_schema()")).scalar_one()))
    conn.exec_driver_sql(FUNCTIONS.format(schema=schema))
    policies = [("lcm_agents", "lcm_agent_role(name) = current_user"),
                *((t, "agent_id = lcm_current_agent()") for t in AGENT_TABLES), *CHILD_TABLES]
    for table, condition in policies:
        conn.exec_driver_sql(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        conn.exec_driver_sql(f"DROP POLICY IF EXISTS {POLICY} ON {table}")
        conn.exec_driver_sql(f"CREATE POLICY {POLICY} ON {table} USING ({condition}) WITH CHECK ({condition})")
    conn.exec_driver_sql("ALTER TABLE lcm_payloads ENABLE ROW LEVEL SECURITY")
    for suffix, clause in PAYLOAD_POLICIES:
        conn.exec_driver_sql(f"DROP POLICY IF EXISTS {POLICY}_{suffix} ON lcm_payloads")
        conn.exec_driver_sql(f"CREATE POLICY {POLICY}_{suffix} ON lcm_payloads {clause}")
    made = []
    for agent in agents:
        role = str(conn.execute(text("SELECT lcm_agent_role(:a)"), {"a": agent}).scalar_one())
        quoted = _ident(conn, role)
        exists = conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first() is not None
        password = None
        if not exists:
            login = "LOGIN"
            if passwords:
                password = secrets.token_urlsafe(24)
                literal = conn.execute(text("SELECT quote_literal(:p)"), {"p": password}).scalar_one()
                login += f" PASSWORD {literal}"
            conn.exec_driver_sql(f"CREATE ROLE {quoted} {login}")
        conn.exec_driver_sql(f"GRANT USAGE ON SCHEMA {schema} TO {quoted}")
        conn.exec_driver_sql(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {', '.join(ALL_TABLES)} TO {quoted}")
        conn.exec_driver_sql(f"GRANT SELECT ON lcm_alembic_version TO {quoted}")
        conn.exec_driver_sql(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {quoted}")
        made.append(AgentRole(agent=agent, role=role, created=not exists, password=password))
    return made


def disable(conn: Connection) -> None:
    """Row-level security off and the policies gone (the roles stay: dropping a role is the
    operator's call, ``DROP OWNED BY ...; DROP ROLE ...``)."""
    for table in ALL_TABLES:
        for name in (POLICY, *(f"{POLICY}_{suffix}" for suffix, _ in PAYLOAD_POLICIES)):
            conn.exec_driver_sql(f"DROP POLICY IF EXISTS {name} ON {table}")
        conn.exec_driver_sql(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
