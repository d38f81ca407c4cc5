"""The package's layout as a newcomer meets it: the commands at the root, layers as folders, the import
contracts of pyproject.toml ([tool.importlinter]) kept, and a planted upward import caught."""

import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "stackft_jax"
COMMANDS = {"main", "experiment", "predict", "export", "ensemble"}


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([lint, "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_package_root_holds_the_commands_only():
    assert {p.stem for p in PACKAGE.glob("*.py")} == COMMANDS | {"__init__"}


def test_no_two_modules_share_a_name():
    names = Counter(p.stem for p in PACKAGE.rglob("*.py") if p.stem != "__init__")
    assert [name for name, n in names.items() if n > 1] == []


def test_import_contracts_hold():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    "module, planted, broken",
    [
        # runtime/ is the bottom layer: importing the training layer from it is an upward import.
        ("runtime/sharding.py", "from stackft_jax.training import loop", "Layers"),
        # The grid report imports its figures; the figures importing the report back is a cycle.
        ("experiments/figures.py", "from stackft_jax.experiments import grid_report", "No import cycles"),
    ],
)
def test_a_planted_import_breaks_a_contract(tmp_path, module, planted, broken):
    shutil.copytree(PACKAGE, tmp_path / "stackft_jax", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "stackft_jax" / module
    target.write_text(target.read_text() + f"\n{planted}  # noqa\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert f"{broken}" in result.stdout and "BROKEN" in result.stdout
