"""GLUE readers, example keys and the task registry, on the invented fixtures in tests/fixtures/."""

from collections import Counter
from pathlib import Path

import datasets
import pytest

from stackft_jax.data import glue, task_spec, tasks
from stackft_jax.data.samples import sample_path
from stackft_jax.data.sentence_task import Example
from stackft_jax.models import objectives

FIXTURES = Path(__file__).parent / "fixtures"


def test_get_task_names_the_config_key_and_choices():
    assert tasks.get_task("qqp").metrics == ("accuracy", "f1")
    assert tasks.get_task("stsb").objective is objectives.REGRESSION
    assert tasks.get_task("sst2").objective is objectives.CLASSIFICATION
    with pytest.raises(ValueError, match=r"data\.task") as info:
        tasks.get_task("quora")
    for name in ("qqp", "mrpc", "stsb", "sst2"):
        assert name in str(info.value)


def test_qqp_glue_layout_keeps_quotes_and_empty_questions():
    examples = glue.read_qqp(FIXTURES / "qqp" / "train.tsv", config_key="data.train_file")
    assert len(examples) == 40
    assert Counter(e.label for e in examples) == {1: 21, 0: 19}
    assert examples[0] == Example(
        "How do I keep basil alive indoors?",
        "What is the trick to growing basil on a windowsill?",
        1,
        task_spec.example_key(
            "1000",
            "How do I keep basil alive indoors?",
            "What is the trick to growing basil on a windowsill?",
        ),
    )
    # QUOTE_NONE: quotes are text, not field delimiters.
    assert examples[9].text_a == 'What does "bona fide" mean?'
    assert examples[35].text_b == ""
    assert len(glue.read_qqp(FIXTURES / "qqp" / "dev.tsv", config_key="data.dev_file")) == 16


def test_qqp_glue_test_layout_is_unlabeled():
    examples = glue.read_qqp(FIXTURES / "qqp" / "test.tsv", config_key="data.test_file")
    assert len(examples) == 3
    assert {e.label for e in examples} == {-1}
    assert examples[0].text_b == "Can owls see in the dark?"


def test_qqp_bimpm_layout_has_no_header():
    bimpm = glue.read_qqp(FIXTURES / "qqp" / "bimpm.tsv", config_key="data.train_file")
    glue_layout = glue.read_qqp(FIXTURES / "qqp" / "train.tsv", config_key="data.train_file")
    content = lambda examples: [(e.text_a, e.text_b, e.label) for e in examples]  # noqa: E731
    assert content(bimpm) == content(glue_layout[:6])
    # The key's id is the BiMPM file's own (last) column; the text hash is the same.
    assert [e.key.split("-") for e in bimpm[:2]] == [
        ["500", glue_layout[0].key.split("-")[1]],
        ["501", glue_layout[1].key.split("-")[1]],
    ]


def test_qqp_unrecognized_layout(tmp_path):
    path = tmp_path / "odd.tsv"
    path.write_text("a\tb\n")
    with pytest.raises(ValueError, match=rf"{path}:1: unrecognized QQP layout"):
        glue.read_qqp(path, config_key="data.train_file")


def test_mrpc_strips_bom_and_reads_test_layout():
    examples = glue.read_mrpc(FIXTURES / "mrpc" / "train.tsv", config_key="data.train_file")
    assert [e.label for e in examples] == [1, 0, 1, 0, 1, 0]
    assert examples[0].text_a == "The bakery opened a second shop near the station on Monday."
    test = glue.read_mrpc(FIXTURES / "mrpc" / "test.tsv", config_key="data.test_file")
    assert [e.label for e in test] == [-1, -1, -1]
    assert test[1].text_b == examples[1].text_b


def test_stsb_reads_float_scores_by_column_name():
    examples = glue.read_stsb(FIXTURES / "stsb" / "train.tsv", config_key="data.train_file")
    assert [e.label for e in examples] == [4.8, 0.0, 4.25, 2.6, 3.4, 1.2]
    assert all(isinstance(e.label, float) for e in examples)
    assert examples[0].text_b == "A dog runs along the beach."
    test = glue.read_stsb(FIXTURES / "stsb" / "test.tsv", config_key="data.test_file")
    assert [e.label for e in test] == [-1, -1, -1]


def test_sst2_single_sentences():
    examples = glue.read_sst2(FIXTURES / "sst2" / "train.tsv", config_key="data.train_file")
    assert len(examples) == 8
    assert all(e.text_b is None for e in examples)
    assert examples[6] == Example(
        'a "thriller" with no thrills ',
        None,
        0,
        task_spec.example_key("line8", 'a "thriller" with no thrills ', None),
    )
    test = glue.read_sst2(FIXTURES / "sst2" / "test.tsv", config_key="data.test_file")
    assert [e.label for e in test] == [-1, -1, -1]


QQP_HEADER = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
STSB_HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
STSB_ROW = "0\tg\tf\t2024\t0\tnone\tnone\tA cat sits.\tA cat is sitting.\t"


@pytest.mark.parametrize(
    "reader, header, bad_line, message",
    [
        (glue.read_qqp, QQP_HEADER, "2\t5\t6\tWhy?\t1\n", "expected 6 tab-separated columns"),
        (glue.read_qqp, QQP_HEADER, "2\t5\t6\tWhy?\tHow?\tyes\n", "label 'yes' is not an integer"),
        (glue.read_qqp, QQP_HEADER, "2\t5\t6\tWhy?\tHow?\t2\n", r"label 2 is outside \[0, 1\]"),
        (glue.read_qqp, "", "1\tWhy?\tHow?\n", "expected 4 tab-separated columns"),
        (glue.read_sst2, "sentence\tlabel\n", "fine film\t-1\n", r"label -1 is outside"),
        (glue.read_stsb, STSB_HEADER, STSB_ROW + "7.5\n", r"score 7.5 is outside \[0.0, 5.0\]"),
        (glue.read_stsb, STSB_HEADER, STSB_ROW + "high\n", "score 'high' is not a number"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, reader, header, bad_line, message):
    good = {
        glue.read_qqp: "1\t3\t4\tWhat?\tWhich?\t0\n" if header else "0\tWhat?\tWhich?\t1\n",
        glue.read_sst2: "a fine film\t1\n",
        glue.read_stsb: STSB_ROW + "3.0\n",
    }[reader]
    path = tmp_path / "broken.tsv"
    path.write_text(header + good + good + bad_line)
    line = 4 if header else 3
    with pytest.raises(ValueError, match=rf"{path}:{line}: {message}"):
        reader(path, config_key="data.train_file")


def test_missing_file_names_the_config_key(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data\.dev_file"):
        task_spec.read_examples(tasks.get_task("mrpc"), "dev", tmp_path / "nope.tsv")


def test_read_examples_from_local_file_uses_the_task_reader():
    examples = task_spec.read_examples(tasks.get_task("sst2"), "train", FIXTURES / "sst2" / "train.tsv")
    assert len(examples) == 8
    with pytest.raises(ValueError, match="unknown split"):
        task_spec.read_examples(tasks.get_task("sst2"), "validation", None)


def test_uncached_hf_dataset_asks_for_a_local_file(monkeypatch):
    calls = []

    def offline(*args, **kwargs):
        calls.append((args, kwargs))
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(FileNotFoundError, match=r"`data\.dev_file`") as info:
        task_spec.read_examples(tasks.get_task("qqp"), "dev", None)
    assert "cached" in str(info.value)
    assert calls == [(("nyu-mll/glue", "qqp"), {"split": "validation"})]


def test_hub_rows_become_examples_keyed_by_idx(monkeypatch):
    hub = {
        ("nyu-mll/glue", "stsb", "validation"): {
            "sentence1": ["A b.", "C d."],
            "sentence2": ["E f.", "G h."],
            "label": [3.5, 1],
            "idx": [0, 1],
        },
        ("nyu-mll/glue", "sst2", "test"): {"sentence": ["ok"], "label": [-1], "idx": [7]},
    }
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, split: hub[(*args, split)])
    examples = task_spec.read_examples(tasks.get_task("stsb"), "dev", None)
    assert examples == [
        Example("A b.", "E f.", 3.5, task_spec.example_key("0", "A b.", "E f.")),
        Example("C d.", "G h.", 1.0, task_spec.example_key("1", "C d.", "G h.")),
    ]
    assert isinstance(examples[1].label, float)
    sst = task_spec.read_examples(tasks.get_task("sst2"), "test", None)
    assert sst == [Example("ok", None, -1, task_spec.example_key("7", "ok", None))]


def test_example_keys_come_from_id_columns_or_line_numbers():
    def keys(reader, name):
        return [e.key.split("-")[0] for e in reader(FIXTURES / name, config_key="data.train_file")][:2]

    assert keys(glue.read_qqp, "qqp/train.tsv") == ["1000", "1001"]
    assert keys(glue.read_qqp, "qqp/test.tsv") == ["0", "1"]
    assert keys(glue.read_mrpc, "mrpc/train.tsv") == ["3000_3001", "3002_3003"]
    assert keys(glue.read_stsb, "stsb/train.tsv") == ["0", "1"]
    assert keys(glue.read_sst2, "sst2/train.tsv") == ["line2", "line3"]  # no id column
    assert keys(glue.read_sst2, "sst2/test.tsv") == ["0", "1"]
    # The hash tells texts apart, including a missing second text from an empty one.
    assert task_spec.example_key("1", "a", None) != task_spec.example_key("1", "a", "")
    assert task_spec.example_key("1", "ab", "c") != task_spec.example_key("1", "a", "bc")


def test_two_examples_with_one_key_are_an_error(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text(QQP_HEADER + "7\t1\t2\tWhy?\tHow?\t0\n" + "7\t1\t2\tWhy?\tHow?\t1\n")
    with pytest.raises(ValueError, match=r"data.train_file = '.*train.tsv': examples 0 and 1 share the key"):
        task_spec.read_examples(tasks.get_task("qqp"), "train", path)


def test_shipped_qqp_sample_parses_with_qqp_like_balance():
    train = glue.read_qqp(sample_path("qqp_train.tsv"), config_key="data.train_file")
    dev = glue.read_qqp(sample_path("qqp_dev.tsv"), config_key="data.dev_file")
    assert (len(train), len(dev)) == (400, 100)
    for split in (train, dev):
        assert 0.3 < sum(e.label for e in split) / len(split) < 0.45
    pairs = lambda split: {(e.text_a, e.text_b) for e in split}  # noqa: E731
    assert not pairs(train) & pairs(dev)
