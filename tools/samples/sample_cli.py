"""The command line the sample generators share: where to write (default: the package's samples folder)."""

import argparse
from pathlib import Path

SAMPLES_DIR = Path(__file__).resolve().parents[2] / "stackft_jax" / "data" / "samples"


def out_dir(description: str) -> Path:
    """Parses `--out_dir` (created if missing) for a generator described by `description`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out_dir", type=Path, default=SAMPLES_DIR)
    folder = parser.parse_args().out_dir
    folder.mkdir(parents=True, exist_ok=True)
    return folder
