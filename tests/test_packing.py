"""batching.scheme=packed (data/packing.py, BertModel.packed): the layout (every token once, groups local
to their devices, deterministic, bounded shapes; with micro-batches, each strided micro-batch its own
packing), the encoder over packed rows equal to the unpacked encoder on every example, layer and family,
a packed train step equal to the unpacked one on 1 and 8 devices, with and without gradient
accumulation, and a run end to end."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import tiny
from stackft_jax.config import config_cli, spec
from stackft_jax.data import batching, packing
from stackft_jax.models import bert
from stackft_jax.models.packed import Packed, unpack
from stackft_jax.runtime import sharding
from stackft_jax.runtime.cli_errors import ConfigError
from stackft_jax.training import steps, train
from tests.test_attention import assert_trees_close
from tests.test_batching import make_dataset
from tests.test_grad_accum import _phase_step, _setup

WIDTH = 32


def _packed_batch(lengths, groups: int, width: int = WIDTH, seed: int = 0) -> dict[str, np.ndarray]:
    """Full-width per-example arrays of `lengths` (token i + 1 ... names example i) and their packing."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths)
    real = np.arange(width)[None] < lengths[:, None]
    ids = (rng.integers(3, 120, (len(lengths), width)) * real).astype(np.int32)
    types = (real & (np.arange(width)[None] >= lengths[:, None] // 2)).astype(np.int32)
    batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": real.astype(np.int32)}
    return {**batch, **packing.pack(ids, types, lengths, groups=groups)}


def _unpack_np(batch: dict[str, np.ndarray], key: str) -> np.ndarray:
    return np.asarray(unpack(jnp.asarray(batch[key]), jnp.asarray(batch["unpack_index"])))


# The layout.


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_every_token_lands_once_inside_its_group_and_unpacks_to_its_example(groups):
    rng = np.random.default_rng(groups)
    lengths = rng.integers(1, WIDTH + 1, 16)
    lengths[:6] = rng.integers(1, 8, 6)
    batch = _packed_batch(lengths, groups)
    rows = batch["packed_input_ids"]
    assert rows.shape[1] == WIDTH and rows.shape[0] % groups == 0
    per_group_rows, per_group = rows.shape[0] // groups, 16 // groups
    assert per_group_rows in packing.row_buckets(per_group)
    real = batch["attention_mask"].astype(bool)
    # Unpacking gives every example its own tokens, token types and positions 0..length-1.
    np.testing.assert_array_equal(_unpack_np(batch, "packed_input_ids")[real], batch["input_ids"][real])
    np.testing.assert_array_equal(
        _unpack_np(batch, "packed_token_type_ids")[real], batch["token_type_ids"][real]
    )
    positions = np.broadcast_to(np.arange(WIDTH), real.shape)
    np.testing.assert_array_equal(_unpack_np(batch, "packed_positions")[real], positions[real])
    # Each real slot is used once, and the packed rows hold the real tokens and nothing else.
    index = batch["unpack_index"]
    assert index.max() < per_group_rows * WIDTH
    for g in range(groups):
        slots = index[g][real[g * per_group : (g + 1) * per_group]]
        assert len(set(slots.tolist())) == len(slots)
        segments = batch["packed_segments"][g * per_group_rows : (g + 1) * per_group_rows].reshape(-1)
        assert set(np.flatnonzero(segments).tolist()) == set(slots.tolist())
    # Within a row, segments number its examples 1..k, one contiguous run each.
    for row in batch["packed_segments"]:
        runs = [int(s) for i, s in enumerate(row) if s and (i == 0 or row[i - 1] != s)]
        assert sorted(runs) == list(range(1, len(runs) + 1))
    again = _packed_batch(lengths, groups)
    for key in packing.PACKED_ARRAYS:
        np.testing.assert_array_equal(again[key], batch[key])


def _strided(x: np.ndarray, k: int, j: int) -> np.ndarray:
    """Micro-batch j of k as the train step splits an array (steps._accumulated): rows j, j + k, ..."""
    return np.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)[j]


@pytest.mark.parametrize(("devices", "k"), [(1, 2), (2, 2), (2, 4)])
def test_each_strided_micro_batch_is_the_packing_of_its_own_examples_on_its_own_devices(devices, k):
    rng = np.random.default_rng(10 * devices + k)
    lengths = rng.integers(1, WIDTH + 1, 16)
    lengths[rng.permutation(16)[:8]] = rng.integers(1, 6, 8)  # short ones to share rows
    per_device = 16 // devices
    # Token t of example i is 100 * (i + 1) + t: every packed token names its example.
    ids = (100 * np.arange(1, 17)[:, None] + np.arange(WIDTH)[None]).astype(np.int32)
    ids = ids * (np.arange(WIDTH)[None] < lengths[:, None])
    types = (np.arange(WIDTH)[None] >= lengths[:, None] // 2).astype(np.int32) * (ids > 0)
    batch = {"input_ids": ids, "token_type_ids": types}
    batch |= packing.pack(ids, types, lengths, groups=devices * k, micro_batches=k)
    rows_per_group = batch["packed_input_ids"].shape[0] // (devices * k)
    assert rows_per_group in packing.row_buckets(per_device // k)
    assert batch["unpack_index"].shape == (devices * k, per_device // k, WIDTH)
    seen = []
    for j in range(k):
        micro = {key: _strided(value, k, j) for key, value in batch.items()}
        real = micro["input_ids"] > 0
        # The micro-batch unpacks to its own examples ...
        for key in ("input_ids", "token_type_ids"):
            np.testing.assert_array_equal(_unpack_np(micro, f"packed_{key}")[real], micro[key][real])
        # ... and is what packing those examples alone gives, up to the rows the other micro-batches'
        # groups needed beyond its own (padding).
        alone = packing.pack(micro["input_ids"], micro["token_type_ids"], lengths[j::k], groups=devices)
        np.testing.assert_array_equal(micro["unpack_index"], alone["unpack_index"])
        for key in packing.PACKED_ARRAYS[:-1]:
            ours = micro[key].reshape(devices, rows_per_group, WIDTH)
            theirs = alone[key].reshape(devices, -1, WIDTH)
            np.testing.assert_array_equal(ours[:, : theirs.shape[1]], theirs)
            assert not ours[:, theirs.shape[1] :].any()
        seen += [int(t) // 100 - 1 for t in micro["packed_input_ids"].ravel() if t]
    # Every token of every example once, over the micro-batches.
    assert sorted(seen) == sorted(np.repeat(np.arange(16), lengths).tolist())
    # Each device's block of rows holds its own examples only, so a host keeps its own (process_slice).
    for d in range(devices):
        local = batching.process_slice(batch, d, devices)
        owners = {int(t) // 100 - 1 for t in local["packed_input_ids"].ravel() if t}
        assert owners == set(range(d * per_device, (d + 1) * per_device))
        for j in range(k):
            micro = {key: _strided(value, k, j) for key, value in local.items()}
            real = micro["input_ids"] > 0
            unpacked = _unpack_np(micro, "packed_input_ids")
            np.testing.assert_array_equal(unpacked[real], micro["input_ids"][real])
    # One micro-batch: the layout without micro-batches, array for array.
    plain = packing.pack(ids, types, lengths, groups=devices)
    for key, value in packing.pack(ids, types, lengths, groups=devices, micro_batches=1).items():
        np.testing.assert_array_equal(value, plain[key])


def test_first_fit_decreasing_and_the_row_buckets():
    rows, offsets, used = packing.first_fit_decreasing(np.array([3, 8, 5, 5, 2]), 10)
    # 8 -> row 0; 5 (first) -> row 1; 5 -> row 1; 3 -> row 2; 2 -> row 0.
    assert used == 3
    np.testing.assert_array_equal(rows, [2, 0, 1, 1, 0])
    np.testing.assert_array_equal(offsets, [0, 0, 0, 5, 8])
    assert packing.row_buckets(16) == (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)
    for n in (1, 2, 5, 16, 32, 64, 100):
        buckets = packing.row_buckets(n)
        assert buckets[-1] == n and len(buckets) <= 4 * int(np.ceil(np.log2(max(n, 2)))) + 1
        # Rounding a needed row count up to its bucket adds at most a quarter.
        for needed in range(1, n + 1):
            assert needed <= buckets[np.searchsorted(buckets, needed)] <= 1.25 * needed


def test_packed_batches_are_random_batches_and_process_slice_keeps_each_hosts_groups():
    ds = make_dataset(200, max_seq_length=64, seed=3)
    buckets = batching.train_buckets(64, 16)
    common = {"global_batch_size": 16, "seed": 5, "buckets": buckets}
    for step in (0, 11, 13):  # 12 steps an epoch: the second epoch too
        plain = batching.train_batch(ds, step=step, **common)
        packed = batching.train_batch(ds, step=step, scheme=batching.PACKED, groups=4, **common)
        np.testing.assert_array_equal(packed["labels"], plain["labels"])  # the same examples, in order
        assert packed["input_ids"].shape == (16, 64)  # one row per example, at full width
        halves = [batching.process_slice(packed, host, 2) for host in range(2)]
        for host, local in enumerate(halves):
            np.testing.assert_array_equal(local["labels"], plain["labels"][host * 8 : (host + 1) * 8])
            # The host's packed rows unpack to its own examples with its own index.
            real = local["attention_mask"].astype(bool)
            np.testing.assert_array_equal(
                _unpack_np(local, "packed_input_ids")[real], local["input_ids"][real]
            )
    stream = batching.train_batches(ds, start_step=11, scheme=batching.PACKED, groups=4, **common)
    resumed = [next(stream) for _ in range(3)]
    for step, batch in zip((11, 12, 13), resumed, strict=True):
        again = batching.train_batch(ds, step=step, scheme=batching.PACKED, groups=4, **common)
        for key in batch:
            np.testing.assert_array_equal(batch[key], again[key])


def test_token_counts_count_the_packed_rows_computed():
    ds = make_dataset(300, seed=2)
    buckets = batching.train_buckets(128, 16)
    order = batching.TrainOrder(batching.PACKED, buckets, group_examples=4)
    real, padding = batching.token_counts(ds["lengths"], steps=50, global_batch_size=8, seed=1, order=order)
    stream = batching.train_batches(
        ds, start_step=0, global_batch_size=8, seed=1, buckets=buckets, scheme=batching.PACKED, groups=2
    )
    batches = [next(stream) for _ in range(50)]
    assert real == sum(int(b["attention_mask"].sum()) for b in batches)
    assert real + padding == sum(b["packed_input_ids"].size for b in batches)
    random_real, random_padding = batching.token_counts(
        ds["lengths"], steps=50, global_batch_size=8, seed=1, order=order.unpacked
    )
    assert random_real == real and random_padding > padding
    # With micro-batches: the rows packed per (device, micro-batch) group.
    order = dataclasses.replace(order, group_examples=2, micro_batches=2)
    assert order.groups(8) == 4
    real, padding = batching.token_counts(ds["lengths"], steps=20, global_batch_size=8, seed=1, order=order)
    stream = batching.train_batches(
        ds,
        start_step=0,
        global_batch_size=8,
        seed=1,
        buckets=buckets,
        scheme=batching.PACKED,
        groups=4,
        micro_batches=2,
    )
    batches = [next(stream) for _ in range(20)]
    assert real == sum(int(b["attention_mask"].sum()) for b in batches)
    assert real + padding == sum(b["packed_input_ids"].size for b in batches)


def test_the_row_plan_keeps_the_common_counts_and_the_largest_and_pads_the_rest_up():
    needed = [5] * 140 + [6] * 138 + [4] * 10 + [7] * 11 + [8]  # CoNLL-2003's 300 batches (RESULTS §15)
    assert packing.row_plan(needed, 0.05) == (5, 6, 8)
    assert packing.row_plan(needed, 0.0) == (4, 5, 6, 7, 8)
    assert packing.row_plan([3, 3, 3, 9], 0.5) == (3, 9)  # the largest is kept however rare
    assert [packing.padded_rows(n, (5, 6, 8)) for n in (4, 5, 6, 7, 8)] == [5, 5, 6, 8, 8]
    # Beyond the plan (a later batch of a long phase), or without one, a batch keeps its own bucket.
    assert packing.padded_rows(10, (5, 6, 8)) == 10 and packing.padded_rows(4, None) == 4


def test_a_phase_pads_rare_row_counts_up_to_its_plan_and_counts_what_it_computes():
    # Lengths that need many row counts: most batches few rows, some many.
    rng = np.random.default_rng(4)
    lengths = np.where(rng.random(400) < 0.85, rng.integers(2, 20, 400), rng.integers(60, 129, 400))
    ds = make_dataset(400, seed=4)
    real_tokens = np.arange(128)[None] < lengths[:, None]
    ds = {**ds, "lengths": lengths.astype(np.int32), "attention_mask": real_tokens.astype(np.int32)}
    for key in ("input_ids", "token_type_ids"):
        ds[key] = (ds[key] * real_tokens).astype(np.int32)
    buckets = batching.train_buckets(128, 16)
    every = batching.TrainOrder(batching.PACKED, buckets, group_examples=16)
    order = dataclasses.replace(every, min_row_share=0.1).for_phase(lengths, global_batch_size=16, seed=3)
    assert every.for_phase(lengths, global_batch_size=16, seed=3) is every  # no share, no plan
    # The counts the phase's first PLAN_BATCHES batches need (25 batches an epoch).
    needed = [
        packing.packed_rows(lengths[b], groups=1, width=128)
        for epoch in range(packing.PLAN_BATCHES // 25 + 1)
        for b in batching._epoch_batches(lengths, 3, epoch, 16, batching.PACKED, 50)
    ][: packing.PLAN_BATCHES]
    assert len(order.row_plan) < len(set(needed))  # fewer compilations than the buckets needed
    assert set(order.row_plan) <= set(needed) and max(order.row_plan) == max(needed)

    def stream(start_step: int):
        return batching.train_batches(
            ds,
            start_step=start_step,
            global_batch_size=16,
            seed=3,
            buckets=buckets,
            scheme=batching.PACKED,
            row_plan=order.row_plan,
        )

    batches = [batch for batch, _ in zip(stream(0), range(60), strict=False)]
    assert {b["packed_input_ids"].shape[0] for b in batches} <= set(order.row_plan)
    for batch in batches:  # padding rows only: every example still unpacks to its own tokens
        real = batch["attention_mask"].astype(bool)
        np.testing.assert_array_equal(_unpack_np(batch, "packed_input_ids")[real], batch["input_ids"][real])
    # A resumed phase replays the same padded batches; the token count reads the same plan.
    for a, b in zip(batches[37:40], [next(s) for s in [stream(37)] for _ in range(3)], strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    unplanned = dataclasses.replace(order, row_plan=None)
    real, padding = batching.token_counts(lengths, steps=60, global_batch_size=16, seed=3, order=unplanned)
    assert real == sum(int(b["attention_mask"].sum()) for b in batches)
    assert real + padding == sum(b["packed_input_ids"].size for b in batches)
    assert order.unpacked == batching.TrainOrder(batching.RANDOM, buckets, group_examples=16)


def test_min_row_share_is_checked_and_recorded_packed_runs_read_as_they_ran():
    assert spec.resolve(tiny.get_config()).train_order.min_row_share == 0.05
    for bad in ("1", "-0.1"):
        with pytest.raises(ConfigError, match=r"^config\.batching\.min_row_share=[-0-9.]+: a share [^\n]*$"):
            spec.resolve(tiny.get_config(f"batching.min_row_share={bad}"))
    recorded = config_cli.to_plain(tiny.get_config())
    del recorded["batching"]["min_row_share"]
    assert config_cli.with_legacy_keys(recorded)["batching"]["min_row_share"] == 0.0
    # Unpacked orders do not read it.
    random = spec.resolve(tiny.get_config("batching.scheme=random")).train_order
    assert random.min_row_share == 0.0


def test_the_config_selects_packed_with_a_truthful_compile_bound_with_and_without_micro_batches():
    config = tiny.get_config("batching.scheme=packed")
    order = spec.resolve(config).train_order
    assert (order.scheme, order.group_examples) == (batching.PACKED, config.per_device_batch_size)
    assert order.unpacked.scheme == batching.RANDOM
    config = tiny.get_config("batching.scheme=packed,per_device_batch_size=32")
    assert spec.resolve(config).train_order.max_compilations == 16  # len(row_buckets(32))
    # Micro-batches: the same groups of a per-device micro-batch, so the same bound; k per device.
    config.grad_accum_steps = 2
    order = spec.resolve(config).train_order
    assert (order.micro_batches, order.group_examples, order.max_compilations) == (2, 32, 16)
    assert order.groups(32 * 8 * 2) == 16  # 8 devices x 2 micro-batches
    with pytest.raises(ValueError, match="does not split into 2 micro-batch"):
        order.groups(32 * 3)
    # The other schemes do not read it: their orders stay equal whatever the step's split.
    config.batching.scheme = batching.RANDOM
    random = spec.resolve(tiny.get_config("batching.scheme=random")).train_order
    assert spec.resolve(config).train_order == random
    config = tiny.get_config("batching.scheme=packed")
    config.grad_accum_steps = 0
    with pytest.raises(ConfigError, match=r"^config\.grad_accum_steps=0: [^\n]*$"):
        spec.resolve(config)
    with pytest.raises(ConfigError, match=r"^config\.batching\.scheme='sorted': choose length_grouped or "):
        spec.resolve(tiny.get_config("batching.scheme=sorted"))


# The encoder.

FAMILIES = {
    "bert": bert.tiny_config(),
    "roberta": dataclasses.replace(
        bert.tiny_config(), model_type="roberta", pad_token_id=1, type_vocab_size=1
    ),
    "distilbert": dataclasses.replace(bert.tiny_config(), model_type="distilbert", type_vocab_size=0),
}
LENGTHS = (32, 5, 17, 1, 9, 30, 2, 12)


def _family_batch(config: bert.BertConfig, groups: int) -> dict[str, np.ndarray]:
    batch = _packed_batch(LENGTHS, groups)
    real = batch["attention_mask"].astype(bool)
    # Real tokens never the padding id (RoBERTa counts positions by it), padding always it.
    ids = np.where(real, np.maximum(batch["input_ids"], config.pad_token_id + 1), config.pad_token_id)
    if config.type_vocab_size < 2:
        batch["token_type_ids"] = np.zeros_like(ids)
    return {
        **batch,
        "input_ids": ids.astype(np.int32),
        **packing.pack(ids, batch["token_type_ids"], np.asarray(LENGTHS), groups=groups),
    }


def _loss_and_grads(model: bert.BertModel, batch: dict, packed: bool):
    graphdef, params = nnx.split(model)
    real = jnp.asarray(batch["attention_mask"], jnp.float32)[:, :, None]
    weights = jax.random.normal(jax.random.key(1), (model.config.hidden_size,))

    def run(p):
        m = nnx.merge(graphdef, p)
        if packed:
            return m.packed(Packed.of(batch), deterministic=True)
        return m(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], deterministic=True)

    def loss(p):
        out = run(p)
        return sum(jnp.sum(jnp.tanh(h * weights) * real) for h in out.hidden_states) + jnp.sum(
            jnp.tanh(out.pooled)
        )

    return run(params), jax.value_and_grad(loss)(params)


@pytest.mark.parametrize("kind", ["einsum", "dot_product"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_packed_encoder_equals_the_unpacked_one_on_every_example_and_layer(family, kind):
    config = FAMILIES[family]
    model = bert.BertModel(config, attention=kind, rngs=nnx.Rngs(0))
    batch = _family_batch(config, groups=2)
    plain, (plain_loss, plain_grads) = _loss_and_grads(model, batch, packed=False)
    packed, (packed_loss, packed_grads) = _loss_and_grads(model, batch, packed=True)
    real = batch["attention_mask"].astype(bool)
    assert len(packed.hidden_states) == config.num_hidden_layers + 1
    for a, b in zip(packed.hidden_states, plain.hidden_states, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(np.asarray(a)[real], np.asarray(b)[real], atol=1e-5)
    np.testing.assert_allclose(packed.pooled, plain.pooled, atol=1e-5)
    np.testing.assert_allclose(packed_loss, plain_loss, rtol=1e-5)
    assert_trees_close(packed_grads, plain_grads, atol=1e-5, scaled=1e-5)


def test_positions_past_the_table_are_refused_as_unpacked():
    config = FAMILIES["roberta"]  # 128 positions from 2: 126 tokens
    model = bert.BertModel(config, rngs=nnx.Rngs(0))
    batch = _packed_batch([128, 3], groups=1, width=128)
    with pytest.raises(Exception, match="sequence length 128 exceeds"):
        model.packed(Packed.of(batch), deterministic=True)


# The train step.


def _with_packing(batch: dict[str, np.ndarray], groups: int, micro_batches: int = 1) -> dict[str, np.ndarray]:
    lengths = batch["attention_mask"].sum(axis=1)
    ids, types = batch["input_ids"], batch["token_type_ids"]
    return {**batch, **packing.pack(ids, types, lengths, groups=groups, micro_batches=micro_batches)}


def _step(setup, batch, devices: int, grad_accum_steps: int = 1):
    """Two steps (the first one's warmup learning rate is 0) of test_grad_accum's phase step over
    `devices` devices."""
    phase_step, mesh = _phase_step(setup, devices, grad_accum_steps=grad_accum_steps)
    state = steps.TrainState(**phase_step.init_state(setup[3]))
    for _ in range(2):
        state, metrics = phase_step.train_step(state, sharding.put_batch(batch, mesh), with_norms=False)
    return jax.device_get(state.params), jax.device_get(metrics)


def test_a_packed_train_step_equals_the_unpacked_step_on_one_and_eight_devices():
    setup = _setup()
    batch = dict(setup[4], example_mask=np.ones(len(setup[4]["labels"]), np.float32))
    plain, m_plain = _step(setup, batch, 1)
    packed, m_packed = _step(setup, _with_packing(batch, groups=1), 1)
    np.testing.assert_allclose(m_packed["loss"], m_plain["loss"], rtol=1e-5)
    np.testing.assert_allclose(m_packed["grad_norm"], m_plain["grad_norm"], rtol=1e-4)
    assert float(m_packed["real_tokens"]) == float(m_plain["real_tokens"])
    close = {"rtol": 1e-4, "atol": 1e-6}
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **close), packed, plain)
    # Packed in 8 groups (one per device): 8 devices take the step 1 device takes.
    eight = _with_packing(batch, groups=8)
    one_device, m_one = _step(setup, eight, 1)
    eight_devices, m_eight = _step(setup, eight, 8)
    np.testing.assert_allclose(m_eight["loss"], m_one["loss"], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **close), eight_devices, one_device)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **close), one_device, plain)


@pytest.mark.parametrize("devices", [1, 2, 8])
def test_a_packed_step_with_micro_batches_is_the_packed_and_the_unpacked_step_of_the_whole_batch(devices):
    # test_grad_accum's float32 batch without dropout (three padding rows); packed per device and
    # micro-batch, k = 2 micro-batches make the step of k = 1 packed, and of k = 2 unpacked.
    setup = _setup()
    batch = setup[4]
    whole, m_whole = _step(setup, _with_packing(batch, groups=devices), devices)
    plain, m_plain = _step(setup, batch, devices, grad_accum_steps=2)
    accumulated, m_acc = _step(setup, _with_packing(batch, 2 * devices, micro_batches=2), devices, 2)
    for reference in (m_whole, m_plain):
        np.testing.assert_allclose(m_acc["loss"], reference["loss"], rtol=1e-5)
        np.testing.assert_allclose(m_acc["grad_norm"], reference["grad_norm"], rtol=1e-4)
        assert float(m_acc["count"]) == float(reference["count"]) == len(batch["labels"]) - 3
    close = {"rtol": 1e-4, "atol": 1e-6}
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **close), accumulated, whole)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **close), accumulated, plain)
    if len(batch["labels"]) // (2 * devices) > 1:
        # The micro-batches' layout matters: packed as consecutive groups, the strided split would unpack
        # other examples' tokens (a different step). With one example a group (8 devices) the two
        # layouts coincide.
        wrong, _ = _step(setup, _with_packing(batch, 2 * devices), devices, 2)
        differs = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(a - b).max()), wrong, plain))
        assert max(differs) > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("grad_accum_steps", [1, 2])
def test_a_packed_run_trains_end_to_end(tmp_path, grad_accum_steps):
    config = tiny.get_config("strategy=finetune_only,batching.scheme=packed")
    # With micro-batches, two examples a device in each: groups that pack several examples.
    config.grad_accum_steps = config.per_device_batch_size = grad_accum_steps
    results = train.run(config, tmp_path)
    assert 0.0 <= results["final"]["dev"]["accuracy"] <= 1.0
    recorded = json.loads((tmp_path / "results.json").read_text())
    assert recorded["config"]["batching"]["scheme"] == "packed"
    total = recorded["compute"]["total"]
    assert total["tokens_real"] > 0 and total["tokens_padding"] >= 0
