"""Alembic environment for lcm (one history for SQLite and PostgreSQL).

The URL comes from, in order: the caller (``lcm db upgrade`` passes it in the config
attributes), ``-x url=...``, ``LCM_DATABASE_URL``, the default SQLite file.

Each run holds the database's write lock for its whole duration (``BEGIN IMMEDIATE`` on SQLite,
a session-level advisory lock on PostgreSQL), so two processes upgrading at once run one after
the other and the second finds nothing to do. DDL is transactional on both: a failed upgrade
leaves the database at the last revision it finished (on PostgreSQL each revision commits on
its own; on SQLite the whole run is one transaction).

Online on PostgreSQL: each DDL statement waits at most ``LCM_MIGRATION_LOCK_TIMEOUT_MS`` for
its lock (agents keep working meanwhile; the run is retried), big indexes are built
``CONCURRENTLY``; see docs/storage.md, "Upgrading a database agents are using".
"""

from __future__ import annotations

from sqlalchemy import text

from alembic import context
from lcm.config import migration_lock_timeout_ms
from lcm.errors import ConfigError
from lcm.store import connection as db
from lcm.store.migrations import ADVISORY_LOCK_KEY, VERSION_TABLE, include_object
from lcm.store.schema import Base

config = context.config
target_metadata = Base.metadata

if config.config_file_name is not None:  # the alembic CLI: log "Running upgrade ..." lines
    from logging.config import fileConfig

    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url():
    url = config.attributes.get("lcm_url")
    if url is not None:
        return url
    return db.resolve_url(context.get_x_argument(as_dictionary=True).get("url"))


def _configure(**kwargs) -> None:
    context.configure(
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        compare_type=True,
        compare_server_default=False,
        transactional_ddl=True,
        **kwargs,
    )


def run_migrations_offline() -> None:
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


_LOCK = "SELECT {fn}(:k, hashtext(current_schema()))"


def run_migrations_online() -> None:
    url = _url()
    engine = db.standalone_engine(url)
    try:
        with engine.connect().execution_options(lcm_write=True) as connection:
            # PostgreSQL: one transaction per revision, so what a run finished stays done when a
            # later revision gives up on a lock (the advisory lock below covers the whole run).
            # SQLite keeps one transaction for the run: its write lock is what serialises runs.
            _configure(connection=connection, render_as_batch=url.get_backend_name() == "sqlite",
                       transaction_per_migration=url.get_backend_name() == "postgresql")
            postgres = connection.dialect.name == "postgresql"
            if postgres and connection.info.get("lcm_pooler"):
                raise ConfigError(
                    f"{db.display_url(url)} goes through a transaction-mode pooler (PgBouncer), and an "
                    "upgrade needs one session throughout (an advisory lock, CREATE INDEX CONCURRENTLY): "
                    "run `lcm db upgrade --url` against the PostgreSQL server itself")
            if postgres:
                # Session-level (not transaction-level): revisions may commit mid-way to build
                # an index CONCURRENTLY, and the lock must hold until the whole run is done.
                # One lock per schema (two lcm schemas on one server never wait for each other),
                # taken outside any transaction: a backend waiting for it holds no snapshot that
                # another upgrade's DDL would have to wait for (that was a deadlock).
                level = connection.default_isolation_level
                connection.commit()
                connection.execution_options(isolation_level="AUTOCOMMIT")
                # Wait for another upgrade as long as it takes; then no statement limit (a
                # backfill may run long) but a short lock limit on each DDL statement: one
                # waiting for a lock an agent holds would queue every agent behind it, so it
                # gives up instead and the run is retried (lcm.store.migrations.upgrade).
                connection.execute(text("SET lock_timeout = 0"))
                connection.execute(text(_LOCK.format(fn="pg_advisory_lock")), {"k": ADVISORY_LOCK_KEY})
                connection.execute(text("SET statement_timeout = 0"))
                connection.execute(text(f"SET lock_timeout = {migration_lock_timeout_ms()}"))
                connection.commit()
                connection.execution_options(isolation_level=level)
            try:
                with context.begin_transaction():
                    context.run_migrations()
            finally:
                if postgres:
                    connection.rollback()
                    connection.execute(text(_LOCK.format(fn="pg_advisory_unlock")), {"k": ADVISORY_LOCK_KEY})
                    connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
