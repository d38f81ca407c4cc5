"""The CoNLL-2003 task end to end: scores over split and prefix windows, the four tagging heads, every
strategy, the scalar mix and the feature cache, a scored test file, and bit-identical resume."""

import json
import math
import signal

import jax
import numpy as np
import pytest
from flax import nnx

from configs import tiny
from stackft_jax.config import config_cli, spec
from stackft_jax.data import batching, conll, metrics, tasks, tokenization
from stackft_jax.data.samples import sample_path
from stackft_jax.data.task_spec import Split, load_split
from stackft_jax.models import bert, objectives
from stackft_jax.models.task_model import TaskModel
from stackft_jax.runtime.cli_errors import ConfigError
from stackft_jax.training import build
from tests.test_train import _assert_same_run

TASK = tasks.get_task("conll2003")
TAGGING_HEADS = ("token_mlp", "bilstm", "bilstm_crf", "crf")


@pytest.fixture(scope="module")
def tokenizer():
    return tokenization.load_tokenizer(bert.resolve_model_dir(bert.EMBEDDED_MODEL))


def _dev_split(tokenizer, max_seq_length: int) -> Split:
    return load_split(
        TASK, "dev", sample_path("conll_dev.txt"), tokenizer=tokenizer, max_seq_length=max_seq_length
    )


def test_the_task_is_registered_and_describes_its_scoring():
    assert TASK.num_outputs == 9 and TASK.output_names == conll.TAGS
    assert TASK.objective is objectives.WORD_TAGGING and TASK.metrics[0] == "f1"
    described = TASK.describe()
    assert described["tag_scheme"] == "IOB2" and "conlleval" in described["scoring"]


def test_split_sentences_are_joined_and_a_prefix_scores_only_whole_sentences(tokenizer):
    dev = _dev_split(tokenizer, max_seq_length=16)
    arrays = dev.arrays
    assert dev.num_rows > len(dev.examples)  # some sentences did not fit one window
    gold = arrays["labels"]
    perfect = TASK.score(dev, {"predictions": gold})
    assert perfect["f1"] == 1.0 and perfect["accuracy"] == 1.0
    records = TASK.prediction_records(dev, {"predictions": gold})
    assert [r["key"] for r in records] == [s.key for s in dev.examples]
    assert all(
        r["prediction"] == r["label"] == list(s.tags) for r, s in zip(records, dev.examples, strict=True)
    )

    # A prefix ending inside a split sentence: that sentence and everything after it are not scored.
    split_rows = np.flatnonzero(arrays["word_offset"] > 0)
    cut = int(split_rows[0])  # this row continues a sentence started in the row before
    predictions = gold.copy()
    predictions[0, : arrays["num_words"][0]] = 0  # the first window says "O" everywhere
    whole = int(arrays["sentence_index"][cut])
    expected_first = ["O"] * arrays["num_words"][0] + list(dev.examples[0].tags[arrays["num_words"][0] :])
    expected = metrics.entity_scores(
        [s.tags for s in dev.examples[:whole]],
        [expected_first] + [list(s.tags) for s in dev.examples[1:whole]],
    )
    assert TASK.score(dev, {"predictions": predictions[:cut]}) == expected


def _model_outputs(config, tokenizer, max_seq_length: int):
    """Loss and decoded tags of dev sentences that fit one 40-token window, at a given window size."""
    model, _ = build.build_model(config, TASK, bert.resolve_model_dir(config.model.name_or_path))
    dev = _dev_split(tokenizer, max_seq_length)
    whole = dev.arrays["num_words"] == [len(dev.examples[i].words) for i in dev.arrays["sentence_index"]]
    rows = np.flatnonzero(whole & (dev.arrays["lengths"] <= 40))[:6]
    subset = {k: v[rows] for k, v in dev.arrays.items()}
    (batch,) = batching.eval_batches(subset, global_batch_size=len(rows), buckets=(max_seq_length,))
    order = np.argsort(batch.pop("index"))  # eval batches go longest first: back to row order
    scores = model(jax.tree.map(np.asarray, batch), deterministic=True)
    nll = scores.negative_log_likelihood(batch["labels"], batch["num_words"])
    tags = scores.decode(batch["num_words"])
    words = batch["num_words"]
    return np.asarray(nll)[order], [np.asarray(tags)[i, : words[i]].tolist() for i in order]


@pytest.mark.slow
@pytest.mark.parametrize("head", TAGGING_HEADS)
def test_tagging_heads_ignore_padding_and_respect_iob2(head, tokenizer):
    config = tiny.get_config(f"conll,head={head}")
    nll_short, tags_short = _model_outputs(config, tokenizer, 40)
    nll_long, tags_long = _model_outputs(config, tokenizer, 64)  # more padded tokens and padded words
    np.testing.assert_allclose(nll_short, nll_long, rtol=1e-5, atol=1e-5)
    assert tags_short == tags_long and np.all(np.isfinite(nll_short))
    if config.head[head].crf:  # random weights, yet constrained Viterbi never emits a forbidden move
        _assert_well_formed_iob2(tags_short)


def _assert_well_formed_iob2(tagged: list[list[int]]) -> None:
    """Every `I-X` follows `B-X` or `I-X` in each sentence's tag ids."""
    for sentence in tagged:
        names = [conll.TAGS[t] for t in sentence]
        for previous, current in zip(["O", *names], names, strict=False):
            if current.startswith("I-"):
                assert previous[2:] == current[2:], names


def test_crf_constraints_need_iob2_tag_names():
    config = tiny.get_config("conll,head=crf")
    with pytest.raises(ValueError, match="tag 'PER' is not IOB2"):
        TaskModel(
            bert.BertConfig(
                vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8
            ),
            config.head,
            num_outputs=2,
            output_names=("O", "PER"),
            scalar_mix=False,
            rngs=nnx.Rngs(0),
        )


def _final(workdir) -> dict:
    return json.loads((workdir / "results.json").read_text())["final"]


@pytest.fixture(scope="module")
def conll_uninterrupted(tmp_path_factory, run_cli):
    workdir = tmp_path_factory.mktemp("conll")
    proc = run_cli(workdir, config="configs/tiny.py:conll,head=bilstm")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return workdir


@pytest.mark.slow
def test_a_tagging_run_writes_sentence_predictions(conll_uninterrupted):
    results = json.loads((conll_uninterrupted / "results.json").read_text())
    dev = results["final"]["dev"]
    assert {"f1", "precision", "recall", "accuracy", "loss"} <= set(dev) and math.isfinite(dev["accuracy"])
    assert results["task"]["outputs"] == list(conll.TAGS)
    records = [json.loads(line) for line in (conll_uninterrupted / "predictions" / "dev.jsonl").open()]
    sentences = conll.read_conll(sample_path("conll_dev.txt"), config_key="data.dev_file")
    assert [r["key"] for r in records] == [s.key for s in sentences]
    accuracy = np.mean([p == g for r in records for p, g in zip(r["prediction"], r["label"], strict=True)])
    np.testing.assert_allclose(dev["accuracy"], accuracy)


@pytest.mark.parametrize(
    ("head", "args"),
    [
        (
            "token_mlp",
            ("--config.strategy=finetune_only", "--config.data.test_file=tests/fixtures/conll/iob2.txt"),
        ),
        # Peters et al.'s feature extraction: a BiLSTM-CRF on a scalar mix of frozen layers, from the cache.
        (
            "bilstm_crf",
            (
                "--config.strategy=stack_only",
                "--config.model.scalar_mix=True",
                "--config.phase1.backbone_dropout=False",
                "--config.phase1.feature_cache=True",
            ),
        ),
        # BERT's own NER setup: each window filled with the neighbouring sentences of its document.
        ("crf", ("--config.strategy=stack_and_finetune", "--config.data.document_context=True")),
    ],
)
@pytest.mark.slow
def test_every_tagging_head_runs_under_every_strategy(head, args, tmp_path, run_cli):
    proc = run_cli(tmp_path, *args, config=f"configs/tiny.py:conll,head={head}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    final = _final(tmp_path)
    assert math.isfinite(final["dev"]["accuracy"]) and final["dev"]["loss"] > 0
    if any("test_file" in a for a in args):
        assert set(final["test"]) >= {"f1", "accuracy"}
        tested = [json.loads(line) for line in (tmp_path / "predictions" / "test.jsonl").open()]
        assert len(tested) == len(conll.read_conll("tests/fixtures/conll/iob2.txt", config_key="t"))
    if any("feature_cache=True" in a for a in args):
        assert (tmp_path / "feature_cache").is_dir()


@pytest.mark.slow
def test_a_killed_tagging_run_resumes_bit_identical(conll_uninterrupted, tmp_path, run_cli):
    config = "configs/tiny.py:conll,head=bilstm"
    for kill_at in ("phase1:3", "phase2:5"):
        assert run_cli(tmp_path, config=config, kill_at=kill_at).returncode == -signal.SIGKILL
    proc = run_cli(tmp_path, config=config)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _assert_same_run(conll_uninterrupted, tmp_path, num_dev_examples=101)


def test_data_entity_f1_names_the_f1_a_runs_rules_read_and_older_records_read_strict():
    default, strict = TASK.configure({"entity_f1": "conlleval"}), TASK.configure({"entity_f1": "strict"})
    assert default.metrics[0] == "f1" and default.rule_metric("f1") == "f1"
    assert strict.metrics[0] == "strict_f1" and strict.rule_metric("f1") == "strict_f1"
    assert strict.rule_metric("accuracy") == "accuracy"
    with pytest.raises(ConfigError, match=r"^config.data.entity_f1='iob1': choose one of"):
        TASK.configure({"entity_f1": "iob1"})
    # A config recorded before the key (config.json, results.json) ran the strict gap rule; one that set
    # it keeps it, and a task without entity F1 gets no such key.
    recorded = config_cli.with_legacy_keys({"data": {"task": "conll2003"}, "phases": []})
    assert recorded["data"]["entity_f1"] == "strict"
    kept = config_cli.with_legacy_keys({"data": {"task": "conll2003", "entity_f1": "conlleval"}})
    assert kept["data"]["entity_f1"] == "conlleval"
    assert "entity_f1" not in config_cli.with_legacy_keys({"data": {"task": "qqp"}})["data"]


def test_a_recorded_run_without_entity_f1_binds_as_strict_where_a_rule_reads_it():
    from stackft_jax.config import spec

    def old_and_now(items: list[str]) -> tuple[dict, dict]:
        now = spec.resolve(config_cli.load("configs/tiny.py:conll", items))
        old = now.raw | {"data": {k: v for k, v in now.raw["data"].items() if k != "entity_f1"}}
        return spec.recorded_binding_form(old, now.raw)["config"], spec.binding_form(now)["config"]

    # phase 1's gap rule on `f1` read strict F1 then and reads conlleval's now: a rerun is another run
    old, now = old_and_now(["strategy=stack_and_finetune"])
    assert (old["data"]["entity_f1"], now["data"]["entity_f1"]) == ("strict", "conlleval")
    # no rule reads it (no gap rule, the last parameters scored): the same run under either value
    old, now = old_and_now(["strategy=finetune_only"])
    assert old == now and "entity_f1" not in now["data"]


@pytest.mark.slow
def test_token_mlp_with_iob2_decoding_trains_alike_and_decodes_well_formed_iob2(tokenizer):
    plain = tiny.get_config("conll,head=token_mlp")
    nll_plain, _ = _model_outputs(plain, tokenizer, 40)
    constrained = tiny.get_config("conll,head=token_mlp,head.token_mlp.iob2_decoding=true")
    nll, tags = _model_outputs(constrained, tokenizer, 40)
    np.testing.assert_array_equal(nll, nll_plain)  # the same weights and loss: decoding alone differs
    _assert_well_formed_iob2(tags)


def test_iob2_decoding_is_refused_for_a_crf_head():
    config = tiny.get_config("conll,head=bilstm_crf,head.bilstm_crf.iob2_decoding=true")
    with pytest.raises(ConfigError, match="head.bilstm_crf.iob2_decoding decodes a softmax head"):
        spec.resolve(config)
