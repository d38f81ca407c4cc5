"""Matched-budget cells (experiments/budgets.py, the grid key `matched`) and the gap rule's metric on NER:
what a grid builds, the step counts it computes, and that committed grids keep reading as finished."""

import dataclasses
import math
import shutil
from types import SimpleNamespace

import jax
import pytest

from stackft_jax.config import config_cli, phases, spec
from stackft_jax.data import tasks
from stackft_jax.experiments import cells, grid
from stackft_jax.models import bert, flops
from stackft_jax.training import loop, workdirs
from tests.conftest import REPO

QQP_TEST = "configs/experiments/paper_qqp.py:test"
MATCHED = "finetune_only@matched_flops:stack_and_finetune"


def _load(name: str, **changes):
    g = config_cli.load(name, [], kind="grid")
    with g.unlocked():
        g.update(changes)
    return g


def test_matched_cells_come_after_each_seeds_axis_cells():
    runs = cells.runs_of(_load(QQP_TEST))
    assert len(runs) == 40 and sum(r.matched is not None for r in runs) == 10
    assert [r.name for r in runs[:8]] == [
        "strategy=finetune_only-name=cls_mlp-seed0",
        "strategy=finetune_only-name=sim_transformer-seed0",
        "strategy=finetune_only_uniform-name=cls_mlp-seed0",
        "strategy=finetune_only_uniform-name=sim_transformer-seed0",
        "strategy=stack_and_finetune-name=cls_mlp-seed0",
        "strategy=stack_and_finetune-name=sim_transformer-seed0",
        f"strategy={MATCHED}-name=cls_mlp-seed0",
        f"strategy={MATCHED}-name=sim_transformer-seed0",
    ]


def test_step_counts_by_each_rule_on_the_qqp_preset():
    """QQP test: stack-and-finetune plans 120 head-only steps on features cached once over the 17,497
    training pairs, then 300 fine-tuning steps of 16 pairs per device (48 tokens, MiniLM, cls_mlp head);
    on one device, finetune-only gets 665 steps by FLOPs."""
    batch = 16 * jax.device_count()  # the global batch a run gets here (the tests run 8 CPU devices)
    minilm = bert.BertConfig.from_pretrained(bert.resolve_model_dir("embedded:minilm"))

    def encoder(n):
        return flops.encoder_flops(minilm, examples=n, seq_len=48)

    def head(n):
        return n * 2 * (384 * 256 + 256 * 2)

    budget = encoder(17497) + 3 * head(120 * batch) + 3 * (encoder(300 * batch) + head(300 * batch))
    expected = {
        "steps": (120 + 300, 420),
        "examples": (17497 + 300 * batch, math.ceil((17497 + 300 * batch) / batch)),
        "flops": (budget, math.ceil(budget / (3 * (encoder(batch) + head(batch))))),
    }
    for rule, (want_budget, want_steps) in expected.items():
        g = _load(QQP_TEST, matched=f"strategy=finetune_only@matched_{rule}:stack_and_finetune")
        run = next(r for r in cells.runs_of(g) if r.matched is not None)
        config = grid.run_config(g, run)
        assert config.phase2.num_steps == want_steps, rule
        assert config.matched_budget.rule == rule and config.matched_budget.compared == "stack_and_finetune"
        assert config.matched_budget.budget == pytest.approx(want_budget)
        # The record does not bind: the run is the same run as any finetune-only run of that length.
        assert "matched_budget" not in spec.binding_form(spec.resolve(config))["config"]


def test_the_no_cache_budget_charges_phase_one_its_batches_not_the_train_split():
    """QQP test, stack-and-finetune alone without a cache: phase 1's 120 steps run the backbone forward
    over their 120 x 16 pairs per device instead of over the 17,497 training pairs."""
    batch = 16 * jax.device_count()
    minilm = bert.BertConfig.from_pretrained(bert.resolve_model_dir("embedded:minilm"))

    def encoder(n):
        return flops.encoder_flops(minilm, examples=n, seq_len=48)

    def head(n):
        return n * 2 * (384 * 256 + 256 * 2)

    budget = encoder(120 * batch) + 3 * head(120 * batch) + 3 * (encoder(300 * batch) + head(300 * batch))
    label = "finetune_only@matched_flops.no_cache:stack_and_finetune"
    g = _load(QQP_TEST, matched=f"strategy={label}")
    run = next(r for r in cells.runs_of(g) if r.matched is not None)
    assert run.name == f"strategy={label}-name=cls_mlp-seed0"
    config = grid.run_config(g, run)
    assert config.matched_budget.rule == "flops.no_cache"
    assert config.matched_budget.budget == pytest.approx(budget)
    assert config.phase2.num_steps == math.ceil(budget / (3 * (encoder(batch) + head(batch))))


@pytest.mark.parametrize(
    ("matched", "message"),
    [
        ("head.name=finetune_only@matched_flops:stack_and_finetune", "is not a value of axis head.name"),
        ("strategy=finetune_only@matched_tokens:stack_and_finetune", "rule 'tokens'"),
        ("strategy=finetune_only@flops:stack_and_finetune", "is not `value@matched_<rule>"),
        ("strategy=finetune_only@matched_flops.cache:stack_and_finetune", "names no budget kind"),
        ("strategy=finetune_only@matched_flops.:stack_and_finetune", "names no budget kind"),
        ("strategy=finetune_only@matched_flops:finetune_only", "matched to itself"),
        ("seed=finetune_only@matched_flops:stack_and_finetune", "with key an axis"),
        ("strategy=stack_and_finetune@matched_steps:finetune_only", "trains phases"),
    ],
)
def test_bad_matched_cells_are_named_before_training(matched, message, tmp_path):
    with pytest.raises(config_cli.ConfigError, match=message):
        # comparisons: the preset's name its own matched cells, which these replace
        grid.plan_grid(_load(QQP_TEST, matched=matched, comparisons="baseline"), tmp_path)


def _copy_records(folder: str, tmp_path):
    """A committed grid's workdir as a rerun finds it: its grid binding and each run's record."""
    source, copy = REPO / folder, tmp_path / "grid"
    copy.mkdir()
    shutil.copy(source / "grid_config.json", copy)
    for run_dir in (source / "runs").iterdir():
        (copy / "runs" / run_dir.name).mkdir(parents=True)
        for name in ("results.json", "config.json"):
            shutil.copy(run_dir / name, copy / "runs" / run_dir.name / name)
    return copy


def _states(g, workdir) -> dict[str, int]:
    states = [state for _, _, state in grid.run_states(g, workdir)]
    return {state: states.count(state) for state in set(states)}


@pytest.mark.slow
def test_adding_matched_cells_to_a_grid_workdir_keeps_its_finished_runs(tmp_path):
    workdir = _copy_records("docs/grids/paper_qqp_small", tmp_path)
    grid.plan_grid(
        _load("configs/experiments/paper_qqp.py:small", matched=""), workdir
    )  # no cells: the same grid
    more = _load("configs/experiments/paper_qqp.py:small", matched=f"strategy={MATCHED}")
    with pytest.raises(workdirs.ConfigMismatch, match="grid.matched"):
        grid.plan_grid(more, workdir)
    grid.plan_grid(more, workdir, allow_config_change=True)
    assert _states(more, workdir) == {grid.FINISHED: 80, grid.NOT_STARTED: 20}  # 4 heads x 5 seeds


# The gap rule's metric (phase key `gap_metric`).


def test_the_ner_gap_rule_compares_entity_f1_and_old_records_read_as_token_accuracy():
    conll = spec.resolve(config_cli.load("configs/tiny.py:conll", []))
    assert spec.binding_form(conll)["config"]["phase1"]["gap_metric"] == "f1"
    old = conll.raw | {"phase1": {k: v for k, v in conll.raw["phase1"].items() if k != "gap_metric"}}
    assert spec.recorded_binding_form(old, conll.raw)["config"]["phase1"]["gap_metric"] == "accuracy"
    assert spec.resolve(spec.config_from_plain(old), recorded=True).phases[0].gap_metric == "accuracy"
    # Classification: the primary metric before and after, so older runs bind as they did.
    qqp = spec.resolve(config_cli.load("configs/tiny.py", []))
    old = qqp.raw | {"phase1": {k: v for k, v in qqp.raw["phase1"].items() if k != "gap_metric"}}
    assert spec.recorded_binding_form(old, qqp.raw) == spec.binding_form(qqp)


def test_the_loop_uses_the_phases_gap_metric():
    ctx = SimpleNamespace(task=tasks.get_task("conll2003"))
    phase = phases.Phase("p", ((".*", "all"),), {"all": 1.0}, num_steps=1, max_train_dev_gap=0.02)
    assert loop.gap_metric_of(ctx, phase) == "f1"
    assert loop.gap_metric_of(ctx, dataclasses.replace(phase, gap_metric="accuracy")) == "accuracy"


def test_a_gap_metric_the_task_does_not_score_is_named():
    config = config_cli.load("configs/tiny.py:conll", ["phase1.gap_metric=pearson"])
    with pytest.raises(config_cli.ConfigError, match="config.phase1.gap_metric='pearson'"):
        spec.resolve(config)


def test_the_committed_conll_grid_ran_with_the_token_accuracy_gap_and_still_reads_as_finished(tmp_path):
    workdir = REPO / "docs/grids/paper_conll_small"
    small = config_cli.load("configs/experiments/paper_conll.py:small", [], kind="grid")
    assert _states(small, workdir) == {grid.FINISHED: 18}
    f1 = _load("configs/experiments/paper_conll.py:small", base=small.base + ",phase1.gap_metric=f1")
    # stack-and-finetune's 6 runs ran another gap rule; the others have no gap rule
    assert _states(f1, workdir) == {grid.FINISHED: 12, grid.STARTED: 6}
    copy = _copy_records("docs/grids/paper_conll_small", tmp_path)
    grid.plan_grid(small, copy)  # a rerun of its workdir: the same grid config
    assert _states(small, copy) == {grid.FINISHED: 18}


# The presets (configs/experiments/*.py).


@pytest.mark.parametrize(
    ("preset", "heads", "test_file"),
    [
        ("paper_qqp.py:test", ["cls_mlp", "sim_transformer"], "../shared/data/qqp/test.tsv"),
        (
            "paper_yahoo.py:test",
            ["cls_mlp", "densenet", "highway_lstm"],
            "../shared/data/yahoo_answers/test.csv",
        ),
        ("paper_conll.py:test", ["token_mlp", "bilstm_crf"], "../shared/data/conll2003/eng.testb"),
    ],
)
def test_the_test_presets_give_finetune_only_stack_and_finetunes_flops(preset, heads, test_file):
    g = config_cli.load(f"configs/experiments/{preset}", [], kind="grid")
    runs = cells.runs_of(g)
    assert g.num_seeds == 5
    matched = [r for r in runs if r.matched is not None and r.seed == 0]
    assert [dict(r.cell)["head.name"] for r in matched] == heads
    for run in matched:
        config = grid.run_config(g, run)
        assert config.strategy == "finetune_only" and config.data.test_file == test_file
        assert (config.matched_budget.rule, config.matched_budget.compared) == ("flops", "stack_and_finetune")
        # more than stack-and-finetune's fine-tuning steps: its phase 1's cached forward is added
        assert config.phase2.num_steps > (150 if "yahoo" in preset else 300)
    # The report pairs stack-and-finetune with the matched baseline: the paper's contrast (the complex
    # head or ensemble against the light head fine-tuned, heads[0]) and every head against itself.
    configured = {
        (dict(c.cell)["head.name"], dict(c.other)["head.name"])
        for c in cells.comparisons_of(g)
        if c.configured
        and dict(c.cell)["strategy"] == "stack_and_finetune"
        and dict(c.other)["strategy"] == MATCHED
    }
    complex_head = {"paper_qqp": "sim_transformer", "paper_yahoo": "densenet+highway_lstm"}.get(
        preset.split(".")[0], "bilstm_crf"
    )
    assert configured >= {(complex_head, heads[0]), *((head, head) for head in heads)}


def test_the_conll_test_preset_runs_the_gap_rule_on_entity_f1():
    g = config_cli.load("configs/experiments/paper_conll.py:test", [], kind="grid")
    run = next(r for r in cells.runs_of(g) if dict(r.cell)["strategy"] == "stack_and_finetune")
    assert spec.binding_form(grid.run_spec(g, run))["config"]["phase1"]["gap_metric"] == "f1"
    assert {dict(r.cell)["strategy"] for r in cells.runs_of(g)} == {
        "finetune_only",
        "stack_and_finetune",
        MATCHED,
    }


def test_the_phase1_dropout_preset_separates_the_dropout_mismatch_from_a_weaker_head():
    g = config_cli.load("configs/experiments/phase1_dropout.py:separate", [], kind="grid")
    configs = {dict(r.cell)["recipe"]: grid.run_config(g, r) for r in cells.runs_of(g) if r.seed == 0}
    small = config_cli.load("configs/experiments/phase1_dropout.py:small", [], kind="grid")
    for run in (r for r in cells.runs_of(small) if r.seed == 0):  # its runs, reusable
        assert config_cli.to_plain(grid.run_config(small, run)) == config_cli.to_plain(
            configs[dict(run.cell)["recipe"]]
        )
    cached = config_cli.to_plain(configs["cached"])
    no_dropout = config_cli.to_plain(configs["cached_no_dropout"])
    assert no_dropout["model"].pop("dropout_rate") == 0.0 and cached["model"].pop("dropout_rate") is None
    assert no_dropout == cached  # the backbone's dropout off in phase 2, nothing else
    short = config_cli.to_plain(configs["cached_30_steps"])
    assert short["phase1"].pop("num_steps") == 30 and cached["phase1"].pop("num_steps") == 120
    cached["model"]["dropout_rate"] = None
    assert short == cached  # a 30-step phase 1, nothing else
    # The report puts each separating cell against the recipe it changes and against phase-1 dropout.
    configured = {
        (dict(c.cell)["recipe"], dict(c.other)["recipe"]) for c in cells.comparisons_of(g) if c.configured
    }
    separating = {"cached_no_dropout", "cached_30_steps"}
    assert configured >= {(new, old) for new in separating for old in ("cached", "dropout")}
