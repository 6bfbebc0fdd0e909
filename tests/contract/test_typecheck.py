"""The package stays mypy-clean under the [tool.mypy] settings in pyproject.toml, its core
modules under --strict, and it tells type checkers so (py.typed); the tree stays ruff-clean
under [tool.ruff]."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: mypy brings tomli, the same parser
    import tomli as tomllib

needs_mypy = pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                                reason="mypy is not installed (pip install -e '.[test]')")


@pytest.mark.slow  # mypy over the whole package: a minute without its cache
@needs_mypy
def test_mypy_clean():
    # from the repository root, so mypy reads pyproject.toml and checks files = ["benanza"]
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
@needs_mypy
def test_strict_modules_pass_mypy_strict():
    """The per-module flags in pyproject.toml stand for --strict: the listed modules pass it."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    (strict,) = [o for o in config["overrides"] if o.get("disallow_untyped_defs")]
    # a module, or a package's every module (`benanza.ops.*`: mypy checks the folder)
    files = [str(Path(*m.removesuffix(".*").split("."))) if m.endswith(".*")
             else str(Path(*m.split(".")).with_suffix(".py")) for m in strict["module"]]
    assert "benanza/records.py" in files and "benanza/processor.py" in files
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", *files], cwd=REPO,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_package_is_marked_typed():
    # hatch ships every file under benanza/ in the wheel, this marker included
    assert (REPO / "benanza" / "py.typed").is_file()


def test_ruff_clean():
    """The lint rules in pyproject.toml ([tool.ruff]: pyflakes, pycodestyle, isort, bugbear,
    pyupgrade) hold over the package, the tests, the benchmarks and the scripts."""
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "benanza", "tests", "benchmarks", "scripts"],
                          cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
