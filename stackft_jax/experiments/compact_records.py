"""Makes a grid folder's prediction files compact, for grids written before a grid kept them so.

    python -m stackft_jax.experiments.compact_records docs/grids/paper_qqp_test [more grid folders]

Each run's and ensemble's predictions/<split>.jsonl(.gz) becomes <split>.npz, the keys and labels going
once into GRID/examples/ (training/compact_predictions.py: lossless, records read back value for value),
and examples files no prediction file names any more are removed. A grid now writes its runs compact
itself (grid.run_grid, grid_report's ensembles); running this again changes nothing. It touches only the
prediction files: results.json, metrics.jsonl, config.json and the report stay as they are.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from stackft_jax.experiments.grid import EXAMPLES
from stackft_jax.runtime import cli_errors
from stackft_jax.training import compact_predictions, prediction_files

# The folders of a grid whose subfolders have predictions/ (runs, and the ensembles its report built).
RECORD_FOLDERS = ("runs", "ensembles")


def _prediction_bytes(grid: Path) -> int:
    files = [f for kind in RECORD_FOLDERS for f in (grid / kind).glob("*/predictions/*") if f.is_file()]
    return sum(f.stat().st_size for f in [*files, *(grid / EXAMPLES).glob("*")])


def compact_grid(grid: str | Path) -> dict[str, int]:
    """Every run's and ensemble's predictions in GRID made compact against GRID/examples/, unreferenced
    examples files removed; returns the counts and the prediction bytes before and after."""
    grid = Path(grid)
    if not (grid / "runs").is_dir():
        raise cli_errors.UsageError(f"{grid}: not a grid folder (it has no runs/ folder)")
    before = _prediction_bytes(grid)
    folders = sorted(
        d for kind in RECORD_FOLDERS for d in (grid / kind).glob("*") if (d / "predictions").is_dir()
    )
    written = referenced = 0
    used = set()
    for folder in folders:
        try:
            written += len(prediction_files.compact(folder, grid / EXAMPLES))
        except ValueError as error:  # a broken prediction file: its message names it and the record
            raise cli_errors.DataError(str(error)) from None
        for file in (folder / "predictions").glob(f"*{prediction_files.COMPACT}"):
            used.add(compact_predictions.examples_file(file).resolve())
            referenced += 1
    removed = [f for f in (grid / EXAMPLES).glob("*") if f.resolve() not in used]
    for file in removed:
        file.unlink()
    return {"folders": len(folders), "files_written": written, "compact_files": referenced,
            "examples_files": len(used), "examples_removed": len(removed), "bytes_before": before,
            "bytes_after": _prediction_bytes(grid)}  # fmt: skip


@cli_errors.guarded  # a user's mistake: one line and its exit status (cli_errors.py)
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m stackft_jax.experiments.compact_records", description=__doc__.splitlines()[0]
    )
    parser.add_argument("grids", nargs="+", help="grid folders (each with runs/)")
    args = parser.parse_args(argv)
    for grid in args.grids:
        done = compact_grid(grid)
        print(
            f"{grid}: {done['files_written']} prediction files made compact in {done['folders']} runs and "
            f"ensembles, {done['examples_files']} examples files ({done['examples_removed']} unused "
            "removed); "
            f"prediction files {done['bytes_before'] / 1e6:.2f} MB -> {done['bytes_after'] / 1e6:.2f} MB"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
