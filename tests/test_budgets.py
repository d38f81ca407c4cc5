"""Matched-budget cells (experiments/budgets.py, the grid key `matched`) and the gap rule's metric on NER:
what a grid builds, the step counts it computes, and that committed grids keep reading as finished."""

import dataclasses
import json
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
    """The grid `name` with `changes`; other `matched` cells than the preset's: none planned by the light
    heads' FLOPs (the preset's `matched_light_heads` names its own cells)."""
    if "matched" in changes:
        changes.setdefault("matched_light_heads", "")
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


# Which heads a FLOPs budget counts (grid key `matched_light_heads`, run key `matched_budget.head_flops`).

COMMITTED_TEST_GRIDS = ("paper_qqp", "paper_conll", "paper_yahoo")
# The preset each committed test grid's workdir is bound to: `test`, or `test_no_cache` once its no-cache
# matched cells are committed too.
BOUND_PRESET = {"paper_qqp": "test_no_cache", "paper_conll": "test_no_cache", "paper_yahoo": "test_no_cache"}


@pytest.fixture
def one_device(monkeypatch):
    """The committed grids ran on one device: a matched cell's step count follows the global batch."""
    monkeypatch.setattr(jax, "device_count", lambda: 1)


@pytest.mark.slow  # reads a committed grid's runs
@pytest.mark.parametrize("task", COMMITTED_TEST_GRIDS)
def test_a_committed_grids_matched_runs_plan_the_steps_and_budget_they_ran(task, one_device, tmp_path):
    """Their presets name them in `matched_light_heads` (planned before every head had its FLOPs):
    reloaded, each plans its recorded step count and budget to the digit, reads as finished, and the grid
    binds its recorded grid_config.json as it is (QQP's and Yahoo's written before the key); every other
    run of the grid reads as finished too (CoNLL's stacked cells bind the strict F1 their gap rule read)."""
    folder = f"docs/grids/{task}_test"
    g = config_cli.load(f"configs/experiments/{task}.py:{BOUND_PRESET[task]}", [], kind="grid")
    matched = [r for r in cells.runs_of(g) if r.matched is not None and r.matched.budget == "plan"]
    assert matched and all(r.matched.heads == "light" for r in matched)
    for run in matched:
        planned = grid.run_config(g, run)
        recorded = json.loads((REPO / folder / "runs" / run.name / "config.json").read_text())["config"]
        assert planned.phase2.num_steps == recorded["phase2"]["num_steps"], run.name
        assert planned.matched_budget.budget == recorded["matched_budget"]["budget"], run.name
        assert planned.matched_budget.head_flops == "light"
        assert "head_flops" not in recorded["matched_budget"]  # recorded before the key
        assert config_cli.with_legacy_keys(recorded)["matched_budget"]["head_flops"] == "light"
    states = {run.name: state for _, run, state in grid.run_states(g, REPO / folder)}
    assert set(states.values()) == {grid.FINISHED}
    copy = _copy_records(folder, tmp_path)
    grid.plan_grid(g, copy)  # the same grid: its record without the key reads as naming these cells
    # The committed report says which heads each matched cell's budget counted.
    report = json.loads((REPO / folder / "report.json").read_text())
    plan = {
        row["head_flops"] for row in report["matched_budgets"] if "no_cache" not in row["cell"]["strategy"]
    }
    assert plan == {"light"}
    # The no-cache cells, where committed (test_no_cache), count every head.
    assert {row["head_flops"] for row in report["matched_budgets"]} - plan <= {"every"}
    assert "| light heads only |" in (REPO / folder / "report.md").read_text()


def test_a_new_grid_counts_every_heads_flops(one_device, tmp_path):
    """Without `matched_light_heads` a FLOPs budget counts every head: QQP's Sim-Transformer cell, 665
    steps when its head counted 0, plans 627 (its head costs in the budget and in each of its steps);
    cls_mlp, counted both ways, keeps 665. On the committed grid's workdir that is another grid."""
    g = _load(QQP_TEST, matched_light_heads="")
    steps = {}
    for run in (r for r in cells.runs_of(g) if r.matched is not None and r.seed == 0):
        config = grid.run_config(g, run)
        assert config.matched_budget.head_flops == "every"
        steps[dict(run.cell)["head.name"]] = config.phase2.num_steps
    assert steps == {"cls_mlp": 665, "sim_transformer": 627}
    copy = _copy_records("docs/grids/paper_qqp_test", tmp_path)
    with pytest.raises(workdirs.ConfigMismatch, match="grid.matched_light_heads"):
        grid.plan_grid(g, copy)
    # A new grid records the convention, so that a rerun does not read it as from before the key.
    fresh = tmp_path / "fresh"
    grid.plan_grid(g, fresh)
    assert json.loads((fresh / "grid_config.json").read_text())["grid"]["matched_light_heads"] == ""
    grid.plan_grid(g, fresh)


@pytest.mark.slow  # reads the committed grids' runs
def test_the_no_cache_presets_add_cells_that_count_every_head(one_device, tmp_path):
    """paper_*.py:test_no_cache: the test grid plus finetune-only at stack-and-finetune's standalone
    no-cache FLOPs, every head counted; on the committed workdir its matched runs stay finished."""
    expected = {
        "paper_qqp": {"cls_mlp": 341, "sim_transformer": 353},
        "paper_conll": {"token_mlp": 504, "bilstm_crf": 542},
        "paper_yahoo": {"cls_mlp": 201, "densenet": 202, "highway_lstm": 207},
    }
    for task, heads in expected.items():
        g = config_cli.load(f"configs/experiments/{task}.py:test_no_cache", [], kind="grid")
        test = config_cli.load(f"configs/experiments/{task}.py:test", [], kind="grid")
        new = [r for r in cells.runs_of(g) if r.matched is not None and r.matched.budget == "no_cache"]
        assert len(new) == 5 * len(heads) and all(r.matched.heads == "every" for r in new)
        assert [r.name for r in cells.runs_of(g) if r not in new] == [r.name for r in cells.runs_of(test)]
        steps = {}
        for run in (r for r in new if r.seed == 0):
            config = grid.run_config(g, run)
            recorded = (config.matched_budget.rule, config.matched_budget.head_flops)
            assert recorded == ("flops.no_cache", "every")
            steps[dict(run.cell)["head.name"]] = config.phase2.num_steps
        assert steps == heads, task
        states = {run.name: state for _, run, state in grid.run_states(g, REPO / f"docs/grids/{task}_test")}
        plan = [r for r in cells.runs_of(g) if r.matched is not None and r not in new]
        assert {states[r.name] for r in plan} == {grid.FINISHED}
        # Not started until their runs are committed; then finished, never changed.
        assert {states[r.name] for r in new} <= {grid.NOT_STARTED, grid.FINISHED}
        no_cache = "strategy=finetune_only@matched_flops.no_cache:stack_and_finetune"
        assert any(c.configured and dict(c.other)["strategy"] == no_cache.split("=", 1)[1]
                   for c in cells.comparisons_of(g))  # fmt: skip


@pytest.mark.parametrize(
    ("light", "message"),
    [
        ("strategy=finetune_only@matched_steps:stack_and_finetune", "no cell of the grid's `matched`"),
        ("strategy=finetune_only@matched_flops.no_cache:stack_and_finetune", "no cell of the grid's"),
    ],
)
def test_a_light_heads_cell_that_is_no_flops_matched_cell_is_named(light, message, tmp_path):
    g = _load(QQP_TEST, matched_light_heads=light)
    with pytest.raises(config_cli.ConfigError, match=message):
        grid.plan_grid(g, tmp_path)
    steps = _load(
        QQP_TEST,
        matched="strategy=finetune_only@matched_steps:stack_and_finetune",
        matched_light_heads="strategy=finetune_only@matched_steps:stack_and_finetune",
        comparisons="baseline",
    )
    with pytest.raises(config_cli.ConfigError, match="counts no FLOPs"):
        grid.plan_grid(steps, tmp_path)


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


@pytest.mark.slow  # reads a committed grid's runs
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
