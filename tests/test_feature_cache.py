"""The frozen-feature cache: what it stores, that training from it matches recomputing the backbone,
the config error, resume after a kill inside a cached phase, and one cache shared by runs and
processes (`feature_cache_dir`)."""

import json
import os
import shutil
import signal
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from configs import tiny
from stackft_jax.config import spec
from stackft_jax.data import batching, task_spec, tasks, tokenization
from stackft_jax.models import bert
from stackft_jax.runtime import sharding
from stackft_jax.trained import run_params
from stackft_jax.training import build, feature_cache, steps, train
from stackft_jax.training.run_report import RunReport

# Finer than the tiny config's single bucket (32): the cache is then built at other padded lengths than
# the training batches use, as it is on real data.
BUCKETS = (16, 24, 32)
# Phase 1 scores train examples for the train/dev gap (read from the train cache); a 1-step phase 2
# checks that training the backbone afterwards starts from the same place.
CACHED = "phase1.backbone_dropout=false,phase2.num_steps=1"


def _dev_split_and_model(scalar_mix: bool, arg: str | None = None):
    config = tiny.get_config(arg)
    config.model.scalar_mix = scalar_mix
    task = tasks.get_task(config.data.task)
    model_dir = bert.resolve_model_dir(config.model.name_or_path)
    examples = task_spec.read_examples(task, "dev", config.data.dev_file)
    ds = task_spec.encode_examples(task, tokenization.load_tokenizer(model_dir), examples, max_seq_length=32)
    model, _ = build.build_model(config, task, model_dir)
    return ds, model


def _open_or_build(
    directory: Path, ds, model, *, all_layers: bool, dtype: str = "float32", shared: bool = False
):
    mesh = sharding.make_mesh()
    graphdef, state = nnx.split(model)
    params = jax.device_put(nnx.to_pure_dict(state), sharding.replicated(mesh))
    return feature_cache.open_or_build(
        directory,
        ds,
        params,
        graphdef=graphdef,
        mesh=mesh,
        all_layers=all_layers,
        dtype=dtype,
        global_batch_size=8,
        buckets=BUCKETS,
        shared=shared,
    )


@pytest.mark.parametrize(("all_layers", "dtype"), [(True, "float32"), (False, "bfloat16")])
def test_cache_holds_the_backbones_outputs_at_real_positions(all_layers, dtype, tmp_path):
    ds, model = _dev_split_and_model(scalar_mix=all_layers)
    cache = _open_or_build(tmp_path / "dev", ds, model, all_layers=all_layers, dtype=dtype)
    num_layers = 3 if all_layers else 1  # embeddings + 2 layers, or the last layer only
    # Ragged: real tokens only, nothing stored for padding.
    assert cache.hidden_states.shape == (ds["lengths"].sum(), num_layers, 32)
    assert cache.pooled.shape == (batching.num_rows(ds), 32)
    assert cache.hidden_states.dtype == feature_cache.DTYPES[dtype]
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == "float32" else {"rtol": 1e-2, "atol": 1e-2}
    shortest, longest = int(np.argmin(ds["lengths"])), int(np.argmax(ds["lengths"]))
    assert ds["lengths"][shortest] < ds["lengths"][longest]
    for i in (shortest, longest, 5):
        n = ds["lengths"][i]
        # Each example alone, unpadded: what the cache must hold at its real positions.
        out = model.backbone(
            ds["input_ids"][i : i + 1, :n],
            ds["token_type_ids"][i : i + 1, :n],
            np.ones((1, n), np.int32),
            deterministic=True,
        )
        expected = np.stack(out.hidden_states if all_layers else out.hidden_states[-1:], axis=2)[0]
        stored = cache.hidden_states[cache.offsets[i] : cache.offsets[i + 1]]
        np.testing.assert_allclose(stored.astype(np.float32), expected, **tolerance)
        np.testing.assert_allclose(cache.pooled[i].astype(np.float32), out.pooled[0], **tolerance)

    # A batch gets each row's features at its real positions and zeros in its padding.
    rows = np.array([longest, shortest, 5, shortest], np.int32)
    batch = batching._gather(ds, rows, (32,))
    attached = cache.attach({**batch, "index": rows})
    assert "index" not in attached and attached["hidden_states"].shape == (4, 32, num_layers, 32)
    for j, i in enumerate(rows):
        n = ds["lengths"][i]
        stored = cache.hidden_states[cache.offsets[i] : cache.offsets[i + 1]]
        np.testing.assert_array_equal(attached["hidden_states"][j, :n], stored)
        assert not attached["hidden_states"][j, n:].any()
    np.testing.assert_array_equal(attached["pooled"], cache.pooled[rows])


def test_cache_is_reopened_for_the_same_weights_and_rebuilt_for_others(tmp_path, monkeypatch):
    ds, model = _dev_split_and_model(scalar_mix=False)
    first = np.array(_open_or_build(tmp_path / "dev", ds, model, all_layers=False).hidden_states)

    def no_backbone(*args, **kwargs):
        raise AssertionError("the backbone ran although the cache was complete")

    with monkeypatch.context() as patch:
        patch.setattr(steps, "features_step", no_backbone)
        reopened = _open_or_build(tmp_path / "dev", ds, model, all_layers=False)
    np.testing.assert_array_equal(reopened.hidden_states, first)

    pooler = model.backbone.pooler.kernel
    pooler[...] = pooler[...] + 1.0  # other weights: a stale cache must not be read
    rebuilt = _open_or_build(tmp_path / "dev", ds, model, all_layers=False)
    assert not np.array_equal(rebuilt.pooled, reopened.pooled)
    assert not list(tmp_path.glob("*.tmp*"))


def test_feature_cache_with_backbone_dropout_is_a_config_error(tmp_path):
    config = tiny.get_config("strategy=stack_only,phase1.feature_cache=true")
    with pytest.raises(ValueError, match=r"phase1\.feature_cache.*phase1\.backbone_dropout=False"):
        train.run(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def _train(workdir: Path, monkeypatch, arg: str) -> dict:
    """train.run in process; returns its results, per-step training losses, eval records and the
    final parameters of phase 1."""
    config = tiny.get_config(arg)
    config.log_every_steps = 1
    losses = []
    with monkeypatch.context() as patch:
        patch.setattr(batching, "length_buckets", lambda max_seq_length: BUCKETS)
        patch.setattr(RunReport, "train", lambda self, *, global_step, metrics: losses.append(metrics))
        results = train.run(config, workdir)
    params = run_params.phase_params(workdir, "phase1")
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {"results": results, "losses": losses, "records": records, "params": params}


# The last layer alone, and every layer through the scalar mix (whose weights and gamma then train).
@pytest.mark.slow
@pytest.mark.parametrize("arg", ["model.scalar_mix=false", "model.scalar_mix=true"])
def test_training_from_the_cache_matches_recomputing_the_backbone(arg, tmp_path, monkeypatch):
    recomputed = _train(tmp_path / "recomputed", monkeypatch, f"{CACHED},{arg}")
    cached = _train(tmp_path / "cached", monkeypatch, f"{CACHED},{arg},phase1.feature_cache=true")

    meta = json.loads((tmp_path / "cached/feature_cache/phase1/train/meta.json").read_text())
    assert meta["hidden_states_shape"][1] == (3 if "scalar_mix=true" in arg else 1)
    assert cached["results"]["phases"][0]["feature_cache_bytes"] > 0
    # Without the train cache, the frozen phase still evaluates from dev and gap-subset caches.
    evaluation_caches = (tmp_path / "recomputed" / "feature_cache" / "phase1").iterdir()
    assert sorted(path.name for path in evaluation_caches) == ["dev", "train_subset"]

    assert len(cached["losses"]) == len(recomputed["losses"]) == 6 + 1
    for a, b in zip(recomputed["losses"], cached["losses"], strict=True):
        assert a.keys() == b.keys()
        for key in ("loss", "grad_norm", "running_accuracy"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6)
    assert [(r["phase"], r["step"], r["split"]) for r in cached["records"]] == [
        (r["phase"], r["step"], r["split"]) for r in recomputed["records"]
    ]
    assert ("phase1", 3, "train_subset") in [(r["phase"], r["step"], r["split"]) for r in cached["records"]]
    assert ("phase1", 6, "boundary") in [(r["phase"], r["step"], r["split"]) for r in cached["records"]]
    for a, b in zip(recomputed["records"], cached["records"], strict=True):
        assert a.keys() == b.keys()
        for key in a.keys() - {"phase", "step", "global_step", "split"}:  # metrics, boundary measures
            np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6)
    # The backbone is untouched; the head trained to the same parameters.
    jax.tree.map(
        np.testing.assert_array_equal,
        cached["params"]["backbone"],
        recomputed["params"]["backbone"],
    )
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6),
        recomputed["params"]["head"],
        cached["params"]["head"],
    )


CACHED_TINY = "configs/tiny.py:phase1.backbone_dropout=false,phase1.feature_cache=true"


@pytest.mark.slow
def test_resume_inside_a_cached_phase_equals_an_uninterrupted_run(tmp_path, run_cli):
    uninterrupted, resumed = tmp_path / "uninterrupted", tmp_path / "resumed"
    proc = run_cli(uninterrupted, config=CACHED_TINY)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Killed twice in phase 1: first resumed with the cache deleted (rebuilt), then with it in place
    # (reopened); then phase 2, which trains the backbone, runs as usual.
    proc = run_cli(resumed, config=CACHED_TINY, kill_at="phase1:3")
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert (resumed / "feature_cache" / "phase1" / "train" / "meta.json").is_file()
    shutil.rmtree(resumed / "feature_cache")
    proc = run_cli(resumed, config=CACHED_TINY, kill_at="phase1:5")
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    proc = run_cli(resumed, config=CACHED_TINY)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    ra, rb = (json.loads((w / "results.json").read_text()) for w in (uninterrupted, resumed))
    assert ra["final"] == rb["final"] and ra["best"] == rb["best"]
    assert [(p["phase"], p["steps"], p["stop_reason"]) for p in ra["phases"]] == [
        (p["phase"], p["steps"], p["stop_reason"]) for p in rb["phases"]
    ]
    assert (uninterrupted / "metrics.jsonl").read_text() == (resumed / "metrics.jsonl").read_text()
    for phase in ("phase1", "phase2"):
        pa, pb = (run_params.phase_params(w, phase) for w in (uninterrupted, resumed))
        jax.tree.map(np.testing.assert_array_equal, pa, pb)


# Pretrained MiniLM (the same backbone for every seed; the tiny config's random init draws one per seed).
PRETRAINED_STACK = (
    "strategy=stack_only,phase1.backbone_dropout=false,phase1.feature_cache=true,phase1.num_steps=3,"
    "model.init=pretrained,model.config_overrides.hidden_size=0,model.config_overrides.num_hidden_layers=0,"
    "model.config_overrides.num_attention_heads=0,model.config_overrides.intermediate_size=0"
)


@pytest.mark.slow
def test_runs_with_other_seeds_build_one_shared_cache_and_match_per_run_caches(tmp_path):
    shared = tmp_path / "shared"
    arg = f"{PRETRAINED_STACK},feature_cache_dir={shared}"
    train.run(tiny.get_config(f"{arg},seed=0"), tmp_path / "seed0")
    built = {path: path.stat().st_mtime_ns for path in shared.glob("*/meta.json")}
    assert len(built) == 2  # train and dev, one folder per fingerprint

    shared_run = train.run(tiny.get_config(f"{arg},seed=1"), tmp_path / "seed1")
    # Reopened, not rebuilt: the seed enters neither the backbone nor the fingerprint.
    assert {path: path.stat().st_mtime_ns for path in shared.glob("*/meta.json")} == built
    assert sorted(p.name for p in shared.iterdir()) == sorted(p.parent.name for p in built)
    assert not (tmp_path / "seed1" / "feature_cache").exists()

    own_run = train.run(tiny.get_config(f"{PRETRAINED_STACK},seed=1"), tmp_path / "own")
    assert len(list((tmp_path / "own" / "feature_cache").glob("*/*/meta.json"))) == 2
    assert shared_run["final"] == own_run["final"]
    metrics = [(tmp_path / run / "metrics.jsonl").read_text() for run in ("seed1", "own")]
    assert metrics[0] == metrics[1]


def test_a_cache_another_process_renamed_there_first_is_kept(tmp_path, monkeypatch):
    ds, model = _dev_split_and_model(scalar_mix=False)
    first = _open_or_build(tmp_path / "elsewhere", ds, model, all_layers=False, shared=True)
    (theirs,) = (tmp_path / "elsewhere").iterdir()
    (theirs / "written_by_the_first_process").touch()
    rename = os.rename

    def another_process_finishes_first(src, dst):
        if Path(dst).parent == tmp_path / "shared":
            shutil.copytree(theirs, dst)
        rename(src, dst)

    monkeypatch.setattr(os, "rename", another_process_finishes_first)
    cache = _open_or_build(tmp_path / "shared", ds, model, all_layers=False, shared=True)
    # One folder, the first process's; ours (the temporary folder) is gone.
    (kept,) = (tmp_path / "shared").iterdir()
    assert kept.name == theirs.name and (kept / "written_by_the_first_process").exists()
    np.testing.assert_array_equal(cache.hidden_states, first.hidden_states)
    np.testing.assert_array_equal(cache.pooled, first.pooled)


def test_another_compute_dtype_gets_its_own_shared_cache(tmp_path):
    ds, model = _dev_split_and_model(scalar_mix=False)
    _open_or_build(tmp_path, ds, model, all_layers=False, shared=True)
    # The same weights (same seed) computed in bfloat16 store other bits: a folder of their own.
    _, bf16_model = _dev_split_and_model(scalar_mix=False, arg="model.dtype=bfloat16")
    _open_or_build(tmp_path, ds, bf16_model, all_layers=False, shared=True)
    assert len(list(tmp_path.glob("*/meta.json"))) == 2


def test_a_lora_pair_whose_b_is_zero_leaves_the_fingerprint_and_the_features_unchanged(tmp_path):
    # lp_lora's head phase: the backbone carries LoRA pairs (A drawn per seed, B zero), inert until the
    # LoRA phase trains them, so its cache is the plain backbone's, shared across seeds.
    ds, plain = _dev_split_and_model(scalar_mix=False)
    run_spec = spec.resolve(tiny.get_config("strategy=lp_lora"))
    model_dir = bert.resolve_model_dir(run_spec.model.name_or_path)
    adapted, _ = build.build_model(run_spec, run_spec.task, model_dir, run_spec.adaptation)
    assert isinstance(adapted.backbone.layers[0].attention.query.lora_b, nnx.Param)
    shared = tmp_path / "shared"
    plain_cache = _open_or_build(shared, ds, plain, all_layers=False, shared=True)
    adapted_cache = _open_or_build(shared, ds, adapted, all_layers=False, shared=True)
    assert len(list(shared.iterdir())) == 1 and not adapted_cache.built
    own = _open_or_build(tmp_path / "own", ds, adapted, all_layers=False)
    assert own.built  # what the adapted backbone computes itself
    np.testing.assert_array_equal(own.hidden_states, plain_cache.hidden_states)
    np.testing.assert_array_equal(own.pooled, plain_cache.pooled)

    # A trained B changes what the backbone computes: another fingerprint, another cache.
    projection = adapted.backbone.layers[0].attention.query
    projection.lora_b[...] = projection.lora_b[...] + 0.01
    _open_or_build(shared, ds, adapted, all_layers=False, shared=True)
    assert len(list(shared.iterdir())) == 2
