"""``lcm hermes install / uninstall``: put lcm into a Hermes home, or take it out again.

Install puts the plugin (``hermes_plugin/`` of this package) into ``<home>/plugins/lcm/``, adds
``lcm`` to ``plugins.enabled`` and sets ``context.engine: lcm`` in ``<home>/config.yaml``. It
backs the file up before changing it, changes nothing when everything is already in place
(idempotent), and records what it replaced (the previous engine, other context-engine plugins
it had to disable — hermes-lcm's engine is also named ``lcm`` and would win the registration
race) in ``<home>/plugins/lcm/install-state.json``, so ``uninstall`` restores exactly that.
The YAML is edited round-trip (comments and key order kept).
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from lcm.config import database_url_from_env, hermes_home_from_env, install_command
from lcm.errors import ConfigError, first_line
from lcm.files import write_atomic
from lcm.store import Store
from lcm.store.connection import display_url, resolve_url

log = logging.getLogger("lcm")

PLUGIN_NAME = "lcm"
STATE_FILE = "install-state.json"
PLUGIN_FILES = ("plugin.yaml", "__init__.py")


def default_home(profile: str | None = None) -> Path:
    """The Hermes home to install into: $HERMES_HOME, else ``~/.hermes`` (or its profile)."""
    base = hermes_home_from_env() or Path.home() / ".hermes"
    if profile:
        root = base.parent.parent if base.parent.name == "profiles" else base
        return root / "profiles" / profile
    return base


def plugin_source() -> Path:
    """The plugin files: shipped inside the wheel, or ``hermes_plugin/`` of a checkout."""
    package = Path(__file__).resolve().parent.parent  # lcm/
    packaged = package / "_hermes_plugin"
    if (packaged / "__init__.py").is_file():
        return packaged
    checkout = package.parent / "hermes_plugin"
    if (checkout / "__init__.py").is_file():
        return checkout
    raise ConfigError("lcm's Hermes plugin files are missing from this installation; reinstall lossless-context")


@dataclass
class SetupReport:
    home: Path
    plugin_dir: Path
    config: Path
    changes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    backups: list[str] = field(default_factory=list)
    database: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"hermes_home": str(self.home), "plugin_dir": str(self.plugin_dir), "config": str(self.config),
                "changed": bool(self.changes), "changes": self.changes, "warnings": self.warnings,
                "backups": self.backups, "database": self.database}


def _yaml() -> YAML:
    """Round-trip YAML: comments, quotes and key order survive lcm's edit."""
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    return yaml


def _load_config(path: Path) -> Any:
    if not path.exists():
        return CommentedMap()
    try:
        data = _yaml().load(path.read_text(encoding="utf-8"))
    except Exception as exc:
        raise ConfigError(f"{path} is not valid YAML ({first_line(exc)}); fix it first, "
                          "lcm did not change it") from exc
    if data is None:
        return CommentedMap()
    if not isinstance(data, dict):
        raise ConfigError(f"{path} does not hold a mapping at the top; lcm did not change it")
    return data


def _write_atomic(path: Path, text: str) -> None:
    """A Hermes file rewritten in one step; a new one is owner-only when it may hold a secret
    (``.env``: a database URL with its password, Hermes' own API keys)."""
    write_atomic(path, text, private=path.name == ".env")


def _dump(data: Any) -> str:
    out = io.StringIO()
    _yaml().dump(data, out)
    return out.getvalue()


def _backup(path: Path, report: SetupReport) -> None:
    """A copy of ``path`` as it was before lcm first changed it (one: the user's own version;
    later installs and uninstalls change only what lcm wrote). It keeps the file's mode."""
    if path.exists() and not any(path.parent.glob(f"{path.name}.bak-lcm-*")):
        target = path.with_name(f"{path.name}.bak-lcm-{time.strftime('%Y%m%d-%H%M%S')}")
        n = 1
        while target.exists():
            n += 1
            target = path.with_name(f"{path.name}.bak-lcm-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
        shutil.copy2(path, target)
        report.backups.append(str(target))


def _section(data: Any, key: str) -> Any:
    value = data.get(key)
    if not isinstance(value, dict):
        value = CommentedMap()
        data[key] = value
    return value


def _rival_engine_plugins(home: Path) -> set[str]:
    """Other user plugins that register a context engine (hermes-lcm's is also named lcm)."""
    rivals = set()
    plugins = home / "plugins"
    if plugins.is_dir():
        for child in plugins.iterdir():
            init = child / "__init__.py"
            if child.name != PLUGIN_NAME and init.is_file():
                try:
                    if "register_context_engine" in init.read_text(encoding="utf-8", errors="replace"):
                        rivals.add(child.name)
                except OSError:
                    continue
    return rivals


def _database_for(home: Path) -> str:
    env_file = home / ".env"
    if env_file.is_file():
        for line in env_file.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.strip().startswith("LCM_DATABASE_URL="):
                return display_url(resolve_url(line.split("=", 1)[1].strip().strip("'\"")))
    if database_url_from_env():
        return display_url(resolve_url(None)) + " (from LCM_DATABASE_URL in this shell: set it for Hermes too)"
    return str(home / "lcm.db")


def _set_env_line(home: Path, key: str, value: str, report: SetupReport) -> None:
    path = home / ".env"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    new = f"{key}={value}"
    kept = [line for line in lines if not line.strip().startswith(f"{key}=")]
    if new in lines and len(kept) == len(lines) - 1:
        return
    _backup(path, report)
    _write_atomic(path, "\n".join([*kept, new]) + "\n")
    report.changes.append(f"set {key} in {path}")


def _remove_env_line(home: Path, key: str, value: str, report: SetupReport) -> None:
    """Take out the ``key=value`` line lcm wrote (a password must not outlive lcm's use of it);
    a line the user changed since is theirs and stays."""
    path = home / ".env"
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if line.strip() != f"{key}={value}"]
    if len(kept) != len(lines):
        _write_atomic(path, "".join(f"{line}\n" for line in kept))
        report.changes.append(f"removed {key} from {path}")


def _hermes_importable() -> bool:
    try:
        import agent.context_engine  # type: ignore[import-not-found]  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


def install(home: Path, *, database_url: str | None = None) -> SetupReport:
    """Put lcm into the Hermes home (see the module docstring); idempotent."""
    home = home.expanduser()
    if not home.is_dir():
        raise ConfigError(f"no Hermes home at {home} (run hermes once to create it, or pass --hermes-home)")
    plugin_dir = home / "plugins" / PLUGIN_NAME
    report = SetupReport(home, plugin_dir, home / "config.yaml")
    manifest = plugin_dir / "plugin.yaml"
    if plugin_dir.exists() and manifest.is_file() and "name: lcm" not in manifest.read_text(encoding="utf-8"):
        raise ConfigError(f"{plugin_dir} holds another plugin; move it away first")
    _install_plugin_files(plugin_dir, report)
    _enable_in_config(home, plugin_dir / STATE_FILE, report)
    _prepare_database(home, database_url, report)
    if not _hermes_importable():
        report.warnings.append(
            f"Hermes is not importable from this Python ({sys.executable}): lcm must be installed "
            "into the environment that runs hermes, or the plugin cannot load "
            f"(<hermes python> -m {install_command()}, then run lcm hermes install from there)")
    return report


def _install_plugin_files(plugin_dir: Path, report: SetupReport) -> None:
    """The plugin's files in ``<home>/plugins/lcm/`` (rewritten only when they differ)."""
    source = plugin_source()
    plugin_dir.mkdir(parents=True, exist_ok=True)
    for name in PLUGIN_FILES:
        src, dst = source / name, plugin_dir / name
        if not dst.is_file() or dst.read_bytes() != src.read_bytes():
            shutil.copyfile(src, dst)
            report.changes.append(f"wrote {dst}")


def _enable_in_config(home: Path, state_path: Path, report: SetupReport) -> None:
    """config.yaml: enable the plugin, select the engine, disable rival engine plugins; what
    was replaced is recorded in the install state for ``uninstall``."""
    state = json.loads(state_path.read_text(encoding="utf-8")) if state_path.is_file() else {}
    config = _load_config(report.config)
    before = _dump(config)
    plugins = _section(config, "plugins")
    enabled = plugins.get("enabled")
    if not isinstance(enabled, list):
        enabled = CommentedSeq()
        plugins["enabled"] = enabled
    rivals = sorted(r for r in _rival_engine_plugins(home) if r in enabled)
    for rival in rivals:
        enabled.remove(rival)
        report.changes.append(f"disabled plugin {rival!r} (it also registers a context engine; "
                              "lcm hermes uninstall re-enables it)")
    if PLUGIN_NAME not in enabled:
        enabled.append(PLUGIN_NAME)
        report.changes.append("added lcm to plugins.enabled")
    context = _section(config, "context")
    previous = context.get("engine")
    if previous != PLUGIN_NAME:
        context["engine"] = PLUGIN_NAME
        report.changes.append(f"set context.engine: lcm (was {previous or 'compressor (default)'})")
        state.setdefault("previous_engine", previous)
    state["disabled_plugins"] = sorted(set(state.get("disabled_plugins", [])) | set(rivals))
    if _dump(config) != before:
        _backup(report.config, report)
        _write_atomic(report.config, _dump(config))
    _write_atomic(state_path, json.dumps(state, indent=2) + "\n")


def _prepare_database(home: Path, database_url: str | None, report: SetupReport) -> None:
    """A given database is created or upgraded now (an operator's step) and written to the
    home's .env; otherwise the report names the one Hermes will use."""
    if database_url:
        Store.open(database_url, upgrade=True)
        _set_env_line(home, "LCM_DATABASE_URL", database_url, report)
        state_path = home / "plugins" / PLUGIN_NAME / STATE_FILE
        state = json.loads(state_path.read_text(encoding="utf-8")) if state_path.is_file() else {}
        state["env_database_url"] = database_url  # what uninstall takes out again
        _write_atomic(state_path, json.dumps(state, indent=2) + "\n")
        report.database = display_url(resolve_url(database_url))
    else:
        report.database = _database_for(home)


def uninstall(home: Path) -> SetupReport:
    home = home.expanduser()
    plugin_dir = home / "plugins" / PLUGIN_NAME
    report = SetupReport(home, plugin_dir, home / "config.yaml")
    state_path = plugin_dir / STATE_FILE
    state = json.loads(state_path.read_text(encoding="utf-8")) if state_path.is_file() else {}
    if report.config.exists():
        config = _load_config(report.config)
        before = _dump(config)
        plugins = config.get("plugins")
        enabled = plugins.get("enabled") if isinstance(plugins, dict) else None
        if isinstance(enabled, list):
            if PLUGIN_NAME in enabled:
                enabled.remove(PLUGIN_NAME)
                report.changes.append("removed lcm from plugins.enabled")
            for rival in state.get("disabled_plugins", []):
                if rival not in enabled and (home / "plugins" / rival).is_dir():
                    enabled.append(rival)
                    report.changes.append(f"re-enabled plugin {rival!r}")
        context = config.get("context")
        if isinstance(context, dict) and context.get("engine") == PLUGIN_NAME:
            previous = state.get("previous_engine")
            if previous:
                context["engine"] = previous
                report.changes.append(f"restored context.engine: {previous}")
            else:
                del context["engine"]
                report.changes.append("removed context.engine (Hermes' built-in compressor again)")
        for key, inner in (("plugins", "enabled"), ("context", None)):  # sections left empty by lcm
            section = config.get(key)
            if isinstance(section, dict) and inner and section.get(inner) == []:
                del section[inner]
            if isinstance(section, dict) and not section:
                del config[key]
        if _dump(config) != before:
            _backup(report.config, report)
            _write_atomic(report.config, _dump(config))
    if state.get("env_database_url"):
        _remove_env_line(home, "LCM_DATABASE_URL", state["env_database_url"], report)
    if plugin_dir.exists():
        shutil.rmtree(plugin_dir)
        report.changes.append(f"removed {plugin_dir}")
    report.database = _database_for(home)
    return report
