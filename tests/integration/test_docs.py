"""The docs keep up with the code (after sqlite-utils' test_docs): every setting, agent tool and
tool argument, and every command of the command line is documented, the public contract
(docs/contract.md) lists nothing as available that does not exist, and nothing in the project
points outside it."""

from __future__ import annotations

import re
from dataclasses import fields

import click
import pytest

from lcm.cli import cli
from lcm.config import PROCESS_VARIABLES, LcmConfig
from lcm.tools.specs import SPECS
from tests.conftest import REPO_ROOT

DOCS = REPO_ROOT / "docs"
CONTRACT = (DOCS / "contract.md").read_text(encoding="utf-8")
AVAILABLE = CONTRACT.split("## Planned", 1)[0]  # what the contract says exists today
SETTINGS = [f.metadata["env"] for f in fields(LcmConfig)]


def _commands(group: click.Group, prefix: str = "lcm") -> list[str]:
    """Every command path, through click's own listing (``lcm``'s commands load lazily)."""
    out = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        path = f"{prefix} {name}"
        out.extend(_commands(command, path) if isinstance(command, click.Group) else [path])
    return out


COMMANDS = _commands(cli)
assert len(COMMANDS) > 20, COMMANDS  # the listing itself works: every command is checked below


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


@pytest.mark.parametrize("variable", SETTINGS + list(PROCESS_VARIABLES))
def test_every_setting_is_in_the_contract(variable):
    assert f"`{variable}`" in _section(AVAILABLE, "## Settings"), f"{variable} is not in docs/contract.md"


def test_the_contract_lists_no_setting_that_does_not_exist():
    listed = set(re.findall(r"`(LCM_[A-Z_]+)`", _section(AVAILABLE, "## Settings")))
    assert listed <= set(SETTINGS) | set(PROCESS_VARIABLES), listed - set(SETTINGS) - set(PROCESS_VARIABLES)


@pytest.mark.parametrize("tool", list(SPECS))
def test_every_tool_and_argument_is_documented(tool):
    row = next((line for line in _section(AVAILABLE, "## Agent tools").splitlines()
                if line.startswith(f"| `{tool}` |")), None)
    assert row is not None, f"{tool} has no row in the contract's tool table"
    for arg in SPECS[tool][1]:
        assert f"`{arg.name}`" in row, f"{tool}'s argument {arg.name} is not in its contract row"
    assert f"### `{tool}(" in (DOCS / "tools.md").read_text(encoding="utf-8"), f"docs/tools.md has no {tool}"


def test_the_contract_lists_no_tool_that_does_not_exist():
    listed = set(re.findall(r"^\| `(lcm_[a-z_]+)` \|", _section(AVAILABLE, "## Agent tools"), re.M))
    assert listed == set(SPECS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_is_documented(command):
    assert f"`{command}" in (DOCS / "cli.md").read_text(encoding="utf-8"), f"docs/cli.md lacks {command}"
    assert f"`{command}" in _section(AVAILABLE, "## Command line"), f"docs/contract.md lacks {command}"


def test_the_contract_lists_no_command_that_does_not_exist():
    listed = set(re.findall(r"`(lcm [a-z][a-z -]*[a-z])`", _section(AVAILABLE, "## Command line")))
    assert {c for c in listed if not any(c == k or k.startswith(c + " ") for k in COMMANDS)} == set()


def test_the_readme_links_the_contract_and_the_architecture():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/contract.md" in readme and "docs/architecture.md" in readme


def test_nothing_points_outside_the_project():
    sources = [*REPO_ROOT.glob("*.md"), *DOCS.glob("*.md"), *REPO_ROOT.glob("lcm/**/*.py"),
               *REPO_ROOT.glob("tests/**/*.py"), *REPO_ROOT.glob("benchmarks/*.py"),
               *REPO_ROOT.glob("hermes_plugin/*"), *REPO_ROOT.glob("alembic/**/*.py")]
    outside = "/".join(["..", "shared"])  # spelled so that this file does not match itself
    offenders = [str(p.relative_to(REPO_ROOT)) for p in sources
                 if p.is_file() and outside in p.read_text(encoding="utf-8", errors="replace")]
    assert offenders == []
