"""Fixtures: every test gets its own database (a SQLite file, or a PostgreSQL schema).

PostgreSQL comes from ``LCM_TEST_POSTGRES_URL`` when set (CI sets it), else from a
testcontainers PostgreSQL when a Docker engine answers, else the PostgreSQL tests are skipped
with the reason shown in the summary (``-ra``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from lcm.store import Store
from lcm.store import connection as db

REPO_ROOT = Path(__file__).resolve().parent.parent

# Embeddings are off unless a test turns them on (tests/integration/test_embeddings.py and the
# store's vector tests do): a background indexer thread writing into every test's database would
# make the other tests' row counts and timings depend on it. Subprocesses inherit this.
os.environ["LCM_EMBEDDINGS"] = "off"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Each skip reason once, with how many tests it skipped (pytest's own ``-rs`` repeats it
    for every test location: 129 lines of one reason when no PostgreSQL is configured)."""
    counts: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        counts[reason] = counts.get(reason, 0) + 1
    if counts:
        terminalreporter.section("skipped, by reason")
        for reason, n in sorted(counts.items(), key=lambda kv: -kv[1]):
            terminalreporter.line(f"{n} test(s): {reason}")


def pytest_report_header() -> list[str]:
    """Say where the Hermes end-to-end tests keep (or will build) their virtualenv."""
    from tests.support.hermes_host import HERMES_VERSION, venv_dir

    return [f"hermes-agent {HERMES_VERSION} test venv: {venv_dir()} (LCM_HERMES_VENV moves it)"]


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """lcm's cache (the parsed tokenizer) goes to a temporary folder, not the user's ~/.cache."""
    path = tmp_path_factory.mktemp("lcm-cache")
    previous = os.environ.get("LCM_CACHE_DIR")
    os.environ["LCM_CACHE_DIR"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("LCM_CACHE_DIR", None)
    else:
        os.environ["LCM_CACHE_DIR"] = previous


def _docker_answers() -> str | None:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means "no Docker engine here"
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A PostgreSQL server URL (psycopg driver), or a skip that says why there is none."""
    url = os.environ.get("LCM_TEST_POSTGRES_URL")
    if url:
        yield db.resolve_url(url).render_as_string(hide_password=False)
        return
    problem = _docker_answers()
    if problem is not None:
        pytest.skip(
            "PostgreSQL tests skipped: LCM_TEST_POSTGRES_URL is not set and no Docker engine "
            f"answers for testcontainers ({problem}); run .ci/run or export "
            "LCM_TEST_POSTGRES_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test"
        )
    from testcontainers.postgres import PostgresContainer

    with PostgresContainer("postgres:16-alpine", driver="psycopg") as container:
        yield container.get_connection_url()


def _admin(server: str):
    return create_engine(server, poolclass=NullPool, isolation_level="AUTOCOMMIT")


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A fresh, empty schema on the PostgreSQL server, dropped after the test."""
    schema = "lcm_test_" + uuid.uuid4().hex[:12]
    admin = _admin(pg_server)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    url = make_url(pg_server).update_query_dict({"options": f"-csearch_path={schema}"})
    text_url = url.render_as_string(hide_password=False)
    try:
        yield text_url
    finally:
        db.dispose(db.resolve_url(text_url))
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'lcm.db'}"
    try:
        yield url
    finally:
        db.dispose(db.resolve_url(url))


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """The same test on an embedded SQLite file and on a PostgreSQL schema."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture
def store(db_url: str) -> Store:
    return Store.open(db_url, upgrade=True)


@pytest.fixture
def session(store: Store):
    return store.sessions.get_or_create("agent-a", "session-1", platform="cli")


# --------------------------------------------------------------------------- engine fixtures

#: Small sizes so compaction, condensation and budgets all trigger on small conversations.
#: Sizes scaled to the tests' tiny windows (3,000-10,000 tokens). The compaction target is half
#: the window there: the default quarter of 3,000 tokens would be less than the fresh tail.
SMALL_ENGINE = dict(fresh_tail_count=6, leaf_chunk_tokens=400, condensation_fanin=3,
                    incremental_max_depth=2, leaf_target_tokens=80, condensed_target_tokens=100,
                    compaction_target=0.5)


@pytest.fixture
def llm():
    """A scripted OpenAI-compatible server on 127.0.0.1 (tests set ``llm.handler``)."""
    from tests.support.llm_server import ScriptedLLM

    server = ScriptedLLM()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def make_engine(db_url: str):
    """Engines on the test database, with SMALL_ENGINE sizes unless overridden."""
    from lcm.config import LcmConfig
    from lcm.engine import LcmEngine

    Store.open(db_url, upgrade=True)

    def factory(context_length: int = 3000, **overrides):
        config = LcmConfig.from_env({}, database_url=db_url, **{**SMALL_ENGINE, **overrides})
        engine = LcmEngine(config)
        engine.update_model("test-model", context_length)
        return engine

    return factory


@pytest.fixture
def lcm(capsys, monkeypatch):
    """Run ``lcm ARGS`` in-process through its entry point: (exit code, stdout, stderr)."""
    from lcm.cli import main

    monkeypatch.delenv("LCM_DATABASE_URL", raising=False)
    monkeypatch.delenv("LCM_AGENT_ID", raising=False)

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run
