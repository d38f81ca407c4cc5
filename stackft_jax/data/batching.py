"""Fixed-shape batches: a fixed global batch size, sequence length padded up to a bucket.

A dataset is a dict of per-row numpy arrays (leading dim N; data/task_spec.py). A batch takes rows of
every array: the token arrays (`TOKEN_ARRAYS`) cut to the batch's length bucket, every other array
whole (a tagging task's word arrays keep their full `max_words` width: a fixed shape, so no extra
compilations, and words need no bucket of their own). `lengths` becomes `attention_mask`, and
`example_mask` marks real rows (1) against the padding rows of the last eval batch (0).

With B fixed and L drawn from `buckets`, a jitted step compiles at most len(buckets) times.
Training batches are a pure function of (seed, step), so resuming needs only the step number.
"""

from collections.abc import Iterator

import numpy as np

from stackft_jax.runtime.cli_errors import DataError

Dataset = dict[str, np.ndarray]
Batch = dict[str, np.ndarray]
# [N, max_seq_length] arrays, cut to the length bucket.
TOKEN_ARRAYS = ("input_ids", "token_type_ids", "segment_ids")


def length_buckets(max_seq_length: int, min_bucket: int = 32) -> tuple[int, ...]:
    """Doublings of `min_bucket` below `max_seq_length`, then it: 100 -> (32, 64, 100)."""
    if max_seq_length < 1 or min_bucket < 1:
        raise ValueError(f"need max_seq_length >= 1 and min_bucket >= 1, got {max_seq_length}, {min_bucket}")
    buckets = []
    length = min_bucket
    while length < max_seq_length:
        buckets.append(length)
        length *= 2
    return (*buckets, max_seq_length)


def steps_per_epoch(num_examples: int, global_batch_size: int) -> int:
    """Full batches per epoch; the dropped remainder differs per epoch, as each is reshuffled."""
    if num_examples < global_batch_size:
        raise DataError(
            f"the training set has {num_examples} examples, fewer than one global batch of "
            f"{global_batch_size}; use a smaller batch size or more data"
        )
    return num_examples // global_batch_size


def _epoch_permutation(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


def _bucket_for(length: int, buckets: tuple[int, ...]) -> int:
    for bucket in buckets:
        if length <= bucket:
            return bucket
    raise ValueError(f"an example has {length} tokens, more than the largest bucket {buckets[-1]}")


def num_rows(ds: Dataset) -> int:
    return len(ds["lengths"])


def _gather(ds: Dataset, indices: np.ndarray, buckets: tuple[int, ...]) -> Batch:
    lengths = ds["lengths"][indices]
    seq_len = _bucket_for(int(lengths.max()), buckets)
    batch = {
        key: value[indices, :seq_len] if key in TOKEN_ARRAYS else value[indices]
        for key, value in ds.items()
        if key != "lengths"
    }
    batch["attention_mask"] = (np.arange(seq_len)[None, :] < lengths[:, None]).astype(np.int32)
    batch["example_mask"] = np.ones(len(indices), np.float32)
    return batch


def train_batch(
    ds: Dataset,
    *,
    step: int,
    global_batch_size: int,
    seed: int,
    buckets: tuple[int, ...],
) -> Batch:
    """Batch `step` of the endless shuffled stream; each epoch is a fresh permutation."""
    epoch, i = divmod(step, steps_per_epoch(num_rows(ds), global_batch_size))
    permutation = _epoch_permutation(num_rows(ds), seed, epoch)
    return _gather(ds, permutation[i * global_batch_size : (i + 1) * global_batch_size], buckets)


def train_batches(
    ds: Dataset,
    *,
    start_step: int,
    global_batch_size: int,
    seed: int,
    buckets: tuple[int, ...],
    with_index: bool = False,
) -> Iterator[Batch]:
    """train_batch(step) for step = start_step, start_step + 1, ... forever. `with_index` adds
    `index`, each row's example (what the feature cache looks features up by)."""
    per_epoch = steps_per_epoch(num_rows(ds), global_batch_size)
    step = start_step
    cached_epoch, permutation = None, None
    while True:
        epoch, i = divmod(step, per_epoch)
        if epoch != cached_epoch:
            cached_epoch, permutation = epoch, _epoch_permutation(num_rows(ds), seed, epoch)
        indices = permutation[i * global_batch_size : (i + 1) * global_batch_size]
        batch = _gather(ds, indices, buckets)
        if with_index:
            batch["index"] = indices.astype(np.int32)
        yield batch
        step += 1


def eval_batches(
    ds: Dataset,
    *,
    global_batch_size: int,
    buckets: tuple[int, ...],
    limit: int | None = None,
) -> Iterator[Batch]:
    """Every example (or the first `limit`) exactly once, longest first to cut padding.

    `index` maps each row back to its example (-1 for padding rows). Padding rows repeat the
    batch's first example with `example_mask` 0 rather than being empty, so they cannot produce NaNs
    (e.g. from a fully masked attention row) that a 0 mask would not cancel.
    """
    n = num_rows(ds) if limit is None else min(limit, num_rows(ds))
    # Stable sort on negated length: deterministic, and the largest bucket compiles first.
    order = np.argsort(-ds["lengths"][:n], kind="stable").astype(np.int32)
    for start in range(0, n, global_batch_size):
        indices = order[start : start + global_batch_size]
        num_real = len(indices)
        padded = np.concatenate([indices, np.full(global_batch_size - num_real, indices[0])])
        batch = _gather(ds, padded, buckets)
        batch["example_mask"][num_real:] = 0.0
        batch["index"] = np.concatenate([indices, np.full(global_batch_size - num_real, -1, np.int32)])
        yield batch


def process_slice(batch: Batch, process_index: int, process_count: int) -> Batch:
    """This host's contiguous block of rows of a global batch (multi-host data loading)."""
    size = len(batch["example_mask"])
    if size % process_count:
        raise ValueError(f"global batch of {size} does not split evenly over {process_count} hosts")
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} is outside [0, {process_count})")
    per_host = size // process_count
    rows = slice(process_index * per_host, (process_index + 1) * per_host)
    return {key: value[rows] for key, value in batch.items()}
