"""experiments/redecode.py: runs rescored under IOB2-constrained decoding, paired with their own scores."""

import subprocess
import sys
from pathlib import Path

import pytest
import scipy.stats

from stackft_jax.experiments import redecode

REPO = Path(__file__).resolve().parent.parent


def _row(trained: float, iob2: float) -> dict:
    return {"trained": {"f1": trained, "strict_f1": trained + 0.01}, "iob2": {"f1": iob2, "strict_f1": iob2}}


def test_cells_pair_each_run_with_itself_by_seed():
    rows = {
        "strategy=a-budget_steps=3-seed0": _row(0.70, 0.72),
        "strategy=a-budget_steps=3-seed1": _row(0.71, 0.74),
        "strategy=a-budget_steps=3-seed2": _row(0.69, 0.70),
        "strategy=b-budget_steps=3-seed0": _row(0.80, 0.80),
    }
    cells = redecode.cells(rows)
    assert set(cells) == {"strategy=a-budget_steps=3", "strategy=b-budget_steps=3"}
    f1 = cells["strategy=a-budget_steps=3"]["f1"]
    differences = [0.02, 0.03, 0.01]
    assert f1["difference"]["mean"] == pytest.approx(0.02)
    assert f1["difference"]["p_value"] == pytest.approx(scipy.stats.ttest_1samp(differences, 0).pvalue)
    assert f1["trained_mean"] == pytest.approx(0.70) and f1["iob2_mean"] == pytest.approx(0.72)
    assert cells["strategy=b-budget_steps=3"]["n"] == 1
    lines = redecode.table(cells)
    assert lines[2].startswith("| strategy=a-budget_steps=3 | 3 | 0.7000 -> 0.7200 | +2.00 [")
    assert (
        lines[3] == "| strategy=b-budget_steps=3 | 1 | 0.8000 -> 0.8000 | +0.00 | 0.8100 -> 0.8000 | -1.00 |"
    )


def test_a_glob_that_matches_no_run_is_one_line(tmp_path):
    cmd = [
        sys.executable, "-m", "stackft_jax.experiments.redecode", f"--runs={tmp_path}/none*",
        f"--input={tmp_path}/x", "--split=test", f"--out={tmp_path}/out.json",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [
        f"error: --runs='{tmp_path}/none*' matches no folder"
    ]
