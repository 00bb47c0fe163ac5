"""Alembic, driven from inside lcm: locate the migrations, read and change the schema version.

The history lives in ``alembic/`` at the repository root (``alembic upgrade head`` with the
root ``alembic.ini``) and is packaged into the wheel as ``lcm/_migrations`` so an installed lcm
can create and upgrade databases (``lcm db upgrade``) without a checkout.

Opening a store must stay fast on big databases, so the version check reads the version table
directly and compares it with :data:`KNOWN_REVISIONS` (a test keeps that tuple equal to the
Alembic history); Alembic itself is only imported when something has to change.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, inspect, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import OperationalError

from lcm.errors import DatabaseUnavailableError, first_line
from lcm.store import connection

#: Every revision of the history, oldest first. Append here when adding a revision.
KNOWN_REVISIONS: tuple[str, ...] = ("0001_core_schema", "0002_search_index", "0003_engine_state",
                                     "0004_message_identity_v2", "0005_writers_and_forks", "0006_system_prompts",
                                     "0007_stemmed_search", "0008_vectors",
                                     "0009_session_origin", "0010_deferred_message_index",
                                     "0011_deferred_token_counts", "0012_stems_off_the_turn",
                                     "0013_generated_coverage", "0014_small_gin_pending_lists",
                                     "0015_message_identity_v3")
HEAD = KNOWN_REVISIONS[-1]
VERSION_TABLE = "lcm_alembic_version"
#: Key of the PostgreSQL advisory lock that serialises concurrent `lcm db upgrade` runs.
ADVISORY_LOCK_KEY = 0x6C636D  # "lcm"


def script_location() -> Path:
    """The directory holding env.py and versions/ (installed package first, then checkout)."""
    package = Path(__file__).resolve().parent.parent  # lcm/
    for candidate in (package / "_migrations", package.parent / "alembic"):
        if (candidate / "env.py").is_file() and (candidate / "versions").is_dir():
            return candidate
    raise RuntimeError(
        "lcm's database migrations are missing from this installation; reinstall the package"
    )


def alembic_config(url: URL) -> Any:
    from alembic.config import Config

    # Alembic's default ``stdout`` is bound when alembic is first imported; pass the current one
    # (a redirected or replaced sys.stdout must not leave Alembic writing to a closed stream).
    cfg = Config(stdout=sys.stdout)
    cfg.set_main_option("script_location", str(script_location()))
    cfg.attributes["lcm_url"] = url
    return cfg


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Autogenerate filter: leave out objects only one dialect has (FTS5 tables, tsvectors)."""
    from lcm.store.schema import DIALECT_ONLY_OBJECTS

    if name is None:
        return True
    if name in DIALECT_ONLY_OBJECTS or name.startswith(("lcm_messages_fts", "lcm_summaries_fts", "lcm_messages_stems",
                                                        "lcm_summaries_stems")):
        return False
    if type_ == "table" and name == VERSION_TABLE:
        return False
    return True


@dataclass(frozen=True, slots=True)
class SchemaState:
    current: str | None
    head: str

    @property
    def status(self) -> str:
        """``current``, ``empty`` (no lcm schema), ``behind`` or ``unknown`` (newer lcm)."""
        if self.current == self.head:
            return "current"
        if self.current is None:
            return "empty"
        if self.current in KNOWN_REVISIONS:
            return "behind"
        return "unknown"


def current_revision(conn: Connection) -> str | None:
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(rows) > 1:
        return ",".join(sorted(rows))
    return rows[0] if rows else None


def schema_state(conn: Connection) -> SchemaState:
    return SchemaState(current=current_revision(conn), head=HEAD)


def state_at(url: URL) -> SchemaState:
    """The schema state of the database at ``url``, on a connection of its own (nothing
    pooled, nothing created): what ``lcm db`` reports. DatabaseUnavailableError when it cannot
    be reached."""
    engine = connection.standalone_engine(url)
    try:
        with engine.connect() as conn:
            return schema_state(conn)
    except OperationalError as exc:
        raise DatabaseUnavailableError(
            f"cannot connect to {connection.display_url(url)}: {first_line(exc)}") from exc
    finally:
        engine.dispose()


#: Runs of an upgrade that gave up waiting for a lock (``LCM_MIGRATION_LOCK_TIMEOUT_MS``)
#: before lcm stops trying; between runs it backs off (0.5 s more each time, at most 5 s).
UPGRADE_ATTEMPTS = 30


def _gave_up_on_a_lock(exc: BaseException) -> bool:
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == "55P03"  # lock_not_available


def upgrade(url: URL, revision: str = "head", *,
            on_retry: Callable[[int, str], None] | None = None) -> None:
    """Upgrade the schema to ``revision``. On PostgreSQL a DDL statement that waits too long
    for a lock an agent holds gives up (its revision rolls back; each revision commits on its
    own) and the run goes on after a pause from where it stopped, so agents are never queued
    behind the upgrade for long; ``on_retry(attempt, reason)`` is told of each retry."""
    from alembic import command

    for attempt in range(1, UPGRADE_ATTEMPTS + 1):
        try:
            command.upgrade(alembic_config(url), revision)
            return
        except OperationalError as exc:
            if not _gave_up_on_a_lock(exc):
                raise
            if attempt == UPGRADE_ATTEMPTS:
                raise DatabaseUnavailableError(
                    f"the upgrade of {connection.display_url(url)} gave up after {attempt} tries: a lock it "
                    f"needs stayed held ({first_line(exc)}). Find the holder with SELECT pid, "
                    "application_name, state, xact_start, query FROM pg_stat_activity WHERE datname = "
                    "current_database() ORDER BY xact_start, end it or wait for it, then run "
                    "`lcm db upgrade` again (the revision it was applying was rolled back)") from exc
            if on_retry is not None:
                on_retry(attempt, first_line(exc))
            time.sleep(min(5.0, 0.5 * attempt))


def create_index_online(name: str, table: str, columns: list[str], **kw: Any) -> None:
    """``CREATE INDEX CONCURRENTLY IF NOT EXISTS`` for a revision (inside
    ``op.get_context().autocommit_block()``): writers are not blocked while it builds. A build
    that was interrupted (a lock timeout, a cancelled upgrade) leaves an INVALID index behind,
    which ``IF NOT EXISTS`` would keep; it is dropped first so the retry builds a valid one."""
    from alembic import op

    bind = op.get_bind()
    invalid = bind.execute(text(
        "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = :name AND n.nspname = current_schema() AND NOT i.indisvalid"),
        {"name": name}).first()
    if invalid is not None:
        op.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')
    # A concurrent build waits for every older transaction in the database, and blocks no
    # agent meanwhile (it takes no lock that writers need): no lock timeout for it.
    before = bind.execute(text("SELECT current_setting('lock_timeout')")).scalar_one()
    bind.execute(text("SET lock_timeout = 0"))
    try:
        op.create_index(name, table, columns, postgresql_concurrently=True, if_not_exists=True, **kw)
    finally:
        bind.execute(text("SELECT set_config('lock_timeout', :v, false)"), {"v": before})


def downgrade(url: URL, revision: str) -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)


def history() -> list[dict[str, str | None]]:
    """The revisions of the packaged history, oldest first."""
    from alembic.script import ScriptDirectory

    cfg = alembic_config(URL.create("sqlite"))
    scripts = ScriptDirectory.from_config(cfg)
    revs = list(scripts.walk_revisions())
    revs.reverse()
    return [{"revision": r.revision, "message": r.doc,
             "down_revision": r.down_revision if isinstance(r.down_revision, str | None)
             else ",".join(r.down_revision)} for r in revs]
