"""Matched budgets: grid cells that give a baseline the budget of the strategy it is compared with.

A grid's optional `matched` key, "key=value@matched_<rule>:compared|...; ...", e.g.

    c.matched = "strategy=finetune_only@matched_flops:stack_and_finetune"

adds to axis `key` the cell `finetune_only@matched_flops:stack_and_finetune` (for every value of the
other axes, and every seed): the settings of `value` with its one phase's `num_steps` raised or lowered
until it costs what `compared` (same other axis values and seed) plans to cost, by `rule`:

  steps     optimizer steps (a head-only step on cached features counts as much as a fine-tuning one)
  examples  examples through the backbone's forward (a feature-cached phase: its train split, once)
  flops     analytic FLOPs (training/compute.py: a fine-tuning step costs 3 forwards, a cached phase
            one forward over its train split plus its head steps)

The rule may name which of the compared cell's standalone costs is the budget, "<rule>.<budget kind>":

  plan      (the default, `matched_flops` = `matched_flops.plan`) its whole step budgets, its feature
            cache built by itself over its train split (no early stop, no shared cache)
  no_cache  its whole step budgets with no feature cache: a frozen phase runs the backbone forward over
            each of its batches (a phase that reads fewer examples than the split holds costs less so)

e.g. "strategy=finetune_only@matched_flops.no_cache:stack_and_finetune". Both are `compute.planned`'s
(`standalone.own_cache`, `standalone.no_cache`), so the matched cell's length is fixed before either
runs. The matched
cell gets the smallest step count that is at least that budget. Its run config records the match
(`matched_budget.rule`, `.compared`, `.budget` in the rule's unit, `.head_flops`), which the report
prints; those keys do not bind the run (spec._NEUTRAL): it is the same run as any other of that step
count.

Which heads a FLOPs budget counts: every head (models/flops.py HEAD_FLOPS), unless the grid's optional
`matched_light_heads` names the cell (the same syntax as `matched`, "key=value@matched_flops...:compared
|...; ..."): then the light heads alone (cls_mlp, linear, token_mlp; flops.LIGHT_HEAD_FLOPS), the count
every matched cell was planned with before each head had its own (2026-11-28). A preset whose committed
grid ran such cells names them there, so a rerun plans the steps they ran; a grid recorded before the key
binds as naming every flops cell of its `matched` (grid.binding_form); a run recorded before
`matched_budget.head_flops` reads as "light" (config_cli.with_legacy_keys).

Counting the compared cell's train split reads its train file (or the hub's split) when the grid is
planned. Adding matched cells to a grid workdir leaves its other runs as they are: the new grid config
is taken with --allow_config_change, and every run of an unchanged cell stays finished (grid.finished).
"""

import dataclasses
import math
import re

import jax
import ml_collections

from stackft_jax.config import spec
from stackft_jax.data import task_spec
from stackft_jax.runtime.cli_errors import ConfigError
from stackft_jax.training import compute

RULES = {"steps": "optimizer_steps", "examples": "examples_forward", "flops": "flops"}
LIGHT_HEADS_KEY = "matched_light_heads"  # the grid key naming the cells planned by the light heads' count
# budget kind -> compute.planned's standalone accounting
BUDGETS = {"plan": "own_cache", "no_cache": "no_cache"}
_MATCHED = re.compile(
    r"^(?P<value>[\w.+-]+)@matched_(?P<rule>[a-z]+)(?P<dot>\.(?P<budget>\w*))?:(?P<compared>[\w.+-]+)$"
)


@dataclasses.dataclass(frozen=True)
class Matched:
    """One matched cell of a grid axis: `value`'s settings at `compared`'s budget by `rule`."""

    key: str
    value: str
    rule: str
    compared: str
    budget: str = "plan"  # a BUDGETS kind
    heads: str = "every"  # the heads a flops rule counts (flops.HEAD_COUNTS): `matched_light_heads`

    @property
    def rule_text(self) -> str:
        """The rule as written (and recorded in `matched_budget.rule`): "flops", "flops.no_cache"."""
        return self.rule if self.budget == "plan" else f"{self.rule}.{self.budget}"

    @property
    def label(self) -> str:
        return f"{self.value}@matched_{self.rule_text}:{self.compared}"


def parse_matched(grid: ml_collections.ConfigDict, axes: dict[str, list[str]]) -> list[Matched]:
    """The grid's `matched` ("" or absent: none), each checked against `axes` (cells.parse_axes)."""
    found: list[Matched] = []
    for part in filter(str.strip, grid.get("matched", "").split(";")):
        key, sep, values = part.partition("=")
        key = key.strip()
        where = f"config key 'matched': {part.strip()!r}"
        if not sep or key not in axes:
            raise ConfigError(
                f"{where} is not `key=value@matched_<rule>:compared|...` with key an axis ({', '.join(axes)})"
            )
        for item in values.split("|"):
            match = _MATCHED.match(item.strip())
            if match is None:
                raise ConfigError(
                    f"{where}: {item.strip()!r} is not `value@matched_<rule>[.<budget>]:compared` "
                    f"(rule: {' | '.join(RULES)}; budget: {' | '.join(BUDGETS)})"
                )
            value, rule, compared = match["value"], match["rule"], match["compared"]
            if rule not in RULES:
                raise ConfigError(f"{where}: rule {rule!r}: choose {' | '.join(RULES)}")
            budget = match["budget"] if match["dot"] else "plan"
            if budget not in BUDGETS:
                raise ConfigError(
                    f"{where}: matched_{rule}.{budget} names no budget kind: choose {' | '.join(BUDGETS)}"
                )
            for name in (value, compared):
                if name not in axes[key]:
                    raise ConfigError(
                        f"{where}: {name!r} is not a value of axis {key} ({'|'.join(axes[key])})"
                    )
            if value == compared:
                raise ConfigError(f"{where}: a cell matched to itself")
            matched = Matched(key, value, rule, compared, budget)
            if matched in found:
                raise ConfigError(f"{where}: {matched.label} is named twice")
            found.append(matched)
    return _with_light_heads(grid, found)


def _items(text: str) -> list[tuple[str, str]]:
    """("key", "value@matched_...:compared") of a `matched`-syntax string, unchecked."""
    found = []
    for part in filter(str.strip, text.split(";")):
        key, _, values = part.partition("=")
        found += [(key.strip(), item.strip()) for item in values.split("|") if item.strip()]
    return found


def _with_light_heads(grid: ml_collections.ConfigDict, found: list[Matched]) -> list[Matched]:
    """`found` with the cells the grid's `matched_light_heads` names counting the light heads alone."""
    named = _items(grid.get(LIGHT_HEADS_KEY, ""))
    by_label = {(m.key, m.label): m for m in found}
    for key, label in named:
        where = f"config key {LIGHT_HEADS_KEY!r}: {key}={label}"
        if (key, label) not in by_label:
            raise ConfigError(f"{where} is no cell of the grid's `matched` ({grid.get('matched', '')!r})")
        if by_label[key, label].rule != "flops":
            raise ConfigError(f"{where}: its rule counts no FLOPs, so no head either")
    light = set(named)
    return [dataclasses.replace(m, heads="light") if (m.key, m.label) in light else m for m in found]


def light_heads_binding(grid: dict) -> list[str]:
    """The cells a recorded grid (its JSON form) planned by the light heads' count, as "key=label",
    sorted: what its `matched_light_heads` names, or for a grid recorded before that key, every flops
    cell of its `matched` (they were all planned so)."""
    if LIGHT_HEADS_KEY in grid:
        named = _items(grid[LIGHT_HEADS_KEY] or "")
    else:
        named = [
            (key, item)
            for key, item in _items(grid.get("matched") or "")
            if (m := _MATCHED.match(item)) is not None and m["rule"] == "flops"
        ]
    return sorted(f"{key}={label}" for key, label in named)


def steps_for(budget: float, one_step: float, two_steps: float) -> int:
    """The fewest steps (at least 1) whose cost reaches `budget`, for a cost linear in the step count
    (`one_step`, `two_steps`: the cost of 1 and of 2 steps; a feature cache's build is the fixed part)."""
    per_step = two_steps - one_step
    fixed = one_step - per_step
    if per_step <= 0:
        raise ValueError("a step costs nothing under this rule: its budget cannot be matched")
    # The tolerance keeps a budget that is an exact multiple (steps: 420 = 420 x 1) from rounding up.
    return max(1, math.ceil((budget - fixed) / per_step - 1e-9))


_TRAIN_EXAMPLES: dict[tuple, int] = {}  # (task, files) -> train examples: read once per grid plan


def train_examples(run_spec) -> int:
    """The examples of the run's train split (what a feature-cached phase caches and an epoch holds)."""

    paths = {"train": run_spec.data.train_file, "dev": run_spec.data.dev_file}
    data = run_spec.data
    key = (run_spec.task.name, data.train_file, data.dev_file, repr(run_spec.task), data.selection_fraction)
    key += (data.selection_seed,)
    if key not in _TRAIN_EXAMPLES:
        _TRAIN_EXAMPLES[key] = len(
            task_spec.read_splits(
                run_spec.task,
                paths,
                selection_fraction=data.selection_fraction,
                selection_seed=data.selection_seed,
            )["train"]
        )
    return _TRAIN_EXAMPLES[key]


def settings(matched: Matched, load) -> list[str]:
    """The overrides that give the matched cell its budget: its phase's `num_steps` and the record of
    the match (`matched_budget.*`). `load(cell_value, extra_overrides)` loads the run config of this
    cell's other axis values and seed with `matched.key` set to `cell_value`."""

    def cost(value: str, extra: list[str]) -> float:
        run_spec = spec.resolve(load(value, extra), recorded=True)
        batch = run_spec.per_device_batch_size * jax.device_count()  # the global batch a run gets here
        planned = compute.planned(
            run_spec, train_examples=train_examples(run_spec), global_batch_size=batch, heads=matched.heads
        )
        return planned["standalone"][BUDGETS[matched.budget]][RULES[matched.rule]]

    base = spec.resolve(load(matched.value, []), recorded=True)
    sources = [phase.source for phase in base.phases]
    if len(sources) != 1 or not sources[0].startswith("config.phase"):
        raise ConfigError(
            f"config key 'matched': {matched.label}: {matched.value} trains phases {sources}; a matched "
            "cell sets the step count of a preset strategy's one phase (e.g. finetune_only's phase2.*)"
        )
    steps_key = f"{sources[0].removeprefix('config.')}.num_steps"
    budget = cost(matched.compared, [])
    steps = steps_for(
        budget, cost(matched.value, [f"{steps_key}=1"]), cost(matched.value, [f"{steps_key}=2"])
    )
    return [
        f"{steps_key}={steps}",
        f"matched_budget.rule={matched.rule_text}",
        f"matched_budget.compared={matched.compared}",
        f"matched_budget.budget={budget!r}",
        *([f"matched_budget.head_flops={matched.heads}"] if matched.rule == "flops" else []),
    ]
