"""A packed batch's encoder input (data/packing.py lays it out) and the gather that unpacks the
encoder's outputs back to one row per example (`BertModel.packed`)."""

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Packed(NamedTuple):
    """input_ids, token_type_ids, positions (within each example), segments (1..k, 0 padding): [R, L]
    packed rows, G groups of R/G rows; unpack_index [G, B/G, Lb]: each example slot's position in its
    group's rows flattened (row * L + column)."""

    input_ids: jax.Array
    token_type_ids: jax.Array
    positions: jax.Array
    segments: jax.Array
    unpack_index: jax.Array

    @classmethod
    def of(cls, batch: dict[str, jax.Array]) -> "Packed":
        """From a batch's `packed_*` and `unpack_index` arrays."""
        return cls(
            batch["packed_input_ids"],
            batch["packed_token_type_ids"],
            batch["packed_positions"],
            batch["packed_segments"],
            batch["unpack_index"],
        )


def unpack(packed_rows: jax.Array, unpack_index: jax.Array) -> jax.Array:
    """[R, L, ...] packed rows -> [B, Lb, ...] one row per example. A gather batched over the G groups
    (the leading axis both share, sharded alike over the devices), so no device reads another's rows."""
    groups, per_group, width = unpack_index.shape
    rows = packed_rows.reshape(groups, -1, *packed_rows.shape[2:])
    index = unpack_index.reshape(groups, per_group * width)
    index = index.reshape(*index.shape, *(1,) * (rows.ndim - 2))
    gathered = jnp.take_along_axis(rows, index, axis=1, mode="promise_in_bounds")
    return gathered.reshape(groups * per_group, width, *packed_rows.shape[2:])
