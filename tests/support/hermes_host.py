"""The real Hermes host for end-to-end tests: a virtualenv with ``hermes-agent==0.19.0`` and this
checkout installed, a Hermes home configured by ``lcm hermes install``, and turns driven through
Hermes' own one-shot CLI (``hermes chat -q ... --resume ID``), one process per turn.

The venv is built once and reused (:func:`venv_dir`: the user's cache, or ``LCM_HERMES_VENV``;
the test run prints where); this checkout is installed into it in editable mode, so it always
runs the code under test.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import REPO_ROOT

HERMES_VERSION = "0.19.0"
CONTEXT_LENGTH = 64_000  # the smallest window Hermes 0.19 accepts


def venv_dir() -> Path:
    """``LCM_HERMES_VENV``, else a folder of the user's cache (``$XDG_CACHE_HOME`` or
    ``~/.cache``, under ``lcm-test/``), one per checkout: about 280 MB that does not belong in
    the source tree. (Not ``LCM_CACHE_DIR``: the test session points that at a temporary
    folder, and the venv must outlive the session.)"""
    explicit = os.environ.get("LCM_HERMES_VENV", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    root = Path(os.environ.get("XDG_CACHE_HOME", "").strip() or Path.home() / ".cache").expanduser()
    checkout = hashlib.sha256(str(REPO_ROOT).encode()).hexdigest()[:8]
    return root / "lcm-test" / f"hermes-venv-{HERMES_VERSION}-{checkout}"


def ensure_venv() -> tuple[Path | None, str]:
    """(venv, "") when Hermes and lcm are installed in it, else (None, why not). Several test
    processes (pytest-xdist) may ask at once: one builds, the others wait on a file lock."""
    import fcntl

    venv = venv_dir()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_venv(venv)


def _ensure_venv(venv: Path) -> tuple[Path | None, str]:
    python = venv / "bin" / "python"
    marker = venv / ".lcm-ready"
    if marker.is_file() and python.is_file():
        probe = subprocess.run([str(python), "-c", "import lcm, psycopg, agent.context_engine; print(lcm.__file__)"],
                               capture_output=True, text=True, timeout=120)
        if probe.returncode == 0 and str(REPO_ROOT) in probe.stdout:
            return venv, ""
    steps = [[sys.executable, "-m", "venv", "--clear", str(venv)],
             [str(python), "-m", "pip", "install", "-q", f"hermes-agent=={HERMES_VERSION}"],
             [str(python), "-m", "pip", "install", "-q", "-e", f"{REPO_ROOT}[postgres]"]]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            return None, f"could not build the Hermes test venv ({' '.join(step[:4])}...): {tail}"
    marker.write_text(HERMES_VERSION, encoding="utf-8")
    return venv, ""


@dataclass
class Turn:
    prompt: str
    session_id: str
    stdout: str
    stderr: str
    returncode: int


@dataclass
class HermesHome:
    """A Hermes home pointed at the scripted model, with lcm installed by its own CLI."""

    venv: Path
    home: Path
    model_url: str
    env: dict[str, str] = field(default_factory=dict)
    turns: list[Turn] = field(default_factory=list)

    def configure(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.yaml").write_text(textwrap.dedent(f"""\
            # written by the lcm end-to-end tests
            model:
              provider: custom
              base_url: {self.model_url}
              api_key: test-key
              default: scripted-model
              context_length: {CONTEXT_LENGTH}
            security:
              allow_lazy_installs: false
            """), encoding="utf-8")

    def process_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LCM_", "HERMES_", "OPENAI_"))}
        env.update({"HERMES_HOME": str(self.home), "NO_COLOR": "1"})
        env.update(self.env)
        return env

    def run(self, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
        exe = args[0]
        path = self.venv / "bin" / exe
        return subprocess.run([str(path), *args[1:]], capture_output=True, text=True, timeout=timeout,
                              env=self.process_env(), cwd=self.home)

    def install_lcm(self, *extra: str) -> dict[str, Any]:
        done = self.run("lcm", "hermes", "install", "--hermes-home", str(self.home), "--json", *extra)
        if done.returncode != 0:
            raise AssertionError(f"lcm hermes install failed: {done.stderr}")
        return json.loads(done.stdout)

    def chat(self, prompt: str, *, resume: str | None = None) -> Turn:
        args = ["hermes", "chat", "-q", prompt, "-Q"]
        if resume:
            args += ["--resume", resume]
        done = self.run(*args)
        found = re.findall(r"session_id:\s*(\S+)", done.stderr)
        turn = Turn(prompt, found[-1] if found else "", done.stdout, done.stderr, done.returncode)
        self.turns.append(turn)
        return turn

    def python(self, code: str) -> subprocess.CompletedProcess:
        return self.run("python", "-c", code)
