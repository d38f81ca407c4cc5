"""The committed grid reports (docs/grids/) are what their per-run files say: each report's statistics
are recomputed from the committed results, predictions and configs alone, and must match to the digit."""

import shutil
from pathlib import Path

import pytest

from stackft_jax.config import config_cli
from stackft_jax.experiments import grid_report

REPO = Path(__file__).resolve().parent.parent

# The committed grid folder and the grid config (with preset) that wrote its report.
COMMITTED = {
    "docs/grids/paper_qqp_short": "configs/experiments/paper_qqp.py:short",
    "docs/grids/paper_qqp_small": "configs/experiments/paper_qqp.py:small",
    "docs/grids/phase1_dropout_small": "configs/experiments/phase1_dropout.py:small",
    "docs/grids/paper_conll_small": "configs/experiments/paper_conll.py:small",
    "docs/grids/paper_yahoo_small": "configs/experiments/paper_yahoo.py:small",
    "docs/grids/pilot_qqp": "configs/experiments/pilot.py:qqp",
    "docs/grids/pilot_conll": "configs/experiments/pilot.py:conll",
    "docs/grids/pilot_yahoo": "configs/experiments/pilot.py:yahoo",
}
# What a grid folder holds besides the committed files (.gitignore): never read by a report.
NOT_COMMITTED = ("checkpoints", "tensorboard", "locks", "feature_cache")


@pytest.mark.slow
@pytest.mark.parametrize("folder", sorted(COMMITTED))
def test_a_committed_report_is_recomputed_from_its_per_run_files(folder, tmp_path):
    committed = REPO / folder
    if not (committed / "report.json").exists():
        pytest.fail(f"{folder}/report.json is not committed: remove the grid from COMMITTED or run it")
    copy = tmp_path / "grid"
    shutil.copytree(committed, copy, ignore=shutil.ignore_patterns(*NOT_COMMITTED, "report.*", "figures"))
    grid = config_cli.load(COMMITTED[folder], [], kind="grid")
    grid_report.write_report(grid, copy)
    for name in ("report.json", "report.md"):
        assert (copy / name).read_text() == (committed / name).read_text(), name
