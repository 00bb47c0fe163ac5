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


#: The project's rule for a module's size (docs/architecture.md): split along a seam past it.
MAX_MODULE_LINES = 600


def test_no_module_is_over_the_size_rule():
    sizes = {str(p.relative_to(REPO_ROOT)): len(p.read_text(encoding="utf-8").splitlines())
             for p in (REPO_ROOT / "lcm").rglob("*.py")}
    assert len(sizes) > 50  # the walk found the package
    assert {p: n for p, n in sizes.items() if n > MAX_MODULE_LINES} == {}
