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


def _flip_bytes_inside_the_largest_file(folder) -> None:
    """Bytes flipped in the middle of a checkpoint's largest file (its raw array data): the file keeps
    its size, and orbax reads it back without an error."""
    largest = max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(largest.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    largest.write_bytes(bytes(data))


def test_a_checkpoint_whose_bytes_changed_is_set_aside_for_the_previous_one(tmp_path, caplog):
    # Random values: orbax compresses its chunks, and noise stays as large as it is.
    kernel = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    params = {"backbone": {"layers": {0: {"kernel": kernel}}}}
    trained = jax.tree.map(lambda _: True, params)
    checkpoints = checkpointing.PhaseCheckpoints(
        tmp_path, "phase1", trained=trained, frozen="none", max_to_keep=3, async_save=False
    )
    for step in (1, 2):
        state = {"params": jax.tree.map(lambda x, s=step: x + s, params), "step": np.array(step, np.int32)}
        checkpoints.save(step, state, {"stop": {}})
    checkpoints.close()
    _flip_bytes_inside_the_largest_file(tmp_path / "checkpoints" / "phase1" / "2" / "state")

    reopened = checkpointing.PhaseCheckpoints(
        tmp_path, "phase1", trained=trained, frozen="none", max_to_keep=3, async_save=False
    )
    abstract = {"params": params, "step": np.zeros((), np.int32)}
    with caplog.at_level("WARNING"):
        step, state, _ = reopened.restore_latest(abstract, params)
    reopened.close()
    assert step == 1 and int(state["step"]) == 1
    np.testing.assert_array_equal(state["params"]["backbone"]["layers"][0]["kernel"], kernel + 1)
    assert "differ from the checksum written when it was saved" in caplog.text
    (moved,) = checkpointing.unreadable_dir(tmp_path).glob("phase1-2-*")
    assert (moved / "state").is_dir()  # kept, not deleted


def test_the_content_digest_reads_string_keys_as_the_integer_keys_saved():
    params = _params()
    on_disk = {
        "backbone": {"layers": {str(k): v for k, v in params["backbone"]["layers"].items()}},
        "head": {"output": {k: v.copy() for k, v in params["head"]["output"].items()}},
    }
    assert checkpointing.content_digest(on_disk) == checkpointing.content_digest(params)
    params["head"]["output"]["bias"][0] = 1.0
    assert checkpointing.content_digest(on_disk) != checkpointing.content_digest(params)
