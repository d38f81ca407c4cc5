"""A fresh clone stays light (issue 45): what `git ls-files` holds, summed, is under the budget below, and
every committed grid keeps its predictions compact (training/compact_predictions.py), as grids now write
them; a grid from an older checkout is converted by `python -m stackft_jax.experiments.compact_records`."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The working tree of a fresh clone, in MB (10^6 bytes): the bound, with this round's grids in it.
BUDGET_MB = 40


def _tracked() -> list[Path]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing tracked to measure")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
    ).stdout.decode()
    return [REPO / name for name in listed.split("\0") if name]


def test_the_tracked_files_of_a_clone_fit_the_budget():
    sizes = {
        f: f.stat().st_size for f in _tracked() if f.is_file()
    }  # a file deleted but not yet staged: gone
    total = sum(sizes.values()) / 1e6
    largest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    assert total < BUDGET_MB, f"{total:.1f} MB tracked; the largest: " + ", ".join(
        f"{f.relative_to(REPO)} ({sizes[f] / 1e6:.2f} MB)" for f in largest
    )


def test_committed_grids_keep_their_predictions_compact():
    json_lines = [
        f for f in _tracked() if "predictions" in f.parts and f.name.endswith((".jsonl", ".jsonl.gz"))
    ]
    assert not [str(f.relative_to(REPO)) for f in json_lines if f.is_relative_to(REPO / "docs/grids")]
