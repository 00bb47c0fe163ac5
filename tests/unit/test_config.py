"""Settings: every environment read lives in lcm.config, happens when the value is needed (never
at import time), and a bad value is an error that names the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from lcm import config
from lcm.errors import ConfigError


def test_a_bad_busy_timeout_is_refused_when_needed_not_at_import(monkeypatch):
    """It used to be parsed with a bare int() when the module was imported."""
    from lcm.backends import sqlite as sqlite_backend

    monkeypatch.setenv("LCM_SQLITE_BUSY_TIMEOUT_MS", "soon")
    with pytest.raises(ConfigError, match="LCM_SQLITE_BUSY_TIMEOUT_MS must be an integer"):
        sqlite_backend.SQLiteBackend()
    monkeypatch.setenv("LCM_SQLITE_BUSY_TIMEOUT_MS", "2500")
    assert sqlite_backend.SQLiteBackend().busy_timeout_ms == 2500


def test_process_settings_follow_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("LCM_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert config.cache_dir() == tmp_path / "xdg" / "lcm"
    monkeypatch.setenv("LCM_CACHE_DIR", str(tmp_path / "mine"))
    assert config.cache_dir() == tmp_path / "mine"
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes"))
    assert config.default_sqlite_path() == tmp_path / "hermes" / "lcm.db"
    monkeypatch.delenv("HERMES_HOME")
    assert config.default_sqlite_path() == Path.home() / ".lcm" / "lcm.db"
    monkeypatch.setenv("LCM_TOKENIZER_CACHE", "0")
    assert not config.tokenizer_cache_enabled()


def test_the_same_range_wording_for_settings_and_arguments(monkeypatch):
    monkeypatch.setenv("LCM_FRESH_TAIL_COUNT", "0")
    with pytest.raises(ValueError, match="LCM_FRESH_TAIL_COUNT must be at least 1, got 0"):
        config.LcmConfig.from_env()
    with pytest.raises(ValueError, match="limit must be between 1 and 10, got 11"):
        config.in_range("limit", 11, 1, 10)


def test_only_lcm_config_reads_the_environment():
    """The one place: any other module reading os.environ (the command line's LCM_DEBUG aside)
    is a setting lcm.config does not know about."""
    root = Path(config.__file__).parent
    readers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     if p.name != "config.py" and ("os.environ" in p.read_text() or "getenv" in p.read_text()))
    assert readers == ["cli/guard.py"]
