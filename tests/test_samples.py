"""The shipped demo samples are what tools/samples/ writes: regenerating them changes no byte."""

import subprocess
import sys
from pathlib import Path

import pytest

from stackft_jax.data.samples import sample_path

REPO = Path(__file__).resolve().parent.parent
FILES = {
    "qqp": ("qqp_train.tsv", "qqp_dev.tsv"),
    "conll": ("conll_train.txt", "conll_dev.txt"),
    "yahoo": ("yahoo_train.csv", "yahoo_dev.csv"),
}


@pytest.mark.parametrize("task", FILES)
def test_the_generator_reproduces_the_shipped_sample(task, tmp_path):
    script = REPO / "tools" / "samples" / f"make_{task}_sample.py"
    proc = subprocess.run(
        [sys.executable, str(script), f"--out_dir={tmp_path}"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    for name in FILES[task]:
        assert (tmp_path / name).read_bytes() == sample_path(name).read_bytes(), name
