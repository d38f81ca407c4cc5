"""Fixed-shape batches: a fixed global batch size, sequence length padded up to a bucket.

With B fixed and L drawn from `buckets`, a jitted step compiles at most len(buckets) times.
Training batches are a pure function of (seed, step), so resuming needs only the step number.
"""

from collections.abc import Iterator

import numpy as np

from stackft_jax.data.tokenization import TokenizedDataset

Batch = dict[str, np.ndarray]


def length_buckets(max_seq_length: int, min_bucket: int = 32) -> tuple[int, ...]:
    """Doublings of `min_bucket` below `max_seq_length`, then it: 100 -> (32, 64, 100)."""
    if max_seq_length < 1 or min_bucket < 1:
        raise ValueError(
            f"need max_seq_length >= 1 and min_bucket >= 1, got {max_seq_length}, {min_bucket}"
        )
    buckets = []
    length = min_bucket
    while length < max_seq_length:
        buckets.append(length)
        length *= 2
    return (*buckets, max_seq_length)


def steps_per_epoch(num_examples: int, global_batch_size: int) -> int:
    """Full batches per epoch; the dropped remainder differs per epoch, as each is reshuffled."""
    if num_examples < global_batch_size:
        raise ValueError(
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


def _gather(ds: TokenizedDataset, indices: np.ndarray, buckets: tuple[int, ...]) -> Batch:
    lengths = ds.lengths[indices]
    seq_len = _bucket_for(int(lengths.max()), buckets)
    return {
        "input_ids": ds.input_ids[indices, :seq_len],
        "token_type_ids": ds.token_type_ids[indices, :seq_len],
        "attention_mask": (np.arange(seq_len)[None, :] < lengths[:, None]).astype(np.int32),
        "labels": ds.labels[indices],
        "weights": np.ones(len(indices), np.float32),
    }


def train_batch(
    ds: TokenizedDataset,
    *,
    step: int,
    global_batch_size: int,
    seed: int,
    buckets: tuple[int, ...],
) -> Batch:
    """Batch `step` of the endless shuffled stream; each epoch is a fresh permutation."""
    epoch, i = divmod(step, steps_per_epoch(len(ds), global_batch_size))
    permutation = _epoch_permutation(len(ds), seed, epoch)
    return _gather(ds, permutation[i * global_batch_size : (i + 1) * global_batch_size], buckets)


def train_batches(
    ds: TokenizedDataset,
    *,
    start_step: int,
    global_batch_size: int,
    seed: int,
    buckets: tuple[int, ...],
    with_index: bool = False,
) -> Iterator[Batch]:
    """train_batch(step) for step = start_step, start_step + 1, ... forever. `with_index` adds
    `index`, each row's example (what the feature cache looks features up by)."""
    per_epoch = steps_per_epoch(len(ds), global_batch_size)
    step = start_step
    cached_epoch, permutation = None, None
    while True:
        epoch, i = divmod(step, per_epoch)
        if epoch != cached_epoch:
            cached_epoch, permutation = epoch, _epoch_permutation(len(ds), seed, epoch)
        indices = permutation[i * global_batch_size : (i + 1) * global_batch_size]
        batch = _gather(ds, indices, buckets)
        if with_index:
            batch["index"] = indices.astype(np.int32)
        yield batch
        step += 1


def eval_batches(
    ds: TokenizedDataset,
    *,
    global_batch_size: int,
    buckets: tuple[int, ...],
    limit: int | None = None,
) -> Iterator[Batch]:
    """Every example (or the first `limit`) exactly once, longest first to cut padding.

    `index` maps each row back to its example (-1 for padding rows). Padding rows repeat the
    batch's first example with weight 0 rather than being empty, so they cannot produce NaNs
    (e.g. from a fully masked attention row) that a 0 weight would not cancel.
    """
    n = len(ds) if limit is None else min(limit, len(ds))
    # Stable sort on negated length: deterministic, and the largest bucket compiles first.
    order = np.argsort(-ds.lengths[:n], kind="stable").astype(np.int32)
    for start in range(0, n, global_batch_size):
        indices = order[start : start + global_batch_size]
        num_real = len(indices)
        padded = np.concatenate([indices, np.full(global_batch_size - num_real, indices[0])])
        batch = _gather(ds, padded, buckets)
        batch["weights"][num_real:] = 0.0
        batch["index"] = np.concatenate(
            [indices, np.full(global_batch_size - num_real, -1, np.int32)]
        )
        yield batch


def process_slice(batch: Batch, process_index: int, process_count: int) -> Batch:
    """This host's contiguous block of rows of a global batch (multi-host data loading)."""
    size = len(batch["weights"])
    if size % process_count:
        raise ValueError(f"global batch of {size} does not split evenly over {process_count} hosts")
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} is outside [0, {process_count})")
    per_host = size // process_count
    rows = slice(process_index * per_host, (process_index + 1) * per_host)
    return {key: value[rows] for key, value in batch.items()}
