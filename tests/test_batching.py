"""Fixed-shape batching on a synthetic dataset whose rows identify themselves."""

import numpy as np
import pytest

from stackft_jax.data import batching

KEYS = {"input_ids", "token_type_ids", "segment_ids", "attention_mask", "labels", "example_mask"}
BUCKETS = (32, 64, 128)


def make_dataset(n: int, max_seq_length: int = 128, seed: int = 0) -> batching.Dataset:
    """Row i is filled with token i + 1 up to its length, so a batch row names its example."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, max_seq_length + 1, size=n).astype(np.int32)
    lengths[: n // 2] = rng.integers(3, 20, size=n // 2)  # many short rows, as in real data
    positions = np.arange(max_seq_length)[None, :]
    real = positions < lengths[:, None]
    input_ids = np.where(real, np.arange(1, n + 1)[:, None], 0).astype(np.int32)
    token_type_ids = (real & (positions >= lengths[:, None] // 2)).astype(np.int32)
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "segment_ids": (token_type_ids + 1) * real,
        "lengths": lengths,
        "labels": np.arange(n, dtype=np.int32),
    }


def check_batch(batch: dict, ds: batching.Dataset, batch_size: int) -> np.ndarray:
    """Checks shapes and internal consistency; returns the example index of each row."""
    assert set(batch) - {"index"} == KEYS | set(ds) - {"lengths"}
    seq_len = batch["input_ids"].shape[1]
    assert seq_len in BUCKETS
    for key in ("input_ids", "token_type_ids", "segment_ids", "attention_mask"):
        assert batch[key].shape == (batch_size, seq_len) and batch[key].dtype == np.int32
    assert batch["example_mask"].dtype == np.float32 and batch["example_mask"].shape == (batch_size,)
    rows = batch["labels"]
    lengths = ds["lengths"][rows]
    assert (batch["attention_mask"].sum(axis=1) == lengths).all()
    # The smallest bucket that fits the longest row.
    assert seq_len == min(b for b in BUCKETS if b >= lengths.max())
    np.testing.assert_array_equal(batch["input_ids"], ds["input_ids"][rows, :seq_len])
    np.testing.assert_array_equal(batch["token_type_ids"], ds["token_type_ids"][rows, :seq_len])
    np.testing.assert_array_equal(batch["segment_ids"], ds["segment_ids"][rows, :seq_len])
    return rows


@pytest.mark.parametrize(
    "max_seq_length, min_bucket, expected",
    [
        (128, 32, (32, 64, 128)),
        (100, 32, (32, 64, 100)),
        (512, 32, (32, 64, 128, 256, 512)),
        (32, 32, (32,)),
        (16, 32, (16,)),
        (64, 16, (16, 32, 64)),
    ],
)
def test_length_buckets(max_seq_length, min_bucket, expected):
    assert batching.length_buckets(max_seq_length, min_bucket) == expected


def test_steps_per_epoch_drops_remainder_and_rejects_tiny_sets():
    assert batching.steps_per_epoch(50, 8) == 6
    assert batching.steps_per_epoch(8, 8) == 1
    with pytest.raises(ValueError, match=r"7 examples.*batch of 8"):
        batching.steps_per_epoch(7, 8)


def test_train_batch_is_a_pure_function_of_seed_and_step():
    ds = make_dataset(48)
    kwargs = dict(global_batch_size=8, seed=3, buckets=BUCKETS)
    a = batching.train_batch(ds, step=4, **kwargs)
    b = batching.train_batch(ds, step=4, **kwargs)
    assert set(a) == KEYS
    for key in KEYS:
        np.testing.assert_array_equal(a[key], b[key])
    check_batch(a, ds, 8)
    assert (a["example_mask"] == 1).all()
    other_seed = batching.train_batch(ds, step=4, global_batch_size=8, seed=4, buckets=BUCKETS)
    assert not np.array_equal(a["labels"], other_seed["labels"])


def test_every_example_once_per_epoch_and_epochs_differ():
    ds = make_dataset(48)
    kwargs = dict(global_batch_size=8, seed=0, buckets=BUCKETS)
    epochs = [
        np.concatenate([check_batch(batching.train_batch(ds, step=s, **kwargs), ds, 8) for s in steps])
        for steps in (range(0, 6), range(6, 12))
    ]
    for order in epochs:
        assert sorted(order.tolist()) == list(range(48))
    assert not np.array_equal(epochs[0], epochs[1])


def test_remainder_is_dropped_without_repeats():
    ds = make_dataset(50)
    rows = np.concatenate(
        [
            batching.train_batch(ds, step=s, global_batch_size=8, seed=1, buckets=BUCKETS)["labels"]
            for s in range(6)
        ]
    )
    assert len(set(rows.tolist())) == 48


def test_train_batches_resumes_bit_exactly_across_epochs():
    ds = make_dataset(50)
    kwargs = dict(global_batch_size=8, seed=5, buckets=BUCKETS)
    stream = batching.train_batches(ds, start_step=4, **kwargs)
    for step in range(4, 16):  # crosses the epoch boundaries at steps 6 and 12
        expected = batching.train_batch(ds, step=step, **kwargs)
        got = next(stream)
        for key in KEYS:
            np.testing.assert_array_equal(got[key], expected[key])


def test_eval_covers_every_example_once_with_a_padded_last_batch():
    ds = make_dataset(50)
    batches = list(batching.eval_batches(ds, global_batch_size=8, buckets=BUCKETS))
    assert len(batches) == 7
    for batch in batches:
        assert set(batch) == KEYS | {"index"} and batch["index"].dtype == np.int32
        rows = check_batch(batch, ds, 8)
        real = batch["index"] >= 0
        np.testing.assert_array_equal(batch["example_mask"], real.astype(np.float32))
        np.testing.assert_array_equal(rows[real], batch["index"][real])
    index = np.concatenate([b["index"] for b in batches])
    assert sorted(index[index >= 0].tolist()) == list(range(50))
    last = batches[-1]
    assert last["example_mask"].tolist() == [1, 1] + [0] * 6
    assert last["index"][2:].tolist() == [-1] * 6


def test_eval_limit_takes_the_first_examples():
    ds = make_dataset(50)
    batches = list(batching.eval_batches(ds, global_batch_size=4, buckets=BUCKETS, limit=10))
    assert len(batches) == 3
    index = np.concatenate([b["index"] for b in batches])
    assert sorted(index[index >= 0].tolist()) == list(range(10))
    assert sum(b["example_mask"].sum() for b in batches) == 10


def test_batch_shapes_are_bounded_by_the_buckets():
    ds = make_dataset(300, seed=2)
    shapes = set()
    for _, batch in zip(
        range(100),
        batching.train_batches(ds, start_step=0, global_batch_size=4, seed=0, buckets=BUCKETS),
        strict=False,
    ):
        shapes.add(batch["input_ids"].shape)
    for batch in batching.eval_batches(ds, global_batch_size=4, buckets=BUCKETS):
        shapes.add(batch["input_ids"].shape)
    assert shapes <= {(4, b) for b in BUCKETS}
    assert len(shapes) > 1  # short rows really do get a smaller bucket


def test_process_slice_partitions_the_global_batch():
    ds = make_dataset(48)
    batch = next(batching.eval_batches(ds, global_batch_size=8, buckets=BUCKETS))
    slices = [batching.process_slice(batch, i, 4) for i in range(4)]
    for key in batch:
        assert all(s[key].shape[0] == 2 for s in slices)
        np.testing.assert_array_equal(np.concatenate([s[key] for s in slices]), batch[key])
    with pytest.raises(ValueError, match="does not split evenly"):
        batching.process_slice(batch, 0, 3)


def test_word_arrays_are_sliced_by_row_and_kept_whole():
    """A tagging task's per-word arrays ride along: rows like every array, full `max_words` width
    whatever the length bucket; `lengths` becomes `attention_mask`."""
    ds = make_dataset(20)
    max_words = 126
    ds["word_starts"] = np.arange(20 * max_words, dtype=np.int32).reshape(20, max_words)
    ds["num_words"] = np.arange(20, dtype=np.int32)
    for batch in batching.eval_batches(ds, global_batch_size=8, buckets=BUCKETS):
        rows = check_batch(batch, ds, 8)
        assert "lengths" not in batch
        np.testing.assert_array_equal(batch["word_starts"], ds["word_starts"][rows])
        np.testing.assert_array_equal(batch["num_words"], rows)
