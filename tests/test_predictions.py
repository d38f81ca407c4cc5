"""Prediction files: round trip, matching two runs by key, and what a mismatch or a broken file gets."""

import json
import shutil

import numpy as np
import pytest

from stackft_jax.training import compact_predictions, prediction_files

RECORDS = [
    {"key": "1000-1a2b3c4d", "prediction": 1, "label": 1, "probabilities": [0.2, 0.8]},
    {"key": "1001-5e6f7a8b", "prediction": 0, "label": 1, "probabilities": [0.9, 0.1]},
]


def test_round_trip_and_pairing_by_key(tmp_path):
    a, b = prediction_files.path(tmp_path / "run_a", "dev"), prediction_files.path(tmp_path / "run_b", "dev")
    assert a == tmp_path / "run_a" / "predictions" / "dev.jsonl"
    prediction_files.write(a, RECORDS)
    other_run = [{**r, "prediction": 1 - r["prediction"]} for r in reversed(RECORDS)]  # another order
    prediction_files.write(b, other_run)
    assert list(prediction_files.read(a).values()) == RECORDS
    pairs = prediction_files.paired(a, b)
    assert [(x["key"], x["prediction"], y["prediction"]) for x, y in pairs] == [
        ("1000-1a2b3c4d", 1, 0),
        ("1001-5e6f7a8b", 0, 1),
    ]
    assert not list(a.parent.glob("*.tmp"))


def test_files_of_other_examples_are_not_paired(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    prediction_files.write(a, RECORDS)
    # The same id with another text: the hash part of the key differs.
    prediction_files.write(b, [RECORDS[0], {**RECORDS[1], "key": "1001-00000000"}])
    with pytest.raises(ValueError, match=r"1 keys only in the first, 1 only in the second.*'1001-5e6f7a8b'"):
        prediction_files.paired(a, b)


def test_broken_files_name_the_line(tmp_path):
    path = tmp_path / "dev.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n" + json.dumps(RECORDS[0]) + "\n")
    with pytest.raises(ValueError, match=r"dev.jsonl:2: key '1000-1a2b3c4d' appears twice"):
        prediction_files.read(path)
    path.write_text(json.dumps({"prediction": 1}) + "\n")
    with pytest.raises(ValueError, match=r"dev.jsonl:1: record has no `key`"):
        prediction_files.read(path)


# Compact files (compact_predictions.py): what a grid keeps of each run, its keys and labels once.
TAGS = [
    {"key": "0-aa", "prediction": ["B-PER", "O"], "label": ["B-PER", "O"]},
    {"key": "1-bb", "prediction": [], "label": []},
    {"key": "2-cc", "prediction": ["O", "B-LOC", "I-LOC"], "label": ["O", "B-ORG", "I-ORG"]},
]
FLOAT32 = [float(x) for x in np.float32([0.9719746708869934, 0.028025316074490547, 1 / 3, 2 / 3, 0.1, 0.9])]


def _classified(n: int, seed: int) -> list[dict]:
    """A run's records as a classifier writes them: float32 softmax rows (whose last entry is rarely
    exactly 1 minus the others), names beside the class ids."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, 3)).astype(np.float32)
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    names = ["no", "maybe", "yes"]
    return [
        {"key": f"{i}-{i:08x}", "prediction": int(p.argmax()), "prediction_name": names[int(p.argmax())],
         "label": i % 3, "label_name": names[i % 3], "probabilities": p.tolist()}
        for i, p in enumerate(probabilities)
    ]  # fmt: skip


@pytest.mark.parametrize(
    "records",
    [
        _classified(50, 0),
        TAGS,
        [
            {"key": "a", "prediction": FLOAT32[0], "label": 2.5},
            {"key": "b", "prediction": 0.1, "label": -1.0},
        ],
        # float64 rows (an ensemble's means), rows that are no distribution, NaN, and JSON for the rest
        [
            {"key": "a", "probabilities": [0.1, 0.2, 0.7], "odd": None, "flag": True, "big": 2**70},
            {
                "key": "b",
                "probabilities": [float("nan"), 5.0, -3.0],
                "odd": {"x": [1]},
                "flag": False,
                "big": 1,
            },
        ],
        [{"key": "a", "probabilities": FLOAT32[:2]}, {"key": "b", "probabilities": FLOAT32[2:4]}],
    ],
    ids=["classification", "tagging", "regression", "other", "float32-rows"],
)
def test_a_compact_file_gives_back_its_records_value_for_value(tmp_path, records):
    file = tmp_path / "runs" / "r" / "predictions" / "dev.npz"
    prediction_files.write(file, records, tmp_path / "examples")
    # json.dumps: field order, int against float and every float's bits (NaN included) as written
    assert [json.dumps(r) for r in prediction_files.read(file).values()] == [json.dumps(r) for r in records]
    first = file.read_bytes()
    prediction_files.write(file, records, tmp_path / "examples")
    assert file.read_bytes() == first  # the same records, the same bytes: a rewritten grid changes nothing


def test_runs_over_one_file_share_its_examples_and_other_data_gets_its_own(tmp_path):
    runs = [_classified(40, 0), _classified(40, 1)]
    other_order = list(reversed(runs[1]))
    examples = tmp_path / "examples"
    for name, records in (("a", runs[0]), ("b", runs[1]), ("c", other_order)):
        prediction_files.write(tmp_path / "runs" / name / "predictions" / "dev.npz", records, examples)
    shared = sorted(examples.iterdir())
    assert len(shared) == 2 and all(f.name.startswith("dev-") for f in shared)
    pairs = prediction_files.paired(*(tmp_path / "runs" / n / "predictions" / "dev.npz" for n in "ac"))
    assert [(a["key"], a["prediction"], b["prediction"]) for a, b in pairs] == [
        (r["key"], r["prediction"], s["prediction"]) for r, s in zip(runs[0], runs[1], strict=True)
    ]
    # Keys and labels are kept once: a run's own file holds only its predictions and probabilities.
    with np.load(tmp_path / "runs" / "b" / "predictions" / "dev.npz") as archive:
        header = json.loads(str(archive["header"][()]))
    assert set(header["columns"]) == {"prediction", "prediction_name", "probabilities"}


def test_a_split_has_one_form_and_path_finds_it(tmp_path):
    plain = prediction_files.path(tmp_path, "dev")
    prediction_files.write(plain, RECORDS)
    gz = plain.with_name("dev.jsonl.gz")
    prediction_files.write(gz, RECORDS)
    assert not plain.exists() and prediction_files.path(tmp_path, "dev") == gz
    assert prediction_files.compact(tmp_path, tmp_path / "examples") == [plain.with_name("dev.npz")]
    assert sorted(p.name for p in plain.parent.iterdir()) == ["dev.npz"]
    assert list(prediction_files.read(prediction_files.path(tmp_path, "dev")).values()) == RECORDS
    assert prediction_files.compact(tmp_path, tmp_path / "examples") == []  # already compact: left
    # A run retrained in place writes its split in the form it has, its examples where they were.
    changed = [{**r, "prediction": 1 - r["prediction"]} for r in RECORDS]
    prediction_files.write(prediction_files.path(tmp_path, "dev"), changed)
    assert list(prediction_files.read(plain.with_name("dev.npz")).values()) == changed
    assert len(list((tmp_path / "examples").iterdir())) == 1
    with pytest.raises(ValueError, match="new compact prediction file needs the folder for its examples"):
        prediction_files.write(tmp_path / "other" / "dev.npz", RECORDS)


def test_a_run_copied_from_another_grid_is_made_compact_against_its_new_grids_examples(tmp_path):
    source = tmp_path / "first" / "runs" / "r"
    prediction_files.write(source / "predictions" / "dev.npz", RECORDS, tmp_path / "first" / "examples")
    copy = tmp_path / "second" / "runs" / "r"
    shutil.copytree(source, copy)
    with pytest.raises(
        ValueError, match=r"dev.npz: its examples file \.\./\.\./\.\./examples/dev-\w+\.npz is missing"
    ):
        prediction_files.read(copy / "predictions" / "dev.npz")
    prediction_files.compact(copy, tmp_path / "second" / "examples", source=source)
    assert list(prediction_files.read(copy / "predictions" / "dev.npz").values()) == RECORDS


def test_a_broken_compact_file_or_its_examples_are_named(tmp_path):
    file = tmp_path / "dev.npz"
    with pytest.raises(ValueError, match=r"record 2 has the fields \['key', 'label'\], record 1 has"):
        prediction_files.write(file, [RECORDS[0], {"key": "x", "label": 1}], tmp_path / "examples")
    prediction_files.write(file, [RECORDS[0], RECORDS[0]], tmp_path / "examples")
    with pytest.raises(ValueError, match=r"dev.npz:2: key '1000-1a2b3c4d' appears twice"):
        prediction_files.read(file)
    prediction_files.write(file, RECORDS, tmp_path / "examples")
    shared = compact_predictions.examples_file(file)
    other = tmp_path / "elsewhere.npz"
    prediction_files.write(other, [{**r, "label": 0} for r in RECORDS], tmp_path / "other_examples")
    shutil.copy(compact_predictions.examples_file(other), shared)  # an examples file edited by hand
    with pytest.raises(ValueError, match="its content is not the examples .*dev.npz was written with"):
        prediction_files.read(file)
