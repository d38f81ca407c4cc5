"""The pieces that let a phase's checkpoints hold only what it trains (checkpointing.py)."""

import jax
import numpy as np
import pytest

from stackft_jax.training import checkpointing


def _params():
    return {
        "backbone": {"layers": {0: {"kernel": np.arange(6.0).reshape(2, 3)}, 1: {"kernel": np.ones((2, 3))}}},
        "head": {"output": {"bias": np.zeros(2), "kernel": np.full((3, 2), 0.5)}},
    }


def _trained(params):
    return jax.tree_util.tree_map_with_path(
        lambda path, _: path[0].key == "head" or (path[0].key == "backbone" and path[2].key == 1), params
    )


def test_the_trained_part_round_trips_by_path():
    params, trained = _params(), _trained(_params())
    part = checkpointing.trained_part(params, trained)
    assert set(part) == {"backbone", "head"} and set(part["backbone"]["layers"]) == {1}
    # A part read back from disk has string keys where the model has integer ones: matched by path.
    on_disk = {"backbone": {"layers": {"1": {"kernel": np.full((2, 3), 7.0)}}}, "head": part["head"]}
    merged = checkpointing.with_trained_part(params, on_disk)
    np.testing.assert_array_equal(merged["backbone"]["layers"][1]["kernel"], 7.0)
    np.testing.assert_array_equal(
        merged["backbone"]["layers"][0]["kernel"], params["backbone"]["layers"][0]["kernel"]
    )
    assert jax.tree.leaves(checkpointing.marks_of(params, on_disk)) == jax.tree.leaves(trained)
    with pytest.raises(ValueError, match="parameters the model does not have.*backbone/layers/2/kernel"):
        checkpointing.with_trained_part(params, {"backbone": {"layers": {"2": {"kernel": np.ones(1)}}}})


def test_the_frozen_fingerprint_sees_every_frozen_bit_and_no_trained_one():
    params, trained = _params(), _trained(_params())
    fingerprint = checkpointing.frozen_fingerprint(params, trained)
    changed_trained = _params()
    changed_trained["head"]["output"]["kernel"][0, 0] += 1.0
    assert checkpointing.frozen_fingerprint(changed_trained, trained) == fingerprint
    one_ulp = _params()
    kernel = one_ulp["backbone"]["layers"][0]["kernel"]
    kernel[1, 2] = np.nextafter(kernel[1, 2], np.inf)
    assert checkpointing.frozen_fingerprint(one_ulp, trained) != fingerprint
    other_dtype = _params()
    other_dtype["backbone"]["layers"][0]["kernel"] = other_dtype["backbone"]["layers"][0]["kernel"].astype(
        np.float32
    )
    assert checkpointing.frozen_fingerprint(other_dtype, trained) != fingerprint
