"""Small invented datasets shipped with the package, for the offline README demo.

`qqp_train.tsv` / `qqp_dev.tsv` (GLUE QQP layout, 400 / 100 pairs, 37% duplicates) are invented, not
Quora data; `conll_train.txt` / `conll_dev.txt` (CoNLL-2003 layout, IOB1 tags, 402 / 101 sentences in
71 / 18 documents) are invented news items, not Reuters text; `yahoo_train.csv` / `yahoo_dev.csv` (the
`text,topic` layout of Yahoo Answers, 400 / 100 questions with answers, two topics) are invented, not
Yahoo text. The scripts that write them live outside the package, in tools/samples/
(`python tools/samples/make_qqp_sample.py`, ..._conll_..., ..._yahoo_...; tests/test_samples.py checks
that they reproduce these files byte for byte).
"""

from pathlib import Path


def sample_path(name: str) -> Path:
    """Path of a shipped sample file, e.g. sample_path("qqp_train.tsv")."""
    path = Path(__file__).parent / name
    if not path.is_file():
        suffixes = (".tsv", ".txt", ".csv")
        available = sorted(p.name for p in Path(__file__).parent.iterdir() if p.suffix in suffixes)
        raise FileNotFoundError(f"no sample named {name!r}; available: {available}")
    return path
