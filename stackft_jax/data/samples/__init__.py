"""Small invented datasets shipped with the package, for the offline README demo.

`qqp_train.tsv` / `qqp_dev.tsv` (GLUE QQP layout, 400 / 100 pairs, 37% duplicates) are written by
`make_qqp_sample.py` in this folder; they are not Quora data.
"""

from pathlib import Path


def sample_path(name: str) -> Path:
    """Path of a shipped sample file, e.g. sample_path("qqp_train.tsv")."""
    path = Path(__file__).parent / name
    if not path.is_file():
        available = sorted(p.name for p in Path(__file__).parent.glob("*.tsv"))
        raise FileNotFoundError(f"no sample named {name!r}; available: {available}")
    return path
