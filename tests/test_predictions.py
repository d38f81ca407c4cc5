"""Prediction files: round trip, matching two runs by key, and what a mismatch or a broken file gets."""

import json

import pytest

from stackft_jax.training import prediction_files

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
