"""Smoke tests of benchmarks/: each script runs in its quickest mode and writes the JSON it promises.

No timing is asserted (these run on shared CI cores); what is asserted are facts that do not depend on
speed: phase 1 holds optimizer state for the head only, and a training run compiles nothing after its
first epoch.
"""

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from benchmarks import (
    accelerator_check,
    adaptation,
    cases,
    compile_count,
    feature_cache,
    finetune_collapse,
    flops,
    gemm,
    grid_cost,
    grid_sharing,
    grouped_batches,
    input_pipeline,
    loop_overhead,
    memory,
    model_variants,
    profile_step,
    time_to_result,
    train_speed,
)
from stackft_jax.models import bert, dropout
from stackft_jax.runtime import sharding

FIXTURE_TRAIN = Path(__file__).resolve().parent / "fixtures" / "qqp" / "train.tsv"
STATS = {"median_s", "iqr_s", "examples_per_s", "first_call_s", "times_s", "optimizer_state_bytes"}


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.slow
def test_train_speed(tmp_path):
    out = tmp_path / "train_speed.json"
    train_speed.main(["--quick", "--models=tiny", "--components", f"--out={out}"])
    payload = _read(out)
    assert payload["machine"]["torch_num_threads"] >= 1
    record = payload["results"]["tiny"]
    assert set(record["cases"]) == {"full", "phase1", "eval"}
    for timed in record["cases"].values():
        assert STATS <= set(timed["jax"]) and STATS <= set(timed["torch"])
        assert timed["jax_over_torch_examples_per_s"] > 0
    assert set(record["phase1_time_over_full_time"]) == {"jax", "torch"}
    assert set(record["targets"]) == set(train_speed.TARGETS)
    assert set(record["components"]) == {
        "forward_train_mode",
        "forward_backward",
        "forward_backward_no_dropout",
    }
    full, phase1 = (record["cases"][case] for case in ("full", "phase1"))
    for framework in ("jax", "torch"):
        # Phase 1 keeps Adam moments for the head only: a small fraction of the full step's.
        assert 0 < phase1[framework]["optimizer_state_bytes"] < full[framework]["optimizer_state_bytes"] / 10


@pytest.mark.slow
def test_memory(tmp_path):
    out = tmp_path / "memory.json"
    memory.main(["--quick", "--models=tiny", "--cases=phase1", f"--out={out}"])
    rows = _read(out)["results"]
    assert [(r["framework"], r["case"]) for r in rows] == [("jax", "phase1"), ("torch", "phase1")]
    for row in rows:
        assert row["peak_rss_after_steps_mib"] >= row["peak_rss_after_build_mib"] > 0
        assert row["parameter_bytes"]["backbone"] > row["parameter_bytes"]["head"] > 0
        assert 0 < row["optimizer_state_bytes"] < row["parameter_bytes"]["backbone"]


@pytest.mark.slow
def test_adaptation(tmp_path):
    out = tmp_path / "adaptation.json"
    adaptation.main(["--quick", "--model=tiny", "--cases=finetune,lora,bitfit,adapters", f"--out={out}"])
    records = _read(out)["results"]
    assert list(records) == ["finetune", "lora", "bitfit", "adapters"]
    full = records["finetune"]
    assert full["parameters"]["trained"] == full["parameters"]["total"]
    # LoRA and adapters add parameters to the encoder; BitFit trains some of the ones it has.
    assert records["lora"]["parameters"]["total"] > full["parameters"]["total"]
    assert records["adapters"]["parameters"]["total"] > full["parameters"]["total"]
    assert records["bitfit"]["parameters"]["total"] == full["parameters"]["total"]
    for case, record in records.items():
        trained = record["parameters"]["trained"]
        if case != "finetune":
            assert 0 < trained < full["parameters"]["trained"] / 10
            assert record["over_finetune"]["optimizer_state"] < 0.1
        # Two float32 Adam moments per trained parameter (and a few step counters), none for frozen
        # ones; the phase-end checkpoint holds the trained parameters only.
        assert 8 * trained <= record["optimizer_state_bytes"] <= 8 * trained + 1024
        assert record["checkpoint_bytes"] == 4 * trained
        assert record["step"]["median_s"] > 0
        peaks = record["memory"]
        assert peaks["case"] == case
        assert peaks["peak_rss_after_steps_mib"] >= peaks["peak_rss_after_build_mib"] > 0
        assert peaks["optimizer_state_bytes"] == record["optimizer_state_bytes"]
        # Without gradients and updates for the frozen weights, the compiled step does less work and
        # needs smaller working buffers (XLA's accounting, which no machine load changes).
        if case != "finetune":
            assert peaks["xla_cost_analysis"]["flops"] < full["memory"]["xla_cost_analysis"]["flops"]
            assert (
                peaks["xla_memory_analysis_bytes"]["temp_size"]
                < full["memory"]["xla_memory_analysis_bytes"]["temp_size"]
            )


@pytest.mark.slow
def test_compile_count(tmp_path):
    out = tmp_path / "compile_count.json"
    compile_count.main(["--quick", f"--out={out}"])
    payload = _read(out)
    assert payload["steps_per_phase"] == {
        "phase1": 2 * payload["steps_per_epoch"],
        "phase2": 2 * payload["steps_per_epoch"],
    }
    assert payload["within_bound"]
    train, evaluation = len(payload["train_buckets"]), len(payload["buckets"])
    # Two phases, each a plain and a logged-step train program per training bucket at most; phase 1
    # (frozen backbone) evaluates cached features, phase 2 tokens; phase 1 caches dev and the gap rule's
    # train subset.
    assert 0 < payload["by_function"]["train_step"] <= 2 * train
    assert 0 < payload["by_function"]["train_step_logged"] <= 2 * train
    assert 0 < payload["by_function"]["eval_step"] <= 2 * evaluation
    assert 0 < payload["by_function"]["features_step"] <= 2 * evaluation
    # Length-grouped batches (the default) may meet a training bucket for the first time after the first
    # epoch; such a compilation is a first one, inside the per-bucket bound checked above.
    assert payload["compiles_after_first_epoch"] <= 2 * train


@pytest.mark.slow  # a benchmark's smoke run
def test_input_pipeline(tmp_path):
    out = tmp_path / "input_pipeline.json"
    input_pipeline.main(
        [
            "--quick",
            f"--train-file={FIXTURE_TRAIN}",
            "--step-model=tiny",
            "--batch-size=8",
            "--max-seq-length=32",
            f"--out={out}",
        ]
    )
    payload = _read(out)
    assert payload["num_examples"] == 40
    for key in ("tokenize_first_call_s", "tokenize_cached_call_s", "pipeline_over_step_rate"):
        assert payload[key] > 0
    assert payload["batching"]["batches"] == payload["batching_with_put_batch"]["batches"] == 50
    assert payload["train_step"]["steps_per_s"] > 0
    assert isinstance(payload["target_met"], bool)


@pytest.mark.slow  # a benchmark's smoke run
def test_feature_cache(tmp_path):
    out = tmp_path / "feature_cache.json"
    feature_cache.main(
        [
            "--quick",
            "--model=tiny",
            f"--train-file={FIXTURE_TRAIN}",
            "--modes=recompute_dropout,recompute,cached",
            f"--out={out}",
        ]
    )
    payload = _read(out)
    assert payload["num_examples"] == 40 and payload["steps_per_epoch"] == 5
    results = payload["results"]
    assert results["cached"]["build_s"] > 0 and results["cached"]["cache_bytes"] > 0
    assert results["recompute"]["build_s"] is None
    for record in results.values():
        assert len(record["epochs"]) == 2 and record["steady_epoch_s"] > 0
    assert set(payload["ratios"]) == {"recompute_over_cached", "recompute_dropout_over_cached"}
    # Training from the cache computes what recomputing the backbone without dropout computes.
    assert payload["ratios"]["recompute_over_cached"]["losses_match"]


@pytest.mark.slow  # a benchmark's smoke run
def test_profile_step(tmp_path):
    out = tmp_path / "profile_step.json"
    profile_step.main(["--quick", "--model=tiny", "--case=eval,full", f"--out={out}"])
    eval_result, full_result = _read(out)["results"]
    assert (eval_result["case"], full_result["case"]) == ("eval", "full")
    for result in (eval_result, full_result):
        assert result["op_time_sum_ms_per_step"] > 0
        assert result["ops"] and {"hlo_op", "kind", "ms_per_step", "op_name", "source"} <= set(
            result["ops"][0]
        )
        # The attention matmuls are traced back to the model's source.
        assert any(source.startswith("bert.py:") for source in result["by_source_ms"])
        assert "matmul" in result["by_category_ms"]
    # The train step (the production one, via loop.build_phase_step) runs dropout and the optimizer;
    # the eval step has no dropout.
    assert any(source.startswith("dropout.py:") for source in full_result["by_source_ms"])
    assert not any(source.startswith("dropout.py:") for source in eval_result["by_source_ms"])
    assert full_result["hlo_module"] != eval_result["hlo_module"]


@pytest.mark.slow  # five compilations of the tiny train step
def test_profile_step_tail_compares_both_guards(tmp_path):
    out = tmp_path / "profile_step.json"
    profile_step.main(["--tail", "--model=tiny", "--batch-size=8", "--seq-len=32", f"--out={out}"])
    result = _read(tmp_path / "profile_step_tail.json")["results"]
    assert result["default_guard"] == "skip_update"
    skip, select = result["by_guard"]["skip_update"], result["by_guard"]["select"]
    # Bytes, not time: the lax.cond writes each trained leaf and moment once, the select twice.
    assert 0 < skip["step_tail_bytes"] < select["step_tail_bytes"]
    assert skip["logged_step_tail_bytes"] > skip["step_tail_bytes"]


@pytest.mark.slow  # a short train.run and its steps again in a bare loop: four compilations
def test_loop_overhead(tmp_path):
    out = tmp_path / "loop_overhead.json"
    loop_overhead.main(["--quick", f"--out={out}"])
    payload = _read(out)
    results = payload["results"]
    for side in ("raw", "loop"):
        assert len(results[side]["window_s"]) == payload["args"]["windows"] == 2  # one repeat
        assert results[side]["steps_per_s"] > 0
    assert results["loop_overhead"] > -1 and isinstance(results["goal_met"], bool)


def test_model_variants(tmp_path):
    out = tmp_path / "model_variants.json"
    variants = "baseline,attn_bqhd+bernoulli_dropout"
    model_variants.main(
        ["--quick", "--models=tiny", "--cases=phase1", f"--variants={variants}", f"--out={out}"]
    )
    record = _read(out)["results"]["tiny"]
    assert set(record) == set(variants.split(","))
    assert record["baseline"]["phase1"]["time_over_baseline"] == 1.0
    assert record["attn_bqhd+bernoulli_dropout"]["phase1"]["median_s"] > 0
    # The patches are undone: the model code is back to stackft_jax's own.
    assert bert.BertSelfAttention.__call__ is not model_variants._attention_bqhd
    assert dropout.Dropout.__call__ is not model_variants._bernoulli_dropout


@pytest.fixture(scope="module")
def tiny_model_and_batch():
    m = cases.build_jax(cases.experiment_config("tiny", 16))
    return m, sharding.put_batch(cases.synthetic_batch(8, 16, m.bert_config.vocab_size), m.mesh)


@pytest.mark.parametrize(
    "variant",
    [
        "attn_bqhd",
        "autodiff_dense",
        "bias_grad_dot",
        "ln_vjp",
        "attn_bhld",
        "qkv_fused",
        "mask_bitcast+bias_grad_dot",
    ],
)
def test_model_variants_compute_the_same_function(variant, tiny_model_and_batch):
    # A variant is a different program for the same math: with dropout off, the loss and every
    # gradient match the model's own (dropout variants only change the random stream).
    m, batch = tiny_model_and_batch

    def loss(params):
        logits = nnx.merge(m.graphdef, params)(batch, deterministic=True)
        loss_sum, stats = m.task.objective.loss(logits, batch)
        return loss_sum / stats["count"]

    # Jitted (traced inside the patch): op-by-op dispatch of a sharded backward pass compiles hundreds
    # of tiny programs, and aborted inside XLA:CPU in two of six full-suite runs on a loaded machine.
    expected = jax.jit(jax.value_and_grad(loss))(m.params)
    with model_variants.patched(variant):
        got = jax.jit(jax.value_and_grad(loss))(m.params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), got, expected)


def test_gemm_products_count_the_model_flops():
    # The products a step runs add up to benchmarks/flops.py's model FLOPs of that step.
    dims = gemm.model_dims("bert_base")
    rows = gemm.products(dims, batch=8, seq_len=64)
    shape = {
        "num_layers": dims["num_hidden_layers"],
        "hidden": dims["hidden_size"],
        "intermediate": dims["intermediate_size"],
        "batch": 8,
        "seq_len": 64,
    }
    for case in ("full", "phase1", "eval"):
        total = sum(row["per_step"][case] * gemm.flops(row) for row in rows)
        assert total == flops.step_flops(case, **shape)


@pytest.mark.slow
def test_gemm(tmp_path):
    out, speed = tmp_path / "gemm.json", tmp_path / "train_speed.json"
    # A train_speed result of the same shapes, reduced to what gemm reads.
    torch_step_s = {"full": 0.3, "phase1": 0.2, "eval": 0.1}
    speed.write_text(
        json.dumps(
            {
                "results": {
                    "tiny": {
                        "cases": {
                            c: {"jax": {"median_s": 1.0}, "torch": {"median_s": t}}
                            for c, t in torch_step_s.items()
                        }
                    }
                }
            }
        )
    )
    gemm.main(
        ["--quick", "--models=tiny", "--xla-flag-sets=onednn", f"--train-speed-json={speed}", f"--out={out}"]
    )
    record = _read(out)["results"]["tiny"]
    rows = record["products"]
    assert all(row["jax_s"] > 0 and row["torch_s"] > 0 for row in rows)
    for fw in ("jax", "torch"):
        for case in ("full", "phase1", "eval"):
            expected = sum(row["per_step"][case] * row[f"{fw}_s"] for row in rows)
            assert abs(record[f"{fw}_floor_s"][case] - expected) <= 1e-12
    # Frozen backbone and eval: forward products only; the full step adds both gradients.
    assert record["jax_floor_s"]["phase1"] == record["jax_floor_s"]["eval"] < record["jax_floor_s"]["full"]
    for case, torch_s in torch_step_s.items():
        assert record["reachable_jax_over_torch"][case] == torch_s / record["jax_floor_s"][case]
    onednn = record["xla_flag_sets"]["onednn"]
    assert "--xla_cpu_experimental_onednn_custom_call=true" in onednn["xla_flags"]
    assert set(onednn["jax_s"]) == {row["name"] for row in rows}


def test_gemm_bfloat16_products_run_in_both_frameworks():
    rows = gemm.products(gemm.model_dims("tiny"), batch=2, seq_len=8)
    gemm.time_products(rows, ["jax", "torch"], warmup=1, repeats=1, dtype="bfloat16")
    assert all(row["jax_s"] > 0 and row["torch_s"] > 0 for row in rows)


@pytest.mark.slow
def test_time_to_result(tmp_path):
    out = tmp_path / "time_to_result.json"
    time_to_result.main(["--quick", f"--out={out}"])
    runs = _read(out)["results"]["tiny"]
    assert set(runs) == {"cold", "warm"}
    for run in runs.values():
        assert set(run["seconds"]) == set(time_to_result.ROWS)
        # Every row was measured: a run starts, reads data, builds a model, compiles, trains, evaluates.
        assert all(run["seconds"][row] > 0 for row in time_to_result.ROWS if row != "rest")
        assert sum(run["seconds"].values()) == pytest.approx(run["wall_s"], abs=0.05)
        assert run["final"]["dev"]["accuracy"] >= 0
        assert run["checkpoint_bytes_peak"] >= run["checkpoint_bytes_end"] > 0
        # Phase 1 measured its train/dev gap, inside its own wall time (a share rounded to 0.001 may be
        # 0.0 when loading dominates the phase: the measurement is what is asserted, not its size).
        assert "gap_evaluation" in run["library_timings"]["seconds"]
        assert 0 <= run["gap_share_of_phase1"] < 1
    # The warm run loads its programs from the cold run's persistent cache instead of compiling them:
    # counted in cache files, which no load on the machine changes (its seconds do).
    assert runs["warm"]["compilation_cache_files_added"] < runs["cold"]["compilation_cache_files_added"]


@pytest.mark.slow
def test_grouped_batches(tmp_path):
    out = tmp_path / "grouped_batches.json"
    payload = grouped_batches.main(["--quick", f"--out={out}"])
    assert _read(out)["results"] == payload["results"]
    record = payload["results"]["tiny"]
    runs = record["runs"]
    assert set(runs) == {"old", "new", "packed_every", "random16", "grouped"}
    for kind, run in runs.items():
        assert run["steps"] == 4 and run["cpu_s"] > 0 and run["wall_s"] > 0
        assert "accuracy" in run["dev"]
        # The run's own count (results.json compute) is the offline count of the same scheme.
        scheme = {
            "old": "random / doubling",
            "new": "packed / 16",
            # Packed without the row plan: the offline packed count, which pads no batch of these 4 steps.
            "packed_every": "packed / 16",
            "random16": "random / 16",
            "grouped": "length_grouped / 16",
        }[kind]
        assert run["real_token_share"] == record["offline"]["shares"][scheme]["real_token_share"]
    assert "| tiny | old / new |" in payload["table_markdown"]
    assert "| tiny | old / grouped |" in payload["table_markdown"]
    assert "| tiny | random16 / new |" in payload["table_markdown"]


@pytest.mark.slow
def test_grid_sharing(tmp_path):
    out = tmp_path / "grid_sharing.json"
    payload = grid_sharing.main(["--quick", f"--out={out}"])
    assert _read(out)["results_match"] == payload["results_match"] is True
    shared, per_run = payload["results"]["shared"], payload["results"]["per_run"]
    assert len(shared["runs"]) == len(per_run["runs"]) == 2
    # The two cells of seed 0 read one train and one dev cache; alone, each run builds its own two.
    assert (shared["caches_built"], per_run["caches_built"]) == (2, 4)


@pytest.mark.slow
def test_grid_cost(tmp_path):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    args = ["--quick", "--cases=conll_bilstm_crf", "--seeds=1"]
    grid_cost.main([*args, f"--out={first}"])
    payload = grid_cost.main([*args, f"--out={second}", f"--compare={first}"])
    (run,) = _read(second)["results"]["runs"]
    assert (
        run["case"] == "conll_bilstm_crf"
        and run["run"] == "strategy=stack_and_finetune-name=bilstm_crf-seed0"
    )
    assert run["phases"] == {"phase1": 4, "phase2": 2} and run["train_steps"] == 6
    assert run["wall_s"] > 0 and run["seconds"]["train_steps"] > 0 and "f1" in run["dev"]
    # The same code and seed twice: the comparison finds the same scores and predictions.
    assert "| yes | yes |" in payload["table_markdown"]


@pytest.mark.slow
def test_finetune_collapse(tmp_path):
    out = tmp_path / "finetune_collapse.json"
    payload = finetune_collapse.main(
        ["--quick", f"--runs={tmp_path / 'runs'}", f"--out={out}", "--eval-every=2"]
    )
    cases = _read(out)["results"]
    assert set(cases) == set(payload["results"]) == {"tiny_uniform", "tiny_new_head"}
    uniform, new_head = cases["tiny_uniform"], cases["tiny_new_head"]
    assert (uniform["head_learning_rate"], new_head["head_learning_rate"]) == (1e-5, 1e-3)
    assert [step for step, _, _ in uniform["dev_curve"]] == [2, 4]
    # Adam moves each parameter by about its rate per step: the new head's first step is ~100x larger.
    first_update = {name: case["train"]["update_norm/head"][0][1] for name, case in cases.items()}
    assert first_update["tiny_new_head"] > 30 * first_update["tiny_uniform"]
    assert 0 <= uniform["dev_predicted_positive"] <= 1


@pytest.mark.slow  # about 1 CPU-minute: three tiny steps compiled five times, and a short train.run
def test_accelerator_check_smoke(tmp_path):
    out = tmp_path / "accelerator_check.json"
    accelerator_check.main(["--smoke", f"--out={out}"])
    results = _read(out)["results"]
    assert results["device_kind"] == "cpu"
    assert [r["batch_size"] for r in results["phase2"]] == [8, 16]
    assert all(r["examples_per_s"] > 0 and r["mfu"] is None for r in [*results["phase2"], results["phase1"]])
    assert results["real_loop"]["examples_per_s"] > 0 and results["real_loop"]["mfu"] is None
    # The same three steps on the same batch, bfloat16 against float32: close, not equal.
    assert 0 < results["bf16_vs_float32_max_relative_loss_difference"] < 0.05
    assert 0 < results["bf16_vs_float32_first_step_relative_loss_difference"] < 0.01
    assert results["float32_attention"] == results["phase2"][0]["attention"]
    assert len(results["float32_losses"]) == len(results["phase2"][0]["losses"]) == 3
    # Packed rows (one group per device: here 8 groups of one example) against the same batch unpacked.
    assert results["real_loop_random_batches"]["examples_per_s"] > 0
    for parity in results["packed_parity"]:
        assert parity["packed_rows"] <= parity["examples"]
        assert parity["last_layer_relative_difference"] < (1e-5 if parity["dtype"] == "float32" else 1e-2)
        assert parity["pooled_relative_difference"] < (1e-5 if parity["dtype"] == "float32" else 1e-2)
