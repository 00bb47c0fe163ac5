"""The command line loads a command's module only when that command runs (issue 31.4): what
``lcm --help`` lists is written beside the lazy registry, and must stay what each command says."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys

import click
import pytest

from lcm.cli import COMMANDS, cli
from tests.conftest import REPO_ROOT


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_listed_help_is_the_commands_own(name):
    command = cli.get_command(click.Context(cli), name)
    assert command is not None and command.name == name
    assert inspect.cleandoc(command.help or "").split("\n\n")[0].replace("\n", " ") == COMMANDS[name].summary


def test_every_command_module_is_registered():
    """A command added to a module of lcm.cli but not to the registry would never run."""
    import importlib
    import pkgutil

    import lcm.cli as package

    registered = {(lazy.module, lazy.attribute) for lazy in COMMANDS.values()}
    found = set()
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"lcm.cli.{info.name}")
        commands = {a: v for a, v in vars(module).items() if isinstance(v, click.Command)
                    and v.callback is not None and v.callback.__module__ == module.__name__}
        inside = {id(c) for g in commands.values() if isinstance(g, click.Group) for c in g.commands.values()}
        found |= {(module.__name__, a) for a, c in commands.items() if id(c) not in inside}
    assert found == registered


@pytest.mark.parametrize("argv", [["--version"], ["--help"]])
def test_version_and_help_load_no_command_and_no_database_layer(argv):
    probe = ("import sys; from lcm.cli import main\n"
             "try:\n    main(%r)\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.startswith(('sqlalchemy', 'rich', 'lcm.'))))" % argv)
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    loaded = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert not [m for m in loaded if m.startswith(("sqlalchemy", "rich"))], loaded
    assert [m for m in loaded if m.startswith("lcm.cli.")] == ["lcm.cli.guard"], loaded
