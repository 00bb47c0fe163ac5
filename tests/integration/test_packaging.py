"""The wheel alone (no checkout) can create and upgrade a database: migrations ship inside it."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from lcm.store import migrations
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv, outside the checkout, with only the built wheel installed."""
    work = tmp_path_factory.mktemp("wheel")
    dist = work / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist),
                            str(REPO_ROOT)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    [wheel] = dist.glob("lossless_context-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "lcm/_migrations/env.py" in names and "lcm/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names  # the license ships
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT" in metadata and "Provides-Extra: postgres" in metadata
    assert "Provides-Extra: semantic" in metadata and "Requires-Dist: psycopg" not in metadata.split(
        "Provides-Extra")[0]  # psycopg only with an extra
    for rev in migrations.KNOWN_REVISIONS:
        assert f"lcm/_migrations/versions/{rev}.py" in names
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)],
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr
    return venv


def run(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_installed_lcm_creates_and_upgrades_sqlite(installed, tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    up = run(installed, "lcm", "db", "upgrade", "--url", url, cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    assert migrations.HEAD in up.stdout
    cur = run(installed, "lcm", "db", "current", "--url", url, "--json", cwd=tmp_path)
    assert '"status": "current"' in cur.stdout, cur.stdout + cur.stderr
    where = run(installed, "python", "-c",
                "import lcm.store.migrations as m; print(m.script_location())", cwd=tmp_path)
    assert "site-packages/lcm/_migrations" in where.stdout
    use = run(installed, "python", "-c",
              "from lcm.store import Store; from lcm.prepare import prepare_messages; "
              "from lcm.tokens import TokenCounter; s = Store.open(%r); "
              "x = s.sessions.get_or_create('a', 'b'); "
              "s.messages.append(x.id, prepare_messages([{'role': 'user', 'content': 'wheel works'}], "
              "TokenCounter())); "
              "print(s.search.messages('wheel', agent='a').hits[0].snippet)" % url, cwd=tmp_path)
    assert use.stdout.strip() == "**wheel** works", use.stderr


@pytest.mark.postgres
def test_installed_lcm_upgrades_postgres(installed, pg_url, tmp_path):
    """psycopg is the postgres extra: without it a PostgreSQL URL says so; with it, it works."""
    if run(installed, "python", "-c", "import psycopg", cwd=tmp_path).returncode != 0:
        bare = run(installed, "lcm", "db", "current", "--url", pg_url, cwd=tmp_path)
        # The error names a command that works (lossless-context is not on PyPI yet): the wheel
        # with the extra. Run exactly that, where the wheel is.
        told = re.search(r"pip install '(lossless_context-[^']+\.whl\[postgres\])'", bare.stderr)
        assert bare.returncode == 1 and told, bare.stderr
        extra = subprocess.run([str(installed / "bin" / "pip"), "install", "-q", told.group(1)],
                               cwd=installed.parent / "dist", capture_output=True, text=True, timeout=900)
        assert extra.returncode == 0, extra.stderr
    up = run(installed, "lcm", "db", "upgrade", "--url", pg_url, cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    status = run(installed, "lcm", "doctor", "--url", pg_url, "--json", cwd=tmp_path)
    assert status.returncode == 0 and '"overall": "healthy"' in status.stdout, status.stdout + status.stderr


def test_importing_the_engine_loads_no_database_or_model_library(installed, tmp_path):
    """Hermes imports engines just to list them: ``import lcm.engine`` stays light (SQLAlchemy,
    numpy and the tokenizer load when a store or a count is first needed)."""
    probe = run(installed, "python", "-c", "import sys, lcm.engine; "
                "print(sorted(m for m in ('sqlalchemy', 'numpy', 'tiktoken', 'httpx', 'rich', 'click') "
                "if m in sys.modules))", cwd=tmp_path)
    assert probe.returncode == 0 and probe.stdout.strip() == "[]", probe.stdout + probe.stderr


def test_installed_lcm_runs_the_demo(installed, tmp_path):
    """The README's first command, from the wheel alone: the transcript ships inside it."""
    demo = run(installed, "lcm", "demo", "--url", f"sqlite:///{tmp_path / 'demo.db'}", cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    assert "byte-exact: yes" in demo.stdout and "7719-0424" in demo.stdout
