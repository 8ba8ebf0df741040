"""The `catengine` command: one module per subcommand under catengine/cli/, each imported only when it runs."""
import importlib
import subprocess
import sys

import pytest

from catengine.cli import SUBCOMMANDS, main


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_module_has_its_two_functions(name):
    module_name, _ = SUBCOMMANDS[name]
    assert module_name == f"catengine.cli.{name}"
    module = importlib.import_module(module_name)
    assert callable(module.add_arguments) and callable(module.run)


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in SUBCOMMANDS)


def test_python_dash_m_runs_the_same_command():
    done = subprocess.run([sys.executable, "-m", "catengine.cli", "quantize", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "--group-size" in done.stdout
