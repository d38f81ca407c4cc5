"""What each strategy means, as data: a strategy is a list of phases.

A phase says which parameter groups train at which peak learning rate (`rules`: `(regex, group)` over
'/'-joined parameter paths, first match wins; the group `frozen` does not train), how long it runs and
when it stops early. Each phase starts from the parameters the previous one ended with, with a fresh
optimizer, and ends with its own named checkpoint (`checkpoints/<name>_end`).

A config file writes its own schedule as `config.phases`, a list of `block(...)`s (configs/tiny.py's
`three_phases`); `config.strategy` then names it in reports. Left empty, `config.strategy` names a
preset that expands to such a list:

- `finetune_only`      `finetune` (phase2.*): BERT + head all train from step 0; the new, randomly
                       initialised head at its own rate (`phase2.new_head_learning_rate`), as BERT
                       recipes for new heads do: at BERT's low rate Adam moves a new head by at most
                       about that rate per step, so a BiLSTM head barely leaves its initialisation in a
                       short budget and predicts the majority class (docs/finetune_collapse.md).
- `finetune_only_uniform` the same with the head at BERT's rate (Devlin et al.'s and Wang et al.'s one
                       rate for every parameter), kept by name so a grid can show both baselines.
- `stack_only`         `stack` (phase1.*): the backbone stays frozen; a learned scalar mix of all layers
                       feeds the head when `model.scalar_mix` is on (Peters et al. 2019).
- `stack_and_finetune` `phase1` (phase1.*: backbone frozen, head lr ~1e-3, stop before the head
                       overfits), then `phase2` (phase2.*: everything, low lr) (Wang et al. 2019).
- `gradual_unfreezing` `head` (phase1.*), then one phase per `unfreezing.layers_per_phase` layer groups
                       unfrozen from the top (the pooler, where the family has one, with the top layer;
                       the embeddings last), with
                       discriminative rates (Howard & Ruder 2018); the last phase, everything, is phase2.*.
- `lp_ft`              `linear_probe` (phase1.*: a linear head, `head.name=linear`, on the frozen
                       backbone, trained to its budget), then `finetune` (phase2.*) (Kumar et al. 2022).

A frozen-backbone phase may run its backbone without dropout (`backbone_dropout=False`); it can then
train the head from backbone features computed once (`feature_cache`, see feature_cache.py).
"""

import dataclasses
import math
import re
from collections.abc import Callable, Sequence

import ml_collections
from ml_collections.config_dict import placeholder

from stackft_jax.runtime.cli_errors import ConfigError

SCHEDULES = ("constant", "warmup_linear", "slanted_triangular")
FEATURE_CACHE_DTYPES = ("float32", "bfloat16")
_PHASE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

FROZEN = "frozen"  # the group of a rule whose parameters a phase does not train (optim.py zeroes them)


@dataclasses.dataclass(frozen=True)
class StopRule:
    """A phase stops at the first of: its step budget; the phase's gap metric (`Phase.gap_metric`: the
    task's primary metric unless set, e.g. accuracy, STS-B's pearson, NER's entity F1) on train exceeding
    dev by more than `max_train_dev_gap` (Wang et al.: hand phase 2 a head that has not yet overfitted);
    the dev metric not improving for `patience_evals` evaluations. None disables a rule."""

    max_train_dev_gap: float | None = None
    patience_evals: int | None = None


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    rules: tuple[tuple[str, str], ...]
    learning_rates: dict[str, float]
    num_steps: int
    warmup_steps: int
    schedule: str
    weight_decay: float
    stop: StopRule
    gap_eval_examples: int = 0  # train examples scored in eval mode for the train/dev gap
    gap_metric: str = ""  # the metric that gap compares; "": the task's (TaskSpec.gap_metric)
    backbone_dropout: bool = True  # False: the backbone runs deterministically, the head keeps dropout
    feature_cache: bool = False  # train from stored backbone features (frozen, dropout-free backbone)
    feature_cache_dtype: str = "float32"
    feature_cache_dir: str = ""  # shared by runs, one folder per fingerprint; "" or "none": the workdir
    source: str = ""  # the config keys it was written from, for error messages ("config.phases[1]")

    def __post_init__(self):
        if self.feature_cache and (self.backbone_dropout or self.trains_backbone):
            raise ConfigError(
                f"{self.source or 'phase ' + self.name}: a feature cache needs a frozen backbone that runs "
                "without dropout (backbone_dropout=False, every backbone rule in the frozen group)"
            )

    @property
    def trains_backbone(self) -> bool:
        """Whether a rule may give a backbone parameter a learning rate; `check_rules` makes it exact."""
        return any(group != FROZEN and not pattern.startswith("head") for pattern, group in self.rules)


# One phase of `config.phases`: every key a phase has, with its default (`block` copies them: a
# placeholder is a shared reference, so each block needs its own).
BLOCK_DEFAULTS = {
    "num_steps": 0,  # step budget; 0: use num_epochs
    "num_epochs": 1.0,  # budget in epochs when num_steps is 0
    "warmup_steps": 0,  # linear warm-up steps; 0: use warmup_ratio
    "warmup_ratio": 0.0,  # warm-up as a fraction of the budget
    "schedule": "constant",  # constant | warmup_linear | slanted_triangular
    "weight_decay": 0.01,  # AdamW decay on kernels and embeddings
    "max_train_dev_gap": placeholder(float),  # stop once train accuracy exceeds dev by this; None: off
    "gap_eval_examples": 0,  # train examples scored to measure that gap
    "gap_metric": "",  # the metric of that gap; "": the task's primary one (entity F1 on NER)
    "patience_evals": 0,  # stop after this many evals without dev improvement; 0: off
    "backbone_dropout": True,  # the backbone runs in training mode (with dropout)
    "feature_cache": False,  # train the head on stored backbone features (frozen, dropout-free)
    "feature_cache_dtype": "float32",  # float32 | bfloat16
    "feature_cache_dir": "",  # folder shared by runs; "": the workdir's (or the grid's)
}


# The alias blocks `phase1.*`, `phase2.*` and `unfreezing.*` (config/defaults.py writes them with their
# comments; tests/test_spec.py holds the two equal): the inputs of the presets, which turn them into
# phase blocks. With `config.phases` written they do not apply, and spec.resolve refuses a changed one.
ALIAS_DEFAULTS = {
    "phase1": {
        "learning_rate": 1e-3,
        "num_steps": 0,
        "num_epochs": 1.0,
        "warmup_steps": 0,
        "warmup_ratio": 0.0,
        "schedule": "constant",
        "weight_decay": 0.01,
        "max_train_dev_gap": 0.02,
        "gap_eval_examples": 2000,
        "gap_metric": "",
        "patience_evals": 0,
        "backbone_dropout": True,
        "feature_cache": False,
        "feature_cache_dtype": "float32",
        "feature_cache_dir": "",
    },
    "phase2": {
        "backbone_learning_rate": 2e-5,
        "head_learning_rate": 0.0,
        "new_head_learning_rate": 1e-3,
        "layerwise_lr_decay": 1.0,
        "num_steps": 0,
        "num_epochs": 3.0,
        "warmup_steps": 0,
        "warmup_ratio": 0.1,
        "schedule": "warmup_linear",
        "weight_decay": 0.01,
        "patience_evals": 0,
    },
    "unfreezing": {"layers_per_phase": 1, "num_steps": 0, "num_epochs": 1.0, "layerwise_lr_decay": 0.95},
}


def clear_aliases(config: ml_collections.ConfigDict) -> None:
    """Resets the alias blocks to their defaults: a config file that writes `config.phases` on top of a
    base that set `phase1.*`/`phase2.*` keys (configs/tiny.py's three_phases)."""
    for alias, defaults in ALIAS_DEFAULTS.items():
        for key, value in defaults.items():
            config[alias][key] = value


def block(
    name: str,
    *,
    rules: Sequence[tuple[str, str]],
    learning_rates: dict[str, float],
    **options,
) -> ml_collections.ConfigDict:
    """One phase for `config.phases`, e.g.
    `block("head", rules=[("backbone/.*", "frozen"), ("head/.*", "head")], learning_rates={"head": 1e-3},
    num_steps=100)`; `options` are keys of BLOCK_DEFAULTS."""
    unknown = sorted(set(options) - set(BLOCK_DEFAULTS))
    if unknown:
        raise ConfigError(f"phase {name!r}: unknown keys {unknown}; a phase has {sorted(BLOCK_DEFAULTS)}")
    c = ml_collections.ConfigDict(
        {
            "name": name,  # names its checkpoints (checkpoints/<name>_end), logs and results
            "rules": [tuple(rule) for rule in rules],  # (regex, group) over parameter paths; first match wins
            # peak learning rate per trained group of `rules` (the group `frozen` has none)
            "learning_rates": ml_collections.ConfigDict({g: float(lr) for g, lr in learning_rates.items()}),
            **BLOCK_DEFAULTS,
            "max_train_dev_gap": placeholder(float),
        }
    )
    for key, value in options.items():
        c[key] = float(value) if isinstance(BLOCK_DEFAULTS[key], float) and value is not None else value
    return c


def _frozen_backbone_block(name: str, config: ml_collections.ConfigDict, *, guard: bool):
    """phase1.* as a phase: the head alone. `guard` keeps the overfitting rule (a phase that a
    fine-tuning phase follows); without it the head trains its full budget (or until dev stalls)."""
    p1 = config.phase1
    return block(
        name,
        rules=[("backbone/.*", FROZEN), ("head/.*", "head")],
        learning_rates={"head": p1.learning_rate},
        **{key: p1[key] for key in ("num_steps", "num_epochs", "warmup_steps", "warmup_ratio")},
        **{key: p1[key] for key in ("schedule", "weight_decay", "patience_evals", "backbone_dropout")},
        max_train_dev_gap=p1.max_train_dev_gap if guard else None,
        gap_eval_examples=p1.gap_eval_examples if guard else 0,
        gap_metric=p1.gap_metric if guard else "",
        feature_cache=p1.feature_cache,
        feature_cache_dtype=p1.feature_cache_dtype,
        feature_cache_dir=p1.feature_cache_dir,
    )


def _layer_units(num_layers: int, has_pooler: bool = True) -> list[tuple[tuple[str, str], ...]]:
    """The backbone's layer groups from the top: the pooler (if the family has one) with the top layer,
    each lower layer, then the embeddings; each a tuple of (regex, group) rules."""
    top = num_layers - 1
    pooler = [("backbone/pooler/.*", "backbone")] if has_pooler else []
    units = [(*pooler, (rf"backbone/layers/{top}/.*", f"backbone_layer{top}"))]
    units += [((rf"backbone/layers/{i}/.*", f"backbone_layer{i}"),) for i in range(top - 1, -1, -1)]
    units.append((("backbone/embeddings/.*", "backbone_embeddings"),))
    return units


def backbone_rules(
    num_layers: int, layerwise_lr_decay: float, has_pooler: bool = True
) -> tuple[tuple[str, str], ...]:
    """Discriminative learning rates (Howard & Ruder; Peters et al.): with decay < 1, layer i of L gets
    its own group whose lr is scaled by decay**(L - i); embeddings sit below layer 0, the pooler (in the
    families that have one) on top."""
    if layerwise_lr_decay == 1.0:
        return (("backbone/.*", "backbone"),)
    rules = [(rf"backbone/layers/{i}/.*", f"backbone_layer{i}") for i in range(num_layers)]
    rules += [("backbone/embeddings/.*", "backbone_embeddings")]
    rules += [("backbone/.*", "backbone")] if has_pooler else []
    return tuple(rules)


def backbone_learning_rates(
    peak: float, num_layers: int, layerwise_lr_decay: float, has_pooler: bool = True
) -> dict[str, float]:
    if layerwise_lr_decay == 1.0:
        return {"backbone": peak}
    rates = {f"backbone_layer{i}": peak * layerwise_lr_decay ** (num_layers - i) for i in range(num_layers)}
    rates["backbone_embeddings"] = peak * layerwise_lr_decay ** (num_layers + 1)
    if has_pooler:
        rates["backbone"] = peak
    return rates


def head_rate(config: ml_collections.ConfigDict, *, head_is_new: bool) -> float:
    """The head's rate in an all-parameters phase: `phase2.head_learning_rate` when set; otherwise
    `phase2.new_head_learning_rate` for a head no earlier phase trained, and BERT's own rate for one
    that was (stack-and-finetune's phase 2: Wang et al.'s one low rate for everything)."""
    p2 = config.phase2
    if p2.head_learning_rate:
        return p2.head_learning_rate
    return p2.new_head_learning_rate if head_is_new else p2.backbone_learning_rate


def _everything_block(
    name: str, config: ml_collections.ConfigDict, num_layers: int, has_pooler: bool, *, head_rate: float
) -> ml_collections.ConfigDict:
    """phase2.* as a phase: the backbone (per-layer groups when layerwise_lr_decay < 1) and the head."""
    p2 = config.phase2
    decay = p2.layerwise_lr_decay
    return block(
        name,
        rules=[*backbone_rules(num_layers, decay, has_pooler), ("head/.*", "head")],
        learning_rates={
            **backbone_learning_rates(p2.backbone_learning_rate, num_layers, decay, has_pooler),
            "head": head_rate,
        },
        **{key: p2[key] for key in ("num_steps", "num_epochs", "warmup_steps", "warmup_ratio")},
        **{key: p2[key] for key in ("schedule", "weight_decay", "patience_evals")},
    )


def _finetune_only(config, num_layers, has_pooler):
    rate = head_rate(config, head_is_new=True)
    return [(_everything_block("finetune", config, num_layers, has_pooler, head_rate=rate), "config.phase2")]


def _finetune_only_uniform(config, num_layers, has_pooler):
    rate = config.phase2.head_learning_rate or config.phase2.backbone_learning_rate
    return [(_everything_block("finetune", config, num_layers, has_pooler, head_rate=rate), "config.phase2")]


def _stack_only(config, num_layers, has_pooler):
    # No fine-tuning phase follows, so there is nothing to guard the head for: it trains its full
    # budget (or until dev stops improving) and the best-on-dev checkpoint is kept.
    return [(_frozen_backbone_block("stack", config, guard=False), "config.phase1")]


def _stack_and_finetune(config, num_layers, has_pooler):
    rate = head_rate(config, head_is_new=False)
    return [
        (_frozen_backbone_block("phase1", config, guard=True), "config.phase1"),
        (_everything_block("phase2", config, num_layers, has_pooler, head_rate=rate), "config.phase2"),
    ]


def _gradual_unfreezing(config, num_layers, has_pooler):
    """ULMFiT's schedule on BERT: the head first, then `layers_per_phase` more layer groups per phase,
    top down; layer i of L trains at decay**(L - i) of phase2's rate (the pooler at the full rate, the
    embeddings one step below layer 0), each group at the same rate in every phase it trains in."""
    u, p2 = config.unfreezing, config.phase2
    units = _layer_units(num_layers, has_pooler)
    rates = {
        "backbone": p2.backbone_learning_rate,
        **{
            f"backbone_layer{i}": p2.backbone_learning_rate * u.layerwise_lr_decay ** (num_layers - i)
            for i in range(num_layers)
        },
        "backbone_embeddings": p2.backbone_learning_rate * u.layerwise_lr_decay ** (num_layers + 1),
    }
    head_lr = head_rate(config, head_is_new=False)  # the first phase trained it
    plan = [(_frozen_backbone_block("head", config, guard=True), "config.phase1")]
    for end in range(u.layers_per_phase, len(units) + u.layers_per_phase, u.layers_per_phase):
        unfrozen = [rule for unit in units[:end] for rule in unit]
        last = end >= len(units)
        lowest = unfrozen[-1][1].removeprefix("backbone_")
        groups = {group for _, group in unfrozen}
        options = (
            {key: p2[key] for key in ("num_steps", "num_epochs", "warmup_steps", "warmup_ratio")}
            | {key: p2[key] for key in ("schedule", "weight_decay", "patience_evals")}
            if last
            else {"num_steps": u.num_steps, "num_epochs": u.num_epochs, "weight_decay": p2.weight_decay}
        )
        phase = block(
            f"unfreeze_{lowest}",
            rules=[*unfrozen, *([] if last else [("backbone/.*", FROZEN)]), ("head/.*", "head")],
            learning_rates={**{g: rates[g] for g in rates if g in groups}, "head": head_lr},
            **options,
        )
        plan.append((phase, "config.phase2" if last else "config.unfreezing"))
    return plan


def _lp_ft(config, num_layers, has_pooler):
    rate = head_rate(config, head_is_new=False)
    return [
        (_frozen_backbone_block("linear_probe", config, guard=False), "config.phase1"),
        (_everything_block("finetune", config, num_layers, has_pooler, head_rate=rate), "config.phase2"),
    ]


# name -> (config, number of encoder layers, whether the encoder has a pooler)
#      -> [(phase block, the config keys it comes from)]
PRESETS: dict[str, Callable] = {
    "finetune_only": _finetune_only,
    "finetune_only_uniform": _finetune_only_uniform,
    "stack_only": _stack_only,
    "stack_and_finetune": _stack_and_finetune,
    "gradual_unfreezing": _gradual_unfreezing,
    "lp_ft": _lp_ft,
}
STRATEGIES = tuple(PRESETS)
# The alias blocks each preset reads (only these bind a workdir).
PRESET_ALIASES: dict[str, tuple[str, ...]] = {
    "finetune_only": ("phase2",),
    "finetune_only_uniform": ("phase2",),
    "stack_only": ("phase1",),
    "stack_and_finetune": ("phase1", "phase2"),
    "gradual_unfreezing": ("phase1", "phase2", "unfreezing"),
    "lp_ft": ("phase1", "phase2"),
}


def _num_steps(b: ml_collections.ConfigDict, steps_per_epoch: int, source: str) -> int:
    if b.num_steps > 0:
        return int(b.num_steps)
    if b.num_epochs > 0:
        return max(1, math.ceil(b.num_epochs * steps_per_epoch))
    raise ConfigError(f"{source}.num_steps and {source}.num_epochs are both 0: the phase would not train")


def check_config(config: ml_collections.ConfigDict) -> None:
    """What can be checked before the model exists: the strategy's name, and each phase's keys."""
    if not config.phases:
        if config.strategy not in PRESETS:
            raise ConfigError(
                f"config.strategy={config.strategy!r}: choose one of {STRATEGIES}, or write config.phases"
            )
        if config.strategy == "gradual_unfreezing" and config.unfreezing.layers_per_phase < 1:
            raise ConfigError("config.unfreezing.layers_per_phase must be at least 1")
        for b, source in PRESETS[config.strategy](config, 2, True):  # the layer count changes no key
            _check_block(b, source)
        return
    if config.strategy in PRESETS:
        raise ConfigError(
            f"config.phases is written, and config.strategy={config.strategy!r} names a preset: give the "
            "schedule its own name (config.strategy labels it in results and reports)"
        )
    names = []
    for i, b in enumerate(config.phases):
        source = f"config.phases[{i}]"
        missing = {"name", "rules", "learning_rates", *BLOCK_DEFAULTS} - set(b.keys())
        if missing:
            raise ConfigError(f"{source}: missing keys {sorted(missing)}; write phases with phases.block()")
        if not _PHASE_NAME.match(b.name) or b.name == "best" or b.name.endswith("_end"):
            raise ConfigError(
                f"{source}.name={b.name!r}: letters, digits, '_', '.', '-'; not 'best' or ending in '_end' "
                "(checkpoint folders)"
            )
        names.append(b.name)
        _check_block(b, f"{source} ({b.name})")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"config.phases: phase names {repeated} repeat (each names its checkpoints)")


def _check_block(b: ml_collections.ConfigDict, source: str) -> None:
    groups = []
    for j, rule in enumerate(b.rules):
        if len(rule) != 2 or not all(isinstance(part, str) for part in rule):
            raise ConfigError(f"{source}.rules[{j}]={rule!r}: a rule is a (regex, group) pair")
        try:
            re.compile(rule[0])
        except re.error as e:
            raise ConfigError(f"{source}.rules[{j}]: {rule[0]!r} is not a regular expression ({e})") from None
        groups.append(rule[1])
    trained = {g for g in groups if g != FROZEN}
    if not trained:
        raise ConfigError(f"{source}.rules: every group is frozen, so the phase would train nothing")
    without_rate = sorted(trained - set(b.learning_rates.keys()))
    if without_rate:
        raise ConfigError(f"{source}.learning_rates: its rules' groups {without_rate} have no rate")
    unused = sorted(set(b.learning_rates.keys()) - trained)
    if unused:
        raise ConfigError(f"{source}.learning_rates: {unused} name no trained group of its rules")
    if any(lr <= 0 for lr in b.learning_rates.values()):
        raise ConfigError(f"{source}.learning_rates: rates must be positive (freeze a group instead)")
    if b.schedule not in SCHEDULES:
        raise ConfigError(f"{source}.schedule={b.schedule!r}: choose one of {SCHEDULES}")
    if b.num_steps <= 0 and b.num_epochs <= 0:
        raise ConfigError(f"{source}.num_steps and {source}.num_epochs are both 0: the phase would not train")
    if b.feature_cache_dtype not in FEATURE_CACHE_DTYPES:
        raise ConfigError(
            f"{source}.feature_cache_dtype={b.feature_cache_dtype!r}: choose one of {FEATURE_CACHE_DTYPES}"
        )


def expand(
    config: ml_collections.ConfigDict, num_layers: int, *, has_pooler: bool = True
) -> list[tuple[ml_collections.ConfigDict, str]]:
    """The schedule as (phase block, source) pairs: `config.phases`, or the preset `config.strategy` names.
    `has_pooler`: the encoder family has a `backbone/pooler` (models/bert.py FAMILIES)."""
    if config.phases:
        return [(b, f"config.phases[{i}] ({b.name})") for i, b in enumerate(config.phases)]
    return PRESETS[config.strategy](config, num_layers, has_pooler)


def to_phase(b: ml_collections.ConfigDict, steps_per_epoch: int, source: str) -> Phase:
    num_steps = _num_steps(b, steps_per_epoch, source)
    return Phase(
        name=b.name,
        rules=tuple((pattern, group) for pattern, group in b.rules),
        learning_rates=dict(b.learning_rates.items()),
        num_steps=num_steps,
        warmup_steps=b.warmup_steps or int(round(b.warmup_ratio * num_steps)),
        schedule=b.schedule,
        weight_decay=b.weight_decay,
        stop=StopRule(max_train_dev_gap=b.max_train_dev_gap, patience_evals=b.patience_evals or None),
        gap_eval_examples=b.gap_eval_examples if b.max_train_dev_gap is not None else 0,
        gap_metric=b.gap_metric if b.max_train_dev_gap is not None else "",
        backbone_dropout=b.backbone_dropout,
        feature_cache=b.feature_cache,
        feature_cache_dtype=b.feature_cache_dtype,
        feature_cache_dir=b.feature_cache_dir,
        source=source,
    )


def phases_for(
    config: ml_collections.ConfigDict, steps_per_epoch: int, num_layers: int, *, has_pooler: bool = True
) -> list[Phase]:
    check_config(config)
    plan = expand(config, num_layers, has_pooler=has_pooler)
    return [to_phase(b, steps_per_epoch, source) for b, source in plan]


def check_rules(plan: Sequence[Phase], param_names: Sequence[str]) -> None:
    """Each phase's rules against the model's parameter paths, before any phase trains: every rule
    labels some parameter (one that no earlier rule took), every parameter gets a rule, and a phase
    training from a feature cache trains no backbone parameter."""
    for phase in plan:
        compiled = [re.compile(pattern) for pattern, _ in phase.rules]
        labelled = [0] * len(compiled)
        trained_backbone = []
        for name in param_names:
            j = next((j for j, c in enumerate(compiled) if c.fullmatch(name)), None)
            if j is None:
                raise ConfigError(f"{phase.source}.rules: parameter {name!r} matches no rule")
            labelled[j] += 1
            if name.startswith("backbone/") and phase.rules[j][1] != FROZEN:
                trained_backbone.append(name)
        for j, count in enumerate(labelled):
            if not count:
                raise ConfigError(
                    f"{phase.source}.rules[{j}]={phase.rules[j]!r} matches no parameter that an earlier rule "
                    f"did not take (parameters look like {param_names[0]!r})"
                )
        if phase.feature_cache and trained_backbone:
            raise ConfigError(
                f"{phase.source}: feature_cache=True, but its rules train backbone parameters "
                f"(e.g. {trained_backbone[0]!r}); the cache holds a frozen backbone's outputs"
            )


def trains_backbone(phase: Phase, param_names: Sequence[str]) -> bool:
    """Whether `phase` gives any backbone parameter a learning rate (its rules applied to the names)."""
    compiled = [(re.compile(pattern), group) for pattern, group in phase.rules]
    for name in param_names:
        if name.startswith("backbone/"):
            group = next((g for c, g in compiled if c.fullmatch(name)), FROZEN)
            if group != FROZEN:
                return True
    return False


def budget_reason(num_steps: int) -> str:
    """The stop reason (results.json `phases[i].stop_reason`) of a phase that ran its whole budget; any
    other reason is a rule's (StopRule)."""
    return f"step budget of {num_steps} steps"


@dataclasses.dataclass
class StopTracker:
    """Applies a phase's StopRule at each evaluation; its fields are saved with every checkpoint."""

    rule: StopRule
    best_dev_metric: float = -math.inf
    evals_since_best: int = 0

    def update(
        self,
        dev_metric: float,
        *,
        train_score: float | None,
        dev_score: float | None,
        gap_metric: str = "accuracy",
    ) -> str | None:
        """Records one evaluation; returns why the phase must stop now, or None. `train_score` and
        `dev_score`: the task's gap metric (TaskSpec.gap_metric) on the train subset and on dev."""
        if dev_metric > self.best_dev_metric:
            self.best_dev_metric, self.evals_since_best = dev_metric, 0
        else:
            self.evals_since_best += 1
        gap_limit = self.rule.max_train_dev_gap
        if gap_limit is not None and train_score is not None and dev_score is not None:
            gap = train_score - dev_score
            if gap > gap_limit:
                return f"train/dev {gap_metric} gap {gap:.4f} exceeded max_train_dev_gap={gap_limit}"
        patience = self.rule.patience_evals
        if patience is not None and self.evals_since_best >= patience:
            return f"dev metric did not improve for {patience} evaluations"
        return None

    def state_dict(self) -> dict:
        return {"best_dev_metric": self.best_dev_metric, "evals_since_best": self.evals_since_best}

    def load_state_dict(self, state: dict) -> None:
        self.best_dev_metric = float(state["best_dev_metric"])
        self.evals_since_best = int(state["evals_since_best"])
