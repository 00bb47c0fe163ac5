"""The code gates, as tests so that the one test command runs them: the layering (the
import-linter contracts in pyproject.toml, docs/architecture.md), ruff, and mypy --strict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("command", [["lint-imports"], ["ruff", "check", "."], ["mypy"]],
                         ids=["layering", "ruff", "mypy-strict"])
def test_the_code_passes_its_gate(command):
    tool = BIN / command[0]
    if not tool.exists():
        pytest.fail(f"{command[0]} is not installed next to {sys.executable}: pip install -e '.[dev]'")
    done = subprocess.run([str(tool), *command[1:]], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
