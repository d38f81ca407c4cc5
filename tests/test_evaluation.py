"""Evaluation gathers per-row outputs back into dataset order (batches run longest first, the last one
padded) and scores them with the task; prediction records follow the file order."""

import re

import jax
import jax.numpy as jnp
import numpy as np

from stackft_jax.data import glue
from stackft_jax.data.sentence_task import UNLABELED, Example
from stackft_jax.data.task_spec import Split
from stackft_jax.runtime import sharding
from stackft_jax.training import evaluation

NUM_ROWS = 21


def _split(labelled: bool = True) -> Split:
    """Row i holds token i + 100 first, label i % 2, and a length that does not follow i."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 16, NUM_ROWS).astype(np.int32)
    input_ids = np.zeros((NUM_ROWS, 16), np.int32)
    input_ids[:, 0] = np.arange(NUM_ROWS) + 100
    labels = np.arange(NUM_ROWS, dtype=np.int32) % 2 if labelled else np.full(NUM_ROWS, UNLABELED, np.int32)
    arrays = {
        "input_ids": input_ids,
        "token_type_ids": np.zeros_like(input_ids),
        "lengths": lengths,
        "labels": labels,
    }
    examples = [Example(f"a{i}", f"b{i}", int(labels[i]), f"{i}-key") for i in range(NUM_ROWS)]
    return Split("dev", examples, arrays, labelled)


@jax.jit
def _echo(params, batch):
    """Predicts class 1 with p = 0.75 and returns each row's first token, so the test can see which
    row landed where; loss 2 per real row."""
    mask = batch["example_mask"]
    size = mask.shape[0]
    rows = {
        "predictions": jnp.ones(size, jnp.int32),
        "probabilities": jnp.tile(jnp.array([0.25, 0.75]), (size, 1)),
        "first_token": batch["input_ids"][:, 0],
    }
    return {"rows": rows, "loss_sum": 2.0 * mask.sum(), "count": mask.sum()}


def _evaluator() -> evaluation.Evaluator:
    return evaluation.Evaluator(glue.QQP, _echo, sharding.make_mesh(), global_batch_size=8, buckets=(8, 16))


def test_rows_come_back_in_dataset_order_and_are_scored():
    done = _evaluator().evaluate({}, _split())
    np.testing.assert_array_equal(done.rows["first_token"], np.arange(NUM_ROWS) + 100)
    assert done.rows["probabilities"].shape == (NUM_ROWS, 2)
    # Always class 1: accuracy = the 10 odd rows of 21; precision 10/21 and recall 1 give F1 20/31.
    np.testing.assert_allclose(done.scores["accuracy"], 10 / 21)
    np.testing.assert_allclose(done.scores["f1"], 20 / 31)
    assert done.scores["loss"] == 2.0


def test_limit_scores_the_first_rows():
    done = _evaluator().evaluate({}, _split(), limit=6)
    np.testing.assert_array_equal(done.rows["first_token"], np.arange(6) + 100)
    np.testing.assert_allclose(done.scores["accuracy"], 3 / 6)


def test_unlabelled_split_is_predicted_not_scored():
    split = _split(labelled=False)
    done = _evaluator().evaluate({}, split)
    assert done.scores == {} and len(done.rows["predictions"]) == NUM_ROWS
    records = glue.QQP.prediction_records(split, done.rows)
    assert records[3] == {
        "key": "3-key",
        "prediction": 1,
        "prediction_name": "duplicate",
        "probabilities": [0.25, 0.75],
    }


def test_prediction_records_follow_the_file_with_labels():
    split = _split()
    records = glue.QQP.prediction_records(split, _evaluator().evaluate({}, split).rows)
    assert [r["key"] for r in records] == [f"{i}-key" for i in range(NUM_ROWS)]
    assert records[3] == {
        "key": "3-key",
        "prediction": 1,
        "prediction_name": "duplicate",
        "label": 1,
        "label_name": "duplicate",
        "probabilities": [0.25, 0.75],
    }


def test_evaluation_shows_its_own_progress(capsys):
    _evaluator().evaluate({}, _split())
    bar = capsys.readouterr().err
    # 21 rows in batches of 8: a bar of three batches, drawn before the first one runs (tqdm redraws
    # its counts at most every 0.1 s, so on this fast stand-in it may draw no other).
    assert re.search(r"eval dev: .* 0/3 ", bar), bar
