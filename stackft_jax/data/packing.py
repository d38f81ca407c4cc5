"""Packed training batches: a batch's examples packed several per row of `max_seq_length` tokens, so
the encoder computes few padding tokens, plus the index that unpacks its outputs back to one row per
example (batching.py's `packed` scheme; models/bert.py's `BertModel.packed`).

The batch's B examples are cut into G groups of B/G consecutive examples, G the devices its leading
axis is sharded over: group g's examples are packed into rows of group g only, so each device's
packed rows hold exactly its own examples and unpacking needs no cross-device gather. Each group is
packed first-fit decreasing (longest first, ties by position in the batch): deterministic, so the
batch stays a pure function of (seed, phase, step).

Every group of a batch gets the same row count Rg (the most any group needed), rounded up to a row
bucket (`row_buckets`, quarter octaves below the group's size n = B/G: every count up to 8, then steps
of at most a quarter): at most 4 * ceil(log2 n) + 1 distinct packed shapes (12 at n = 16, 16 at n = 32), so
a phase's train step compiles at most that many times. Measured on the shared data over 300 steps at
one group (benchmarks/grouped_batches.py --offline; the share of computed tokens that are real, and
the distinct row counts hit): CoNLL-2003 at 128 tokens, n = 32: 90.0%, 5 shapes; QQP at 128, n = 16:
86.2%, 4; QQP at 48: 80.0%, 4. A grid of eighths of n (8 shapes) reached 63%, 78%, 80%: the counts a
batch needs sit low (a few rows), where eighths are too coarse; every count 1..n reached the same
shares as quarter octaves at CoNLL and QQP 128 with a bound of n.

Arrays added to a batch (int32; R = G * Rg rows, L = max_seq_length):
    packed_input_ids, packed_token_type_ids   [R, L]  the examples' tokens, back to back
    packed_positions                          [R, L]  position within its example (0, 1, ...)
    packed_segments                           [R, L]  1..k: the row's k-th example; 0: padding
    unpack_index                              [G, B/G, L]  for example token slot t, its slot in the
                                              group's rows flattened (row * L + column); slots past
                                              the example's length point at its first token.
"""

import math

import numpy as np

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


def _group_packings(
    lengths: np.ndarray, groups: int, width: int
) -> tuple[list[tuple[np.ndarray, np.ndarray, int]], int]:
    """Each group's first-fit-decreasing packing and the rows per group (Rg) of the batch: the most any
    group needs, up to its row bucket."""
    per_group = _per_group(len(lengths), groups)
    packings = [first_fit_decreasing(chunk, width) for chunk in lengths.reshape(groups, per_group)]
    buckets = row_buckets(per_group)
    return packings, buckets[np.searchsorted(buckets, max(used for _, _, used in packings))]


def packed_rows(lengths: np.ndarray, *, groups: int, width: int) -> int:
    """Rows per group (Rg) of a batch with `lengths` packed into rows of `width` tokens."""
    return _group_packings(np.maximum(lengths, 1), groups, width)[1]


def pack(
    input_ids: np.ndarray, token_type_ids: np.ndarray, lengths: np.ndarray, *, groups: int
) -> dict[str, np.ndarray]:
    """The `PACKED_ARRAYS` of a batch's [B, L] token arrays and lengths, in `groups` groups (module
    docstring). An example of length 0 takes one (padding) slot, so it still has a first token."""
    batch, width = input_ids.shape
    per_group = _per_group(batch, groups)
    lengths = np.maximum(np.asarray(lengths, np.int64), 1)
    packings, rows_per_group = _group_packings(lengths, groups, width)
    shape = (groups * rows_per_group, width)
    out = {name: np.zeros(shape, np.int32) for name in PACKED_ARRAYS[:-1]}
    unpack = np.zeros((groups, per_group, width), np.int32)
    segment_counts = np.zeros(shape[0], np.int32)
    columns = np.arange(width)
    for g, (rows, offsets, _) in enumerate(packings):
        for j in range(per_group):
            i = g * per_group + j
            length, offset = int(lengths[i]), int(offsets[j])
            r = g * rows_per_group + int(rows[j])
            slots = slice(offset, offset + length)
            out["packed_input_ids"][r, slots] = input_ids[i, :length]
            out["packed_token_type_ids"][r, slots] = token_type_ids[i, :length]
            out["packed_positions"][r, slots] = columns[:length]
            segment_counts[r] += 1
            out["packed_segments"][r, slots] = segment_counts[r]
            first = int(rows[j]) * width + offset
            unpack[g, j] = np.where(columns < length, first + columns, first)
    out["unpack_index"] = unpack
    return out


def _per_group(batch: int, groups: int) -> int:
    if groups < 1 or batch % groups:
        raise ValueError(f"a batch of {batch} examples does not split into {groups} equal groups")
    return batch // groups
