"""Packed training batches: a batch's examples packed several per row of `max_seq_length` tokens, so
the encoder computes few padding tokens, plus the index that unpacks its outputs back to one row per
example (batching.py's `packed` scheme; models/bert.py's `BertModel.packed`).

The batch's B examples are cut into G groups of B/G examples, one group per device and micro-batch:
group g's examples are packed into rows of group g only, so each device's packed rows hold exactly its
own examples and unpacking needs no cross-device gather. Each group is packed first-fit decreasing
(longest first, ties by position in the batch): deterministic, so the batch stays a pure function of
(seed, phase, step).

With one micro-batch (grad_accum_steps = 1) group g is the B/G consecutive examples of device g. With
k micro-batches, the train step hands micro-batch j the leading-axis rows j, j + k, j + 2k, ... of
every array (training/steps.py), so each of the D = G/k devices holds k groups of n = B/G examples:
group d * k + j holds the examples at positions d * k * n + j + k * i (i = 0 .. n - 1), device d's
share of micro-batch j, and row r of its packed rows sits at row (d * Rg + r) * k + j. The strided split
then hands micro-batch j exactly the packing of its own examples (groups j, k + j, 2k + j, ..., their
rows device by device), and device d's contiguous block of k * Rg rows still holds only its own
examples. With k = 1 both read as the layout above.

Every group of a batch gets the same row count Rg (the most any group needed), rounded up to a row
bucket (`row_buckets`, quarter octaves below the group's size n = B/G, the per-device batch: every
count up to 8, then steps of at most a quarter): at most 4 * ceil(log2 n) + 1 distinct packed shapes
(12 at n = 16, 16 at n = 32), so a phase's train step compiles at most that many times, whatever k.
A phase compiles fewer (`row_plan`, config.batching.min_row_share): the counts that at least that share
of the phase's first `PLAN_BATCHES` batches need, and the largest; a batch needing a rarer count is
padded up to the next planned one (a few empty rows), one needing more than the plan's largest keeps
its own bucket. The plan is a pure function of the lengths and the phase's data order, so a resumed
phase and the token count of a finished one (batching.token_counts) read the same plan.
Measured on the shared data over 300 steps at one group (benchmarks/grouped_batches.py --offline; the
share of computed tokens that are real, and the distinct row counts hit): CoNLL-2003 at 128 tokens,
n = 32: 90.0%, 5 shapes; QQP at 128, n = 16: 86.2%, 4; QQP at 48: 80.0%, 4. A grid of eighths of n
(8 shapes) reached 63%, 78%, 80%: the counts a batch needs sit low (a few rows), where eighths are too
coarse; every count 1..n reached the same shares as quarter octaves at CoNLL and QQP 128 with a bound
of n.

Arrays added to a batch (int32; R = G * Rg rows, L = max_seq_length):
    packed_input_ids, packed_token_type_ids   [R, L]  the examples' tokens, back to back
    packed_positions                          [R, L]  position within its example (0, 1, ...)
    packed_segments                           [R, L]  1, 2, ...: the row's 1st, 2nd, ... example; 0: padding
    unpack_index                              [G, B/G, L]  for example token slot t, its slot in the
                                              group's rows flattened (row * L + column); slots past
                                              the example's length point at its first token.
"""

import math
from collections.abc import Sequence

import numpy as np

# The batches a phase's row plan is read from: its first ones, whatever its length (so a phase stopped
# early and its planned length read the same plan); a phase of fewer steps reads a few epochs ahead.
PLAN_BATCHES = 512

PACKED_ARRAYS = (
    "packed_input_ids",
    "packed_token_type_ids",
    "packed_positions",
    "packed_segments",
    "unpack_index",
)


def row_buckets(group_examples: int) -> tuple[int, ...]:
    """The row counts a group of `group_examples` (n) examples is padded up to: ceil(n / 2^(k/4)) for
    k = 0 .. 4 * ceil(log2 n), so 16 -> 1, 2, ..., 8, 10, 12, 14, 16; the last, n, is the most rows a
    group can need (one example per row)."""
    if group_examples < 1:
        raise ValueError(f"need at least one example per group, got {group_examples}")
    octaves = math.ceil(math.log2(group_examples))
    return tuple(sorted({math.ceil(group_examples / 2 ** (k / 4)) for k in range(4 * octaves + 1)}))


def first_fit_decreasing(lengths: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(row, offset) of each example and the rows used, packing `lengths` (each 1..width) into rows
    of `width` tokens: longest first (ties by position), each into the first row it fits."""
    if len(lengths) and (lengths.min() < 1 or lengths.max() > width):
        raise ValueError(f"packing needs lengths from 1 to {width}, got {lengths.min()}..{lengths.max()}")
    rows = np.zeros(len(lengths), np.int64)
    offsets = np.zeros(len(lengths), np.int64)
    used: list[int] = []  # tokens used per open row
    for i in np.argsort(-lengths, kind="stable"):
        length = int(lengths[i])
        r = next((r for r, fill in enumerate(used) if fill + length <= width), len(used))
        if r == len(used):
            used.append(0)
        rows[i], offsets[i] = r, used[r]
        used[r] += length
    return rows, offsets, len(used)


def group_members(batch: int, groups: int, micro_batches: int = 1) -> np.ndarray:
    """[G, n] batch positions of each group's examples, n = B/G (module docstring): with k micro-batches
    group d * k + j holds positions d * k * n + j + k * i, so the strided micro-batch j (positions j,
    j + k, ...) is groups j, k + j, 2k + j, ...; with k = 1 group g holds positions g * n .. g * n + n - 1."""
    per_group = _per_group(batch, groups)
    if micro_batches < 1 or groups % micro_batches:
        raise ValueError(f"{groups} groups do not split into {micro_batches} micro-batches per device")
    devices = groups // micro_batches
    positions = np.arange(batch).reshape(devices, per_group, micro_batches)
    return positions.transpose(0, 2, 1).reshape(groups, per_group)


def _bucketed(rows: int, buckets: Sequence[int]) -> int:
    """The smallest of `buckets` (sorted) that holds `rows`."""
    return int(buckets[np.searchsorted(buckets, rows)])


def padded_rows(needed: int, plan: Sequence[int] | None) -> int:
    """The rows per group a batch needing `needed` (a row bucket) computes: the smallest count of the
    phase's `plan` that holds it, or `needed` itself without a plan or beyond its largest count."""
    if not plan or needed > plan[-1]:
        return needed
    return _bucketed(needed, plan)


def row_plan(needed: Sequence[int], min_share: float) -> tuple[int, ...]:
    """The row counts a phase compiles, from the counts its batches need (`needed`, row buckets): each
    one that at least `min_share` of them need, and the largest."""
    counts, uses = np.unique(np.asarray(needed), return_counts=True)
    kept = {int(c) for c, n in zip(counts, uses, strict=True) if n >= min_share * len(needed)}
    return tuple(sorted(kept | {int(counts[-1])}))


def _group_packings(
    lengths: np.ndarray, members: np.ndarray, width: int, plan: Sequence[int] | None = None
) -> tuple[list[tuple[np.ndarray, np.ndarray, int]], int]:
    """Each group's first-fit-decreasing packing and the rows per group (Rg) of the batch: the most any
    group needs, up to its row bucket, then up to the phase's `plan` (`padded_rows`)."""
    packings = [first_fit_decreasing(lengths[group], width) for group in members]
    needed = _bucketed(max(used for _, _, used in packings), row_buckets(members.shape[1]))
    return packings, padded_rows(needed, plan)


def packed_rows(
    lengths: np.ndarray, *, groups: int, width: int, micro_batches: int = 1, plan: Sequence[int] | None = None
) -> int:
    """Rows per group (Rg) of a batch with `lengths` packed into rows of `width` tokens (padded up to
    the phase's `plan`, if any)."""
    members = group_members(len(lengths), groups, micro_batches)
    return _group_packings(np.maximum(lengths, 1), members, width, plan)[1]


def pack(
    input_ids: np.ndarray,
    token_type_ids: np.ndarray,
    lengths: np.ndarray,
    *,
    groups: int,
    micro_batches: int = 1,
    plan: Sequence[int] | None = None,
) -> dict[str, np.ndarray]:
    """The `PACKED_ARRAYS` of a batch's [B, L] token arrays and lengths, in `groups` groups, for a step
    of `micro_batches` strided micro-batches, with the rows per group padded up to the phase's row
    `plan` (module docstring). An example of length 0 takes one (padding) slot, so it still has a first
    token."""
    batch, width = input_ids.shape
    members = group_members(batch, groups, micro_batches)
    lengths = np.maximum(np.asarray(lengths, np.int64), 1)
    packings, rows_per_group = _group_packings(lengths, members, width, plan)
    # Laid out by group first ([G, Rg, L], group d * k + j), interleaved below.
    shape = (groups, rows_per_group, width)
    out = {name: np.zeros(shape, np.int32) for name in PACKED_ARRAYS[:-1]}
    unpack = np.zeros((*members.shape, width), np.int32)
    segment_counts = np.zeros(shape[:2], np.int32)
    columns = np.arange(width)
    for g, (rows, offsets, _) in enumerate(packings):
        for j, i in enumerate(members[g]):
            length, offset, r = int(lengths[i]), int(offsets[j]), int(rows[j])
            slots = slice(offset, offset + length)
            out["packed_input_ids"][g, r, slots] = input_ids[i, :length]
            out["packed_token_type_ids"][g, r, slots] = token_type_ids[i, :length]
            out["packed_positions"][g, r, slots] = columns[:length]
            segment_counts[g, r] += 1
            out["packed_segments"][g, r, slots] = segment_counts[g, r]
            first = r * width + offset
            unpack[g, j] = np.where(columns < length, first + columns, first)
    # Row r of group d * k + j goes to row (d * Rg + r) * k + j: the strided split of the rows hands
    # micro-batch j its groups' rows, device by device; each device's block still holds only its own
    # examples. With k = 1, the groups' rows back to back.
    devices = groups // micro_batches
    for name, rows in out.items():
        interleaved = rows.reshape(devices, micro_batches, rows_per_group, width).transpose(0, 2, 1, 3)
        out[name] = np.ascontiguousarray(interleaved.reshape(groups * rows_per_group, width))
    out["unpack_index"] = unpack
    return out


def _per_group(batch: int, groups: int) -> int:
    if groups < 1 or batch % groups:
        raise ValueError(f"a batch of {batch} examples does not split into {groups} equal groups")
    return batch // groups
