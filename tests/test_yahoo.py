"""The Yahoo Answers task: both file layouts, the hub rows, topic selection, the held-out dev slice,
head+tail truncation, configs/yahoo.py and a short run on the packaged sample."""

import json
import logging
import re

import datasets
import numpy as np
import pytest

from stackft_jax.config import config_cli, defaults, spec
from stackft_jax.data import task_spec, tasks, tokenization, yahoo
from stackft_jax.data.samples import sample_path
from stackft_jax.models import bert

TWO = ("Society & Culture", "Science & Mathematics")


def _data_config(**changes):
    c = defaults.get_config()
    c.data.task = "yahoo_answers"
    for key, value in changes.items():
        c.data[key] = value
    return c.data


def _task(**changes) -> yahoo.YahooTask:
    return tasks.get_task("yahoo_answers").configure(_data_config(**changes))


def _write(tmp_path, text: str, name: str = "data.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_text_topic_layout_quoted_multiline_fields_and_selected_topics(tmp_path, caplog):
    path = _write(
        tmp_path,
        '"Why is the sky blue? Light scatters,\nmostly blue.",science_mathematics\n'
        "Who won the cup?,sports\n"
        '"Is it rude to say ""no""?",society_culture\n',
    )
    with caplog.at_level(logging.INFO):
        examples = _task(classes="science_mathematics+society_culture").read_file(path, config_key="k")
    # Labels follow data.classes' order, not the release's; sports is dropped and counted.
    assert [(e.text_a, e.label) for e in examples] == [
        ("Why is the sky blue? Light scatters,\nmostly blue.", 0),
        ('Is it rude to say "no"?', 1),
    ]
    assert "1 examples of other topics" in caplog.text
    # Keys name the record's first line: the multi-line record takes lines 1-2, so the third is line 4.
    assert [e.key.split("-")[0] for e in examples] == ["line1", "line4"]


def test_release_layout_joins_title_content_answer_and_unescapes_newlines(tmp_path):
    path = _write(
        tmp_path,
        '"2","What is pi?","","About 3.14.\\nIt never ends."\n'
        '"1","Why do we tip?","In the US.","Custom."\n'
        '"6","Best team?","","Mine."\n',
    )
    examples = _task().read_file(path, config_key="k")
    assert [(e.text_a, e.label) for e in examples] == [
        ("What is pi? About 3.14.\nIt never ends.", 1),
        ("Why do we tip? In the US. Custom.", 0),
    ]
    ten = _task(classes="all").read_file(path, config_key="k")
    assert [e.label for e in ten] == [1, 0, 5]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('"a\nb",science_mathematics\nc,cooking\n', "data.csv:3: unknown topic 'cooking'"),
        ('"11","t","c","a"\n', "data.csv:1: class '11' is not a class number 1-10"),
        ('"2","t","c","a"\n"x","t","c","a"\n', "data.csv:2: class 'x' is not a class number 1-10"),
        ("a,science_mathematics\nb,c,society_culture\n", "data.csv:2: expected 2 fields (text,topic)"),
        ("a,b,c\n", "data.csv:1: unrecognized Yahoo Answers layout"),
        ("", "data.csv: file is empty"),
    ],
)
def test_bad_files_are_errors_naming_file_and_line(tmp_path, text, message):
    with pytest.raises(ValueError, match="^" + re.escape(str(tmp_path / message))):
        _task().read_file(_write(tmp_path, text), config_key="k")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"classes": "society_culture+cooking"},
            "config.data.classes='society_culture+cooking': unknown topic",
        ),
        ({"classes": "health"}, "config.data.classes='health': a classifier needs at least two topics"),
        ({"classes": "health+Health"}, "topic 'Health' is listed twice"),
        ({"dev_fraction": 1.0}, "config.data.dev_fraction=1.0: choose a fraction in (0, 1)"),
        ({"truncation": "tail"}, "config.data.truncation='tail': choose one of"),
    ],
)
def test_bad_data_keys_fail_in_resolve(changes, message):
    config = defaults.get_config()
    config.data.task = "yahoo_answers"
    for key, value in changes.items():
        config.data[key] = value
    with pytest.raises(ValueError, match=re.escape(message)):
        spec.resolve(config)


def test_classes_take_release_names_and_set_outputs_and_label_names():
    task = _task(classes="Health+computers_internet+Sports")
    assert task.num_outputs == 3
    assert task.output_names == ("Health", "Computers & Internet", "Sports")
    assert task.describe()["outputs"] == ["Health", "Computers & Internet", "Sports"]
    assert _task().output_names == TWO  # the default: the paper's two


def _hub_rows(n: int) -> dict:
    return {
        "id": list(range(n)),
        "topic": [i % 3 for i in range(n)],  # Society & Culture, Science & Mathematics, Health
        "question_title": [f"title {i}" for i in range(n)],
        "question_content": ["" if i % 2 else f"content {i}" for i in range(n)],
        "best_answer": [f"answer {i}" for i in range(n)],
    }


def test_hub_rows_without_files_hold_out_a_dev_slice(monkeypatch):
    requested = []

    def load_dataset(*args, split):
        requested.append((args, split))
        return _hub_rows(60)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    task = _task(dev_fraction=0.25)
    splits = task_spec.read_splits(task, {"train": None, "dev": None, "test": None})
    # The hub has no validation split: only train is asked for, and dev is carved out of it.
    assert requested == [(("yahoo_answers_topics",), "train")]
    assert (len(splits["train"]), len(splits["dev"])) == (30, 10)  # Health (20 rows) dropped
    assert not {e.key for e in splits["train"]} & {e.key for e in splits["dev"]}
    first = splits["train"][0] if splits["train"][0].key.startswith("row0-") else splits["dev"][0]
    assert (first.text_a, first.label) == ("title 0 content 0 answer 0", 0)


def test_hub_failure_asks_for_the_local_file(monkeypatch):
    def offline(*args, split):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(FileNotFoundError, match="Set `data.train_file` to a local file"):
        task_spec.read_splits(_task(), {"train": None, "dev": None})


def test_held_out_dev_is_fixed_by_keys_and_kept_out_of_train(tmp_path):
    rows = "".join(f"question {i},{('society_culture', 'science_mathematics')[i % 2]}\n" for i in range(50))
    path = _write(tmp_path, rows)
    task = _task(dev_fraction=0.1)
    splits = task_spec.read_splits(task, {"train": path, "dev": None})
    assert (len(splits["train"]), len(splits["dev"])) == (45, 5)
    assert not {e.key for e in splits["train"]} & {e.key for e in splits["dev"]}
    # Both keep file order, and reading again (any seed: none is involved) holds out the same examples.
    lines = [int(e.key.split("-")[0][4:]) for e in splits["dev"]]
    assert lines == sorted(lines)
    assert task_spec.read_splits(task, {"train": path, "dev": None})["dev"] == splits["dev"]
    # A dev file, when given, is used as is and train keeps everything.
    with_dev = task_spec.read_splits(task, {"train": path, "dev": path})
    assert (len(with_dev["train"]), len(with_dev["dev"])) == (50, 50)


def test_head_tail_truncation_keeps_the_start_and_the_end():
    tokenizer = tokenization.load_tokenizer(bert.resolve_model_dir("embedded:minilm")).loaded
    long_text = "first " + "middle " * 100 + "last"
    examples = [yahoo.Example(long_text, None, 0, "a"), yahoo.Example("short", None, 1, "b")]
    options = _task(truncation="head_tail").encoding_options(_data_config(truncation="head_tail"))
    arrays = _task().encode(tokenizer, examples, max_seq_length=12, options=options)
    words = [
        tokenizer.convert_ids_to_tokens(row[:length])
        for row, length in zip(arrays["input_ids"], arrays["lengths"], strict=True)
    ]
    # 10 tokens between [CLS] and [SEP]: round(10 * 128/510) = 3 from the start, 7 from the end.
    assert words[0] == ["[CLS]", "first", "middle", "middle"] + ["middle"] * 6 + ["last", "[SEP]"]
    assert words[1] == ["[CLS]", "short", "[SEP]"]
    np.testing.assert_array_equal(arrays["labels"], [0, 1])
    head = _task().encode(tokenizer, examples, max_seq_length=12, options={"truncation": "head"})
    assert tokenizer.convert_ids_to_tokens(head["input_ids"][0])[-2:] == ["middle", "[SEP]"]


def test_config_presets_read_the_packaged_sample():
    config = config_cli.load("configs/yahoo.py:demo,head=cls_mlp")
    assert (config.data.task, config.head.name, config.model.name_or_path) == (
        "yahoo_answers",
        "cls_mlp",
        "embedded:minilm",
    )
    assert config_cli.load("configs/yahoo.py").max_seq_length == 256
    task = tasks.get_task(config.data.task).configure(config.data)
    splits = task_spec.read_splits(task, {"train": config.data.train_file, "dev": config.data.dev_file})
    assert (len(splits["train"]), len(splits["dev"])) == (400, 100)
    assert sorted({e.label for e in splits["train"]}) == [0, 1]
    assert sample_path("yahoo_train.csv").name == "yahoo_train.csv"


@pytest.mark.slow
def test_demo_preset_runs_and_records_label_names_and_held_out_dev(tmp_path, run_cli):
    """The demo preset shrunk to a tiny random BERT and two steps a phase, without a dev file; the
    packaged dev file serves as a held-out test file."""
    workdir = tmp_path / "run"
    proc = run_cli(
        workdir,
        *[
            f"--config.{item}"
            for item in (
                "data.dev_file=none",
                f"data.test_file={sample_path('yahoo_dev.csv')}",
                "data.truncation=head_tail",
                "model.init=random",
                "model.config_overrides.hidden_size=32",
                "model.config_overrides.num_hidden_layers=1",
                "model.config_overrides.num_attention_heads=4",
                "model.config_overrides.intermediate_size=64",
                "max_seq_length=32",
                "phase1.num_steps=2",
                "phase2.num_steps=2",
                "eval_every_steps=2",
                "async_checkpointing=false",
            )
        ],
        config="configs/yahoo.py:demo",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((workdir / "results.json").read_text())
    assert results["data"] == {
        "label_names": list(TWO),
        "num_examples": {"train": 360, "dev": 40, "test": 100},
        "dev_held_out_fraction": 0.1,
        "selection_fraction": None,  # no slice of train held out for selection
    }
    assert set(results["final"]["dev"]) == set(results["final"]["test"]) == {"accuracy", "macro_f1", "loss"}
    records = [json.loads(line) for line in (workdir / "predictions" / "dev.jsonl").read_text().splitlines()]
    assert len(records) == 40 and all(len(r["probabilities"]) == 2 for r in records)
    tested = [json.loads(line) for line in (workdir / "predictions" / "test.jsonl").read_text().splitlines()]
    assert len(tested) == 100 and all(len(r["probabilities"]) == 2 for r in tested)
