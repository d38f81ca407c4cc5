"""Fixed-shape batches: a fixed global batch size, sequence length padded up to a bucket.

A dataset is a dict of per-row numpy arrays (leading dim N; data/task_spec.py). A batch takes rows of
every array: the token arrays (`TOKEN_ARRAYS`) cut to the batch's length bucket, every other array
whole (a tagging task's word arrays keep their full `max_words` width: a fixed shape, so no extra
compilations, and words need no bucket of their own). `lengths` becomes `attention_mask`, and
`example_mask` marks real rows (1) against the padding rows of the last eval batch (0).

With B fixed and L drawn from `buckets`, a jitted step compiles at most len(buckets) times.
Training batches are a pure function of (seed, step), so resuming needs only the step number.

How training draws its rows (`config.batching.scheme`, `TrainOrder`):
  random          each epoch a fresh permutation, cut into consecutive batches (the default; the
                  runs recorded before the key existed ran this too)
  length_grouped  the same permutation cut into mega-batches of `group_batches` batches; each mega-batch
                  sorted by length and cut into batches, so a batch holds rows of similar length and
                  pads little; then the epoch's batches in a seeded random order. Every row is still
                  seen once per epoch (the same rows as random's), but rows of similar length share
                  batches: a batch's composition follows length. Opt-in: on CoNLL-2003 at 300
                  steps its dev F1 fell below random batches' seed-to-seed spread
                  (benchmarks/RESULTS.md §12).
  packed          random's batches, the same rows in the same steps, with the encoder's input packed
                  several examples per row of max_seq_length tokens (data/packing.py): the encoder
                  computes few padding tokens, and unpacks its outputs to one row per example of
                  max_seq_length tokens, so heads, losses and metrics see random's batch at full width.
                  Packing is exact (per-example positions, attention inside each example): only float
                  summation order and dropout masks differ from random. The batch is packed in G groups,
                  one per device and micro-batch (`groups`; G = global batch / per-device batch), each
                  device's rows holding its own examples; with grad_accum_steps = k > 1 each group
                  holds one micro-batch's examples and the rows are interleaved so that the train
                  step's strided micro-batches each get their own packing (`micro_batches`;
                  packing.py). A phase's train step compiles once per packed row count, at most
                  len(packing.row_buckets(per-device batch)) times (16 at 32 examples a device), and
                  in practice once per count of the phase's row plan (`min_row_share`: 3 on CoNLL-2003).
                  Phases that read cached features run random's batches in `buckets`
                  (`TrainOrder.unpacked`).
Training buckets are every `bucket_tokens` tokens up to max_seq_length (`train_buckets`): a phase's
train step compiles at most ceil(max_seq_length / bucket_tokens) times (8 at 128 tokens in steps of 16).

What a batch's summed loss is divided by (`config.batching.loss_weighting`, `TrainOrder.loss_weighting`):
  batch_mean   the batch's own count of real rows (or, tagging, real words): each batch's mean loss (the
               default, and what the runs recorded before the key existed ran)
  corpus_mean  the count a batch holds on average over the training split (`expected_count`): every
               row or word weighs the same whichever batch it lands in. Under length grouping a batch
               of 32 one-line headlines holds a tenth of the words of a batch of long sentences; with
               batch_mean each of its words would weigh ten times as much.
"""

import dataclasses
from collections.abc import Iterator

import numpy as np

from stackft_jax.data import packing
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


RANDOM, LENGTH_GROUPED, PACKED = "random", "length_grouped", "packed"
SCHEMES = (LENGTH_GROUPED, PACKED, RANDOM)
GROUP_BATCHES = 50  # batches per length-sorted mega-batch (the default of config.batching.group_batches)
BATCH_MEAN, CORPUS_MEAN = "batch_mean", "corpus_mean"
LOSS_WEIGHTINGS = (CORPUS_MEAN, BATCH_MEAN)


def train_buckets(max_seq_length: int, bucket_tokens: int) -> tuple[int, ...]:
    """The training batches' lengths: every `bucket_tokens` tokens up to `max_seq_length` (which ends
    the list), or with 0 the doubling buckets of `length_buckets` (what evaluation uses)."""
    if bucket_tokens == 0:
        return length_buckets(max_seq_length)
    if not 0 < bucket_tokens <= max_seq_length:
        raise ValueError(f"need 0 < bucket_tokens <= max_seq_length, got {bucket_tokens}, {max_seq_length}")
    return (*range(bucket_tokens, max_seq_length, bucket_tokens), max_seq_length)


@dataclasses.dataclass(frozen=True)
class TrainOrder:
    """How a phase's training batches are drawn and weighed (module docstring): `scheme` in SCHEMES, the
    batch lengths `buckets`, for length_grouped the batches per sorted mega-batch, and what a batch's
    summed loss is divided by (`loss_weighting` in LOSS_WEIGHTINGS); for packed, the examples packed
    together (`group_examples`: the per-device batch, one micro-batch's) and the micro-batches a
    train step splits its batch into (`micro_batches`: grad_accum_steps), which the packing's layout
    follows; `min_row_share`: the share of a phase's batches a packed row count must serve to be
    compiled (rarer ones pad up to the next: packing.row_plan; 0, every row bucket), and `row_plan`, the
    phase's counts (`for_phase` sets it)."""

    scheme: str = RANDOM
    buckets: tuple[int, ...] = (128,)
    group_batches: int = GROUP_BATCHES
    loss_weighting: str = BATCH_MEAN
    group_examples: int = 1
    micro_batches: int = 1
    min_row_share: float = 0.0
    row_plan: tuple[int, ...] | None = None

    @classmethod
    def of(
        cls,
        scheme: str,
        *,
        max_seq_length: int,
        bucket_tokens: int,
        group_batches: int,
        loss_weighting: str = BATCH_MEAN,
        per_device_batch_size: int = 1,
        grad_accum_steps: int = 1,
        min_row_share: float = 0.0,
    ) -> "TrainOrder":
        if scheme not in SCHEMES:
            raise ValueError(f"unknown batching scheme {scheme!r}: choose {' or '.join(SCHEMES)}")
        if loss_weighting not in LOSS_WEIGHTINGS:
            choices = " or ".join(LOSS_WEIGHTINGS)
            raise ValueError(f"unknown loss weighting {loss_weighting!r}: choose {choices}")
        buckets = train_buckets(max_seq_length, bucket_tokens)
        # Only packed reads group_examples, micro_batches and min_row_share: the other orders stay equal
        # whatever the batch.
        if scheme != PACKED:
            per_device_batch_size, grad_accum_steps, min_row_share = 1, 1, 0.0
        return cls(
            scheme,
            buckets,
            group_batches,
            loss_weighting,
            per_device_batch_size,
            grad_accum_steps,
            min_row_share,
        )

    def for_phase(self, lengths: np.ndarray, *, global_batch_size: int, seed: int) -> "TrainOrder":
        """This order with the row plan of the phase whose data-order seed is `seed` (packing.row_plan
        over its first PLAN_BATCHES batches: the same for a resumed phase, a finished one's token count
        and one stopped early); unchanged unpacked or without `min_row_share`."""
        if self.scheme != PACKED or self.min_row_share <= 0 or self.row_plan is not None:
            return self
        width, groups = self.buckets[-1], self.groups(global_batch_size)
        batches = first_batches(
            lengths, packing.PLAN_BATCHES, global_batch_size, seed, self.scheme, self.group_batches
        )
        needed = [
            packing.packed_rows(lengths[batch], groups=groups, width=width, micro_batches=self.micro_batches)
            for batch in batches
        ]
        return dataclasses.replace(self, row_plan=packing.row_plan(needed, self.min_row_share))

    def loss_denominator(self, train: Dataset, global_batch_size: int) -> float | None:
        """What the train step divides a batch's summed loss by: None, the batch's own count
        (batch_mean); else `expected_count` (corpus_mean)."""
        return None if self.loss_weighting == BATCH_MEAN else expected_count(train, global_batch_size)

    @property
    def max_compilations(self) -> int:
        """Train-step compilations per phase at most: one per bucket; packed, one per packed row count
        (or per bucket in a phase of cached features, which runs random's batches)."""
        if self.scheme == PACKED:
            return max(len(packing.row_buckets(self.group_examples)), len(self.buckets))
        return len(self.buckets)

    def groups(self, global_batch_size: int) -> int:
        """The groups a packed batch is packed in: one per device and micro-batch (module docstring);
        1 unpacked."""
        if self.scheme != PACKED:
            return 1
        groups, rest = divmod(global_batch_size, self.group_examples)
        if rest or groups % self.micro_batches:
            raise ValueError(
                f"a global batch of {global_batch_size} does not split into {self.micro_batches} "
                f"micro-batch(es) per device of groups of {self.group_examples}"
            )
        return groups

    @property
    def unpacked(self) -> "TrainOrder":
        """The order a phase that reads cached features draws (no encoder runs, nothing to pack):
        random's batches for packed, else this order."""
        if self.scheme != PACKED:
            return self
        return dataclasses.replace(self, scheme=RANDOM, min_row_share=0.0, row_plan=None)


def expected_count(train: Dataset, global_batch_size: int) -> float:
    """The count a training batch holds on average, in the objectives' unit (models/objectives.py): real
    words for a tagging task (its `num_words`), else rows (every training row is real)."""
    per_row = float(np.mean(train["num_words"])) if "num_words" in train else 1.0
    return global_batch_size * per_row


def steps_per_epoch(num_examples: int, global_batch_size: int) -> int:
    """Full batches per epoch; the dropped remainder differs per epoch, as each is reshuffled."""
    if num_examples < global_batch_size:
        raise DataError(
            f"the training set has {num_examples} examples, fewer than one global batch of "
            f"{global_batch_size}; use a smaller batch size or more data"
        )
    return num_examples // global_batch_size


def phase_seed(seed: int, phase_index: int) -> int:
    """The data-order seed of a run's phase: each phase draws its own stream."""
    return seed * 1000 + phase_index


def _epoch_permutation(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


def _epoch_batches(
    lengths: np.ndarray, seed: int, epoch: int, global_batch_size: int, scheme: str, group_batches: int
) -> np.ndarray:
    """[steps_per_epoch, global_batch_size] example indices: row i is the epoch's batch i."""
    per_epoch = steps_per_epoch(len(lengths), global_batch_size)
    rows = _epoch_permutation(len(lengths), seed, epoch)[: per_epoch * global_batch_size]
    if scheme in (RANDOM, PACKED):  # packed: random's batches, packed per batch
        return rows.reshape(per_epoch, global_batch_size)
    if scheme != LENGTH_GROUPED:
        raise ValueError(f"unknown batching scheme {scheme!r}: choose {' or '.join(SCHEMES)}")
    mega = group_batches * global_batch_size
    # A stable sort: rows of one length keep the permutation's random order.
    grouped = np.concatenate(
        [
            chunk[np.argsort(lengths[chunk], kind="stable")]
            for chunk in np.split(rows, range(mega, len(rows), mega))
        ]
    )
    # A second stream of the same (seed, epoch): which sorted batch comes when.
    order = np.random.default_rng([seed, epoch, 1]).permutation(per_epoch)
    return grouped.reshape(per_epoch, global_batch_size)[order]


def first_batches(
    lengths: np.ndarray, steps: int, global_batch_size: int, seed: int, scheme: str, group_batches: int
) -> np.ndarray:
    """[steps, global_batch_size] example indices of a phase's batches 0 .. steps-1, epoch after
    epoch: what `train_batches` draws, from the lengths alone."""
    epochs = -(-steps // steps_per_epoch(len(lengths), global_batch_size))
    return np.concatenate(
        [
            _epoch_batches(lengths, seed, epoch, global_batch_size, scheme, group_batches)
            for epoch in range(epochs)
        ]
    )[:steps]


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
    scheme: str = RANDOM,
    group_batches: int = GROUP_BATCHES,
    groups: int = 1,
    micro_batches: int = 1,
    row_plan: tuple[int, ...] | None = None,
) -> Batch:
    """Batch `step` of the endless shuffled stream; each epoch is a fresh permutation, batched as
    `scheme` says (module docstring); packed in `groups` groups for a step of `micro_batches`, padded
    up to the phase's `row_plan`."""
    epoch, i = divmod(step, steps_per_epoch(num_rows(ds), global_batch_size))
    batches = _epoch_batches(ds["lengths"], seed, epoch, global_batch_size, scheme, group_batches)
    return _train_gather(ds, batches[i], buckets, scheme, groups, micro_batches, row_plan)


def _train_gather(
    ds: Dataset,
    indices: np.ndarray,
    buckets: tuple[int, ...],
    scheme: str,
    groups: int,
    micro_batches: int,
    row_plan: tuple[int, ...] | None = None,
) -> Batch:
    if scheme != PACKED:
        return _gather(ds, indices, buckets)
    # One row per example at full width (one shape, whatever the batch's longest), plus the packing.
    batch = _gather(ds, indices, buckets[-1:])
    return {**batch, **packed_arrays(ds, indices, batch, groups, micro_batches, row_plan)}


def packed_arrays(
    ds: Dataset,
    indices: np.ndarray,
    batch: Batch,
    groups: int,
    micro_batches: int = 1,
    row_plan: tuple[int, ...] | None = None,
) -> Batch:
    """packing.pack of a full-width batch of `indices`; DistilBERT-style data without token types
    packs zeros."""
    token_types = batch.get("token_type_ids", np.zeros_like(batch["input_ids"]))
    lengths = ds["lengths"][indices]
    return packing.pack(
        batch["input_ids"], token_types, lengths, groups=groups, micro_batches=micro_batches, plan=row_plan
    )


def train_batches(
    ds: Dataset,
    *,
    start_step: int,
    global_batch_size: int,
    seed: int,
    buckets: tuple[int, ...],
    scheme: str = RANDOM,
    group_batches: int = GROUP_BATCHES,
    with_index: bool = False,
    groups: int = 1,
    micro_batches: int = 1,
    row_plan: tuple[int, ...] | None = None,
) -> Iterator[Batch]:
    """train_batch(step) for step = start_step, start_step + 1, ... forever. `with_index` adds
    `index`, each row's example (what the feature cache looks features up by)."""
    per_epoch = steps_per_epoch(num_rows(ds), global_batch_size)
    step = start_step
    cached_epoch, batches = None, None
    while True:
        epoch, i = divmod(step, per_epoch)
        if epoch != cached_epoch:
            cached_epoch = epoch
            batches = _epoch_batches(ds["lengths"], seed, epoch, global_batch_size, scheme, group_batches)
        indices = batches[i]
        batch = _train_gather(ds, indices, buckets, scheme, groups, micro_batches, row_plan)
        if with_index:
            batch["index"] = indices.astype(np.int32)
        yield batch
        step += 1


def token_counts(
    lengths: np.ndarray,
    *,
    steps: int,
    global_batch_size: int,
    seed: int,
    order: TrainOrder,
) -> tuple[int, int]:
    """(real tokens, padding tokens) of training batches 0 .. steps-1 of the stream `train_batches`
    draws with `order` (over all hosts): the data order is a pure function
    of the step, so this counts a finished phase exactly from the lengths alone. A packed batch counts
    what its encoder computes: its packed rows of max_seq_length tokens, padded up to the phase's row
    plan (`TrainOrder.for_phase`)."""
    if steps == 0:  # a phase stopped before its first step computed nothing
        return 0, 0
    order = order.for_phase(lengths, global_batch_size=global_batch_size, seed=seed)
    buckets = np.asarray(order.buckets)
    rows = lengths[first_batches(lengths, steps, global_batch_size, seed, order.scheme, order.group_batches)]
    if rows.max() > buckets[-1]:
        raise ValueError(f"an example has {rows.max()} tokens, more than the largest bucket {buckets[-1]}")
    real = int(rows.sum())
    if order.scheme == PACKED:
        width, groups = int(buckets[-1]), order.groups(global_batch_size)
        packed = sum(
            packing.packed_rows(
                batch, groups=groups, width=width, micro_batches=order.micro_batches, plan=order.row_plan
            )
            for batch in rows
        )
        return real, packed * groups * width - real
    # The smallest bucket that fits each batch's longest row, as _gather pads it.
    padded_to = buckets[np.searchsorted(buckets, rows.max(axis=1))]
    return real, int(padded_to.sum()) * global_batch_size - real


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
    """This host's contiguous block of rows of a global batch (multi-host data loading): of each
    array, the `process_index`-th of `process_count` equal blocks of its leading axis. A packed batch's
    packed rows ([G * Rg, L]) and unpack index ([G, B/G, L]) so split by device: each host keeps the
    groups of its own examples (G is the global device count times the micro-batches, and each
    device's rows are one contiguous block; packing.py)."""
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} is outside [0, {process_count})")
    local = {}
    for key, value in batch.items():
        size = len(value)
        if size % process_count:
            raise ValueError(f"global batch of {size} does not split evenly over {process_count} hosts")
        per_host = size // process_count
        local[key] = value[process_index * per_host : (process_index + 1) * per_host]
    return local
