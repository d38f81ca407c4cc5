"""training/compute.py: a run's compute per phase, from committed runs (derived) and new ones (recorded),
and models/flops.py's counts."""

import json
import shutil

import pytest

from stackft_jax.config import spec
from stackft_jax.experiments import grid
from stackft_jax.models import bert, flops
from stackft_jax.training import build, compute
from stackft_jax.training.compute import run_compute
from tests.conftest import REPO

QQP_SMALL = REPO / "docs/grids/paper_qqp_small/runs"
MINILM = bert.BertConfig.from_pretrained(bert.resolve_model_dir("embedded:minilm"))


def _cls_mlp_flops(examples: int) -> float:  # configs/common.py: cls_mlp hidden_dim 256, QQP 2 classes
    return examples * 2 * (MINILM.hidden_size * 256 + 256 * 2)


def test_a_committed_stack_and_finetune_run_that_read_the_grids_cache():
    """Phase 1 read the shared feature cache another run built (timings.json: 0.15 s of cache time):
    its head steps cost the head alone; phase 2 ran the backbone forward and backward over its batches."""
    got = run_compute(QQP_SMALL / "strategy=stack_and_finetune-name=cls_mlp-seed0")
    phase1, phase2 = got["phases"]
    assert (phase1["phase"], phase1["optimizer_steps"], phase1["feature_cache"]) == ("phase1", 120, "read")
    assert (phase1["examples_forward"], phase1["examples_backward"]) == (0, 0)
    assert phase1["flops"] == pytest.approx(3 * _cls_mlp_flops(120 * 16))
    assert (phase2["optimizer_steps"], phase2["examples_forward"], phase2["examples_backward"]) == (
        300,
        4800,
        4800,
    )
    encoder = flops.encoder_flops(MINILM, examples=4800, seq_len=48)
    assert phase2["flops"] == pytest.approx(3 * (encoder + _cls_mlp_flops(4800)))
    assert got["total"]["optimizer_steps"] == 420 and got["total"]["examples_forward"] == 4800
    assert got["total"]["wall_seconds"] == pytest.approx(202.831, abs=1e-3)  # results.json's wall_time_s
    assert phase2["wall_seconds"] == pytest.approx(201.755, abs=1e-3)
    assert got["head_counted"] and got["seq_len"] == 48
    # Alone, it would have built the cache over the 17,497 training pairs, or run phase 1's batches
    # through the backbone with none; the realized cost above depends on which run built it.
    phase2_flops = phase2["flops"]
    own, none = got["standalone"]["own_cache"], got["standalone"]["no_cache"]
    assert own["flops"] == pytest.approx(
        flops.encoder_flops(MINILM, examples=17497, seq_len=48) + got["total"]["flops"]
    )
    assert none["flops"] == pytest.approx(
        flops.encoder_flops(MINILM, examples=1920, seq_len=48) + 3 * _cls_mlp_flops(1920) + phase2_flops
    )
    assert (own["examples_forward"], none["examples_forward"]) == (17497 + 4800, 1920 + 4800)
    assert own["optimizer_steps"] == none["optimizer_steps"] == 420


def test_a_committed_run_that_built_the_cache_pays_one_forward_over_the_train_split():
    got = run_compute(REPO / "docs/grids/pilot_qqp/runs/strategy=stack_and_finetune-name=cls_mlp-seed0")
    phase1 = got["phases"][0]
    assert phase1["feature_cache"] == "built"  # 151 s of feature-cache time
    assert phase1["examples_forward"] == 17497 and phase1["examples_backward"] == 0
    encoder = flops.encoder_flops(MINILM, examples=17497, seq_len=48)
    assert phase1["flops"] == pytest.approx(encoder + 3 * _cls_mlp_flops(120 * 16))


def test_a_frozen_phase_without_a_cache_runs_the_backbone_forward_every_step():
    got = run_compute(REPO / "docs/grids/phase1_dropout_small/runs/recipe=dropout-seed1")
    phase1 = got["phases"][0]
    assert phase1["feature_cache"] is None and not phase1["trains_backbone"]
    assert (phase1["examples_forward"], phase1["examples_backward"]) == (120 * 16, 0)
    assert got["head_counted"]  # BiMPM, forward and backward over every batch
    run_dir = REPO / "docs/grids/phase1_dropout_small/runs/recipe=dropout-seed1"
    config = json.loads((run_dir / "config.json").read_text())
    head = flops.head_flops(config["config"]["head"], hidden=MINILM.hidden_size, outputs=2, seq_len=48)
    assert head > 0
    encoder = flops.encoder_flops(MINILM, examples=1920, seq_len=48)
    assert phase1["flops"] == pytest.approx(encoder + 3 * 1920 * head)


def test_finetune_only_and_an_unfinished_run(tmp_path):
    got = run_compute(QQP_SMALL / "strategy=finetune_only-name=cls_mlp-seed0")
    (phase,) = got["phases"]
    assert phase["trains_backbone"] and phase["examples_forward"] == phase["examples_backward"] == 4800
    assert got["total"]["flops"] == phase["flops"]
    assert run_compute(tmp_path) is None


@pytest.mark.parametrize("folder", sorted(p.name for p in (REPO / "docs/grids").iterdir()))
def test_every_committed_run_is_accounted(folder):
    # A finished run has its results.json (a grid still running here has unfinished ones beside them).
    for run_dir in sorted(f.parent for f in (REPO / "docs/grids" / folder / "runs").glob("*/results.json")):
        got = run_compute(run_dir)
        results = json.loads((run_dir / "results.json").read_text())
        assert got["total"]["optimizer_steps"] == results["train_steps"], run_dir
        # Every head counts: a run that trained steps cost FLOPs, even one that read the grid's cache.
        assert got["head_counted"] and got["total"]["flops"] > 0, run_dir


def test_head_flops_on_hand_checked_light_heads():
    head = {"name": "cls_mlp", "cls_mlp": {"hidden_dim": 8}}
    assert flops.head_flops(head, hidden=4, outputs=3, seq_len=10) == 2 * (4 * 8 + 8 * 3)
    tagger = {"name": "token_mlp", "token_mlp": {"hidden_dim": 0, "lstm_layers": 0, "crf": False}}
    # 8 word slots: [CLS] and [SEP] carry no word
    assert flops.head_flops(tagger, hidden=4, outputs=3, seq_len=10) == 8 * 2 * 4 * 3
    assert flops.head_flops({"name": "not_a_head"}, hidden=4, outputs=3, seq_len=10) is None
    # The light heads' count (matched cells planned before every head had its own): a tagger's MLP over
    # every token, every other head none.
    assert flops.head_flops(tagger, hidden=4, outputs=3, seq_len=10, counted="light") == 10 * 2 * 4 * 3
    crf = {"name": "bilstm_crf", "bilstm_crf": {"hidden_dim": 0, "lstm_layers": 1, "crf": True}}
    assert flops.head_flops(crf, hidden=4, outputs=3, seq_len=10, counted="light") is None


def _tiny_grid(**changes):
    from tests.test_experiment import _grid

    settings = {
        "base": "configs/tiny.py:phase1.num_steps=3,phase2.num_steps=3,phase1.backbone_dropout=false,"
        "phase1.feature_cache=true,head.name=cls_mlp",
        "axes": "strategy=finetune_only|stack_and_finetune",
        "num_seeds": 1,
        "matched": "strategy=finetune_only@matched_flops:stack_and_finetune",
    }
    return _grid(**(settings | changes))


@pytest.mark.slow
def test_new_runs_record_their_compute_and_a_matched_cell_gets_its_budget(tmp_path):
    """A tiny grid end to end: each run's results.json `compute` is what run_compute derives from its
    files; stack-and-finetune built its feature cache; finetune-only at its FLOPs got the fewest steps
    whose FLOPs reach stack-and-finetune's planned ones."""
    g = _tiny_grid()
    assert grid.run_grid(g, tmp_path)
    runs = tmp_path / "runs"
    for run_dir in runs.iterdir():
        assert json.loads((run_dir / "results.json").read_text())["compute"] == run_compute(run_dir)
    stacked = run_compute(runs / "strategy=stack_and_finetune-seed0")
    assert stacked["phases"][0]["feature_cache"] == "built"
    results = json.loads((runs / "strategy=stack_and_finetune-seed0" / "results.json").read_text())
    assert stacked["phases"][0]["examples_forward"] == results["data"]["num_examples"]["train"]
    assert results["phases"][0]["feature_cache_built"] == ["dev", "train"]

    matched_dir = runs / "strategy=finetune_only@matched_flops:stack_and_finetune-seed0"
    matched = run_compute(matched_dir)
    record = json.loads((matched_dir / "config.json").read_text())["config"]["matched_budget"]
    assert record["rule"] == "flops" and record["compared"] == "stack_and_finetune"
    assert record["head_flops"] == "every"  # a new grid counts every head
    assert record["budget"] == pytest.approx(stacked["total"]["flops"])  # built its own cache: as planned
    per_step = run_compute(runs / "strategy=finetune_only-seed0")["total"]["flops"] / 3
    assert record["budget"] <= matched["total"]["flops"] < record["budget"] + per_step
    assert matched["total"]["optimizer_steps"] > 3


@pytest.mark.slow
def test_a_run_that_reads_another_runs_cache_pays_nothing_for_it(tmp_path):
    g = _tiny_grid(
        matched="", num_seeds=2, axes="strategy=stack_and_finetune", baseline="strategy=stack_and_finetune"
    )
    assert grid.run_grid(g, tmp_path)
    caches = [
        run_compute(tmp_path / "runs" / f"strategy=stack_and_finetune-seed{s}")["phases"][0] for s in (0, 1)
    ]
    # tiny.py's random backbone differs per seed: each seed builds its own cache
    assert [c["feature_cache"] for c in caches] == ["built", "built"]
    shutil.rmtree(tmp_path / "runs" / "strategy=stack_and_finetune-seed1")
    assert grid.run_grid(g, tmp_path)  # seed 1 again: its cache is there now
    again = run_compute(tmp_path / "runs" / "strategy=stack_and_finetune-seed1")["phases"][0]
    assert (again["feature_cache"], again["examples_forward"]) == ("read", 0)
    assert compute.BUILD_SECONDS > 1  # committed runs that read a cache spent at most 1 s on it


def _planned_phase(strategy: str, examples: int = 64, batch: int = 8) -> tuple[dict, object, int]:
    from configs import tiny

    run_spec = spec.resolve(tiny.get_config(f"strategy={strategy}"))
    _, encoder = build.resolve_encoder(run_spec)
    got = compute.planned(run_spec, train_examples=examples, global_batch_size=batch)
    return got["phases"][-1], encoder, run_spec.max_seq_length


@pytest.mark.parametrize("kind", ["lora", "bitfit", "adapters"])
def test_an_adaptation_phase_costs_the_forward_and_the_activation_backward(kind):
    """Its frozen kernels need no weight gradients: 2x the backbone's forward, plus 3x the forward of the
    kind's own matrices (LoRA: rank 8 on query and value; adapters: two of bottleneck 64 per layer)."""
    full, encoder, seq_len = _planned_phase("finetune_only")
    phase, _, _ = _planned_phase(kind)
    examples = phase["optimizer_steps"] * 8
    assert phase["examples_forward"] == phase["examples_backward"] == examples and phase["trains_backbone"]
    hidden = encoder.hidden_size
    lora, adapters = 2 * (2 * 8 * (hidden + hidden)), 2 * (2 * 2 * hidden * 64)
    per_token_layer = {"lora": lora, "bitfit": 0, "adapters": adapters}
    added = per_token_layer[kind] * encoder.num_hidden_layers * seq_len * examples
    forward = flops.encoder_flops(encoder, examples=examples, seq_len=seq_len)
    head = full["flops"] / 3 - forward  # finetune_only: 3 x (encoder + head), the same steps and batch
    assert full["optimizer_steps"] == phase["optimizer_steps"]
    assert phase["flops"] == pytest.approx(2 * forward + 3 * (added + head))
