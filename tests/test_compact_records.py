"""python -m stackft_jax.experiments.compact_records: an older grid folder's prediction files made compact,
record for record, nothing else touched; run again, nothing changes."""

import gzip
import json

import pytest

from stackft_jax.experiments import compact_records
from stackft_jax.training import prediction_files

RECORDS = [
    {"key": f"{i}-{i:08x}", "prediction": i % 2, "label": 1, "probabilities": [0.25 + i / 8, 0.75 - i / 8]}
    for i in range(4)
]


def _old_grid(root):
    """A grid folder as grids wrote it before: two runs and an ensemble with .jsonl.gz predictions."""
    for folder in ("runs/a-seed0", "runs/a-seed1", "ensembles/e-seed0"):
        for split in ("dev", "test"):
            records = (
                [{**r, "prediction": 1 - r["prediction"]} for r in RECORDS] if "seed1" in folder else RECORDS
            )
            prediction_files.write(root / folder / "predictions" / f"{split}.jsonl.gz", records)
        (root / folder / "results.json").write_text("{}\n")
    (root / "examples").mkdir()
    (root / "examples" / "dev-0000000000000000.npz").write_bytes(b"left by a run retrained since")
    return root


def test_an_old_grid_is_made_compact_and_reads_the_same(tmp_path, capsys):
    grid = _old_grid(tmp_path / "grid")
    before = {
        f.relative_to(grid): [json.loads(line) for line in gzip.open(f, "rt")]
        for f in sorted(grid.rglob("*.jsonl.gz"))
    }
    compact_records.main([str(grid)])
    out = capsys.readouterr().out
    assert (
        "6 prediction files made compact in 3 runs and ensembles, 2 examples files (1 unused removed)" in out
    )
    assert not list(grid.rglob("*.jsonl.gz")) and (grid / "runs/a-seed0/results.json").read_text() == "{}\n"
    for old, records in before.items():
        compact = grid / str(old).replace(".jsonl.gz", ".npz")
        assert list(prediction_files.read(compact).values()) == records
    assert sorted(f.name.split("-")[0] for f in (grid / "examples").iterdir()) == ["dev", "test"]
    files = {f: f.read_bytes() for f in sorted(grid.rglob("*")) if f.is_file()}
    compact_records.main([str(grid)])  # again: nothing to do
    assert "0 prediction files made compact" in capsys.readouterr().out
    assert {f: f.read_bytes() for f in sorted(grid.rglob("*")) if f.is_file()} == files


def test_a_folder_that_is_no_grid_or_a_broken_file_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        compact_records.main([str(tmp_path)])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path}: not a grid folder (it has no runs/ folder)"
    grid = _old_grid(tmp_path / "grid")
    (grid / "runs/a-seed0/predictions/dev.jsonl.gz").write_bytes(gzip.compress(b'{"label": 1}\n'))
    with pytest.raises(SystemExit) as stop:
        compact_records.main([str(grid)])
    assert stop.value.code == 1
    assert capsys.readouterr().err.strip().endswith("dev.jsonl.gz:1: record has no `key`")
