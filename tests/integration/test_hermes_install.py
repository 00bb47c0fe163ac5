"""``lcm hermes install / uninstall`` on real Hermes homes (files on disk, the real entry point)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lcm.hermes.install import plugin_source

CONFIG = """\
# my Hermes settings: comments must survive lcm's edits
model:
  default: some-model   # the model I like
  context_length: 128000
plugins:
  enabled:
    - disk-cleanup
    - hermes-lcm
context:
  engine: compressor
"""


@pytest.fixture
def home(tmp_path) -> Path:
    home = tmp_path / "hermes"
    (home / "plugins" / "hermes-lcm").mkdir(parents=True)
    (home / "plugins" / "hermes-lcm" / "__init__.py").write_text(
        "def register(ctx):\n    ctx.register_context_engine(object())\n", encoding="utf-8")
    (home / "config.yaml").write_text(CONFIG, encoding="utf-8")
    return home


def installed(lcm, home: Path, *extra: str) -> dict:
    code, out, err = lcm("hermes", "install", "--hermes-home", str(home), "--json", *extra)
    assert code == 0, err
    return json.loads(out)


def test_install_enables_lcm_keeps_comments_and_is_idempotent(lcm, home):
    report = installed(lcm, home)
    text = (home / "config.yaml").read_text(encoding="utf-8")
    assert "# my Hermes settings" in text and "# the model I like" in text
    assert "engine: lcm" in text and "- lcm" in text and "- disk-cleanup" in text
    assert "- hermes-lcm" not in text  # its engine is also named lcm and would win the race
    assert any("hermes-lcm" in c for c in report["changes"])
    for name in ("plugin.yaml", "__init__.py"):
        assert (home / "plugins" / "lcm" / name).read_bytes() == (plugin_source() / name).read_bytes()
    [backup] = report["backups"]
    assert Path(backup).read_text(encoding="utf-8") == CONFIG
    assert report["database"] == str(home / "lcm.db") and report["changed"]
    again = installed(lcm, home)
    assert again["changed"] is False and again["backups"] == []
    assert (home / "config.yaml").read_text(encoding="utf-8") == text
    code, out, _ = lcm("hermes", "install", "--hermes-home", str(home))
    assert code == 0 and "already installed" in out


def test_uninstall_restores_what_install_replaced(lcm, home):
    installed(lcm, home)
    code, out, err = lcm("hermes", "uninstall", "--hermes-home", str(home), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert not (home / "plugins" / "lcm").exists()
    text = (home / "config.yaml").read_text(encoding="utf-8")
    assert "engine: compressor" in text and "- hermes-lcm" in text and "- lcm\n" not in text
    assert "# the model I like" in text and report["backups"] == []  # the one from install is the user's
    assert json.loads(lcm("hermes", "uninstall", "--hermes-home", str(home), "--json")[1])["changed"] is False
    installed(lcm, home)  # again and again: still one backup, the user's own config
    lcm("hermes", "uninstall", "--hermes-home", str(home))
    [kept] = home.glob("config.yaml.bak-lcm-*")
    assert kept.read_text(encoding="utf-8") == CONFIG


def test_a_home_without_an_engine_gets_its_default_back(lcm, tmp_path):
    home = tmp_path / "fresh"
    home.mkdir()
    installed(lcm, home)
    assert "engine: lcm" in (home / "config.yaml").read_text(encoding="utf-8")
    lcm("hermes", "uninstall", "--hermes-home", str(home))
    assert "engine" not in (home / "config.yaml").read_text(encoding="utf-8")


def test_database_url_goes_to_the_home_env_and_is_created(lcm, home, tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    (home / ".env").write_text("OPENAI_API_KEY=sk-keep-me\nLCM_DATABASE_URL=sqlite:////old.db\n", encoding="utf-8")
    report = installed(lcm, home, "--database-url", url)
    env = (home / ".env").read_text(encoding="utf-8").splitlines()
    assert env == ["OPENAI_API_KEY=sk-keep-me", f"LCM_DATABASE_URL={url}"]
    assert (tmp_path / "shared.db").exists() and report["database"] == str(tmp_path / "shared.db")
    assert any(".env.bak-lcm" in b for b in report["backups"])


def test_profiles_live_under_the_hermes_root(lcm, tmp_path, monkeypatch):
    root = tmp_path / "dot-hermes"
    (root / "profiles" / "work").mkdir(parents=True)
    monkeypatch.setenv("HERMES_HOME", str(root))
    code, out, err = lcm("hermes", "install", "--profile", "work", "--json")
    assert code == 0, err
    assert json.loads(out)["plugin_dir"] == str(root / "profiles" / "work" / "plugins" / "lcm")


@pytest.mark.parametrize("setup,fragment", [
    (lambda h: None, "no Hermes home"),
    (lambda h: (h.mkdir(), (h / "config.yaml").write_text("model: [unclosed\n")), "not valid YAML"),
    (lambda h: (h.mkdir(), (h / "config.yaml").write_text("- a list\n")), "mapping"),
    (lambda h: (h.mkdir(), (h / "plugins" / "lcm").mkdir(parents=True),
                (h / "plugins" / "lcm" / "plugin.yaml").write_text("name: someone-else\n")), "another plugin"),
])
def test_bad_homes_are_refused_and_left_alone(lcm, tmp_path, setup, fragment):
    home = tmp_path / "h"
    setup(home)
    before = (home / "config.yaml").read_text() if (home / "config.yaml").exists() else None
    code, out, err = lcm("hermes", "install", "--hermes-home", str(home))
    assert code == 1 and fragment in err and len(err.strip().splitlines()) == 1
    after = (home / "config.yaml").read_text() if (home / "config.yaml").exists() else None
    assert after == before
