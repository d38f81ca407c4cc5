"""The statistics and the dev sample of benchmarks/compare_strategies.py."""

import pytest

from benchmarks import compare_strategies

HEADER = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"


def _rows(accuracies: dict[str, list[float]]) -> list[dict]:
    return [
        {"head": "bimpm", "strategy": strategy, "seed": seed, "accuracy": acc}
        for strategy, values in accuracies.items()
        for seed, acc in enumerate(values)
    ]


def test_paired_differences_match_by_seed():
    rows = _rows(
        {
            "stack_and_finetune": [0.80, 0.82, 0.81],
            "finetune_only": [0.78, 0.80, 0.80],
            "stack_only": [0.7] * 3,
        }
    )
    paired = compare_strategies.paired_differences(
        rows, ["bimpm"], ["finetune_only", "stack_only", "stack_and_finetune"]
    )
    by_other = {d["versus"]: d for d in paired}
    assert by_other["finetune_only"]["per_seed"] == pytest.approx([2.0, 2.0, 1.0])
    assert by_other["finetune_only"]["mean"] == pytest.approx(5 / 3)
    # scipy's paired t-test: t = mean / (sd / sqrt(n)) = 1.667 / (0.577 / 1.732) = 5.0 with 2 dof.
    assert by_other["finetune_only"]["p_value"] == pytest.approx(0.0377, abs=1e-3)
    assert by_other["stack_only"]["mean"] == pytest.approx(11.0)


def test_paired_differences_need_common_seeds():
    rows = _rows({"stack_and_finetune": [0.8], "finetune_only": []})
    both = ["finetune_only", "stack_and_finetune"]
    assert compare_strategies.paired_differences(rows, ["bimpm"], both) == []
    assert compare_strategies.paired_differences(rows, ["bimpm"], ["finetune_only"]) == []


def test_dev_sample_and_majority(tmp_path):
    dev = tmp_path / "dev.tsv"
    dev.write_text(HEADER + "".join(f"{i}\t{i}\t{i}\tq{i}?\tp{i}?\t{int(i % 4 == 0)}\n" for i in range(40)))
    sample = compare_strategies.write_dev_sample(dev, 10, tmp_path / "new_dir")
    lines = sample.read_text().splitlines()
    assert lines[0] == HEADER.strip() and len(lines) == 11
    ids = [int(line.split("\t")[0]) for line in lines[1:]]
    assert ids == sorted(ids) and len(set(ids)) == 10
    # Fixed seed: the same sample every time.
    assert compare_strategies.write_dev_sample(dev, 10, tmp_path).read_text() == sample.read_text()
    assert compare_strategies.majority_accuracy(dev) == 0.75
    with pytest.raises(ValueError, match="has only 40 rows"):
        compare_strategies.write_dev_sample(dev, 41, tmp_path)
