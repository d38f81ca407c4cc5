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
- `lora`, `bitfit`, `adapters`   one phase (phase2.*) of that adaptation kind (models/adaptation/): its
                       parameters at `phase2.adaptation_learning_rate` and the new head train, the rest
                       of the backbone is frozen.
- `lp_lora`, `lp_bitfit`  `head` (phase1.*, as stack_and_finetune's phase 1), then the kind's phase.

A phase's `adaptation` kind puts the kind's rules (its parameters, in the group `adaptation`) before the
phase's own; any written phase may name one.

A frozen-backbone phase may run its backbone without dropout (`backbone_dropout=False`); it can then
train the head from backbone features computed once (`feature_cache`, see feature_cache.py).
"""

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections
from ml_collections.config_dict import placeholder

from stackft_jax.models import adaptation as adaptation_kinds
from stackft_jax.runtime.cli_errors import ConfigError

SCHEDULES = ("constant", "warmup_linear", "slanted_triangular")
FEATURE_CACHE_DTYPES = ("float32", "bfloat16")
_PHASE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

FROZEN = "frozen"  # the group of a rule whose parameters a phase does not train (optim.py zeroes them)
ADAPTATION = "adaptation"  # the group of an adaptation kind's parameters (Phase.adaptation)


def rule_of(rules: Sequence[tuple[str, str]], name: str) -> int | None:
    """The index of the first rule whose regex fully matches the parameter path `name`; None if none
    does. The one rule matcher: optim.py's labels, check_rules and `EncoderShape.trained_by` read it."""
    return next((j for j, (pattern, _) in enumerate(rules) if re.fullmatch(pattern, name)), None)


def group_of(rules: Sequence[tuple[str, str]], name: str) -> str | None:
    """The group `name`'s rule gives it (None: no rule matches)."""
    j = rule_of(rules, name)
    return None if j is None else rules[j][1]


@dataclasses.dataclass(frozen=True)
class StopRule:
    """A phase stops at the first of: its step budget; the phase's gap metric (`Phase.gap_metric`: the
    task's primary metric unless set, e.g. accuracy, STS-B's pearson, NER's entity F1) on train exceeding
    dev by more than `max_train_dev_gap` (Wang et al.: hand phase 2 a head that has not yet overfitted);
    the dev metric not improving for `patience_evals` evaluations. None disables a rule."""

    max_train_dev_gap: float | None = None
    patience_evals: int | None = None


def _key(default: Any, doc: str) -> Any:
    """A phase key: its default and its comment (`--show_config` prints it), written once, here."""
    return dataclasses.field(default=default, metadata={"doc": doc})


# Phase keys that are counts or amounts: 0 turns them off, a negative value is an error.
NON_NEGATIVE_KEYS = (
    "num_steps",
    "num_epochs",
    "warmup_steps",
    "weight_decay",
    "gap_eval_examples",
    "patience_evals",
)


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase of a schedule, and the one place its keys, defaults and comments are written: a written
    phase block (`block`) has exactly these keys, the presets build phases of this type, and every
    consumer (training, binding, compute, reports, predict, export) reads the run spec's list of them.
    Constructing one checks it (ConfigError naming `source`)."""

    name: str = dataclasses.field(
        metadata={"doc": "names its checkpoints (checkpoints/<name>_end), logs and results"}
    )
    rules: tuple[tuple[str, str], ...] = dataclasses.field(
        metadata={
            "doc": "(regex, group) over parameter paths; first match wins; group 'frozen' does not train"
        }
    )
    learning_rates: Mapping[str, float] = dataclasses.field(
        metadata={"doc": "peak learning rate per trained group of `rules` (the group `frozen` has none)"}
    )
    num_steps: int = _key(0, "step budget; 0: use num_epochs")
    num_epochs: float = _key(1.0, "budget in epochs when num_steps is 0")
    warmup_steps: int = _key(0, "linear warm-up steps; 0: use warmup_ratio")
    warmup_ratio: float = _key(0.0, "warm-up as a fraction of the budget")
    schedule: str = _key("constant", "constant | warmup_linear | slanted_triangular")
    weight_decay: float = _key(0.01, "AdamW decay on kernels and embeddings (never biases, LayerNorm)")
    max_train_dev_gap: float | None = _key(
        None, "stop once the gap metric on train exceeds dev's by this much; None: off"
    )
    gap_eval_examples: int = _key(0, "train examples scored (eval mode) to measure that gap")
    gap_metric: str = _key(
        "",
        "the metric of that gap; '': the task's primary one (accuracy; entity F1 on NER; pearson on STS-B)",
    )
    patience_evals: int = _key(0, "stop after this many evals without dev improvement; 0: off")
    backbone_dropout: bool = _key(True, "the backbone runs in training mode (with dropout)")
    feature_cache: bool = _key(
        False, "train the head on backbone features computed once (needs a frozen backbone without dropout)"
    )
    feature_cache_dtype: str = _key("float32", "float32 | bfloat16 (half the disk and page cache)")
    adaptation: str = _key(
        "",
        "'' | bitfit | lora | adapters (stackft_jax/models/adaptation/): the kind's parameters train in the "
        "group 'adaptation' (rules put before the phase's own; config.adaptation.<kind> holds its options)",
    )
    source: str = ""  # the config keys it was written from, for messages ("config.phases[1] (head)")

    def __post_init__(self):
        where = self.source or f"phase {self.name}"
        if self.adaptation:
            adaptation_kind(self.adaptation, where)
        object.__setattr__(self, "rules", tuple((str(p), str(g)) for p, g in self.rules))
        object.__setattr__(
            self, "learning_rates", {g: float(lr) for g, lr in dict(self.learning_rates).items()}
        )
        for j, rule in enumerate(self.rules):
            try:
                re.compile(rule[0])
            except re.error as e:
                raise ConfigError(
                    f"{where}.rules[{j}]: {rule[0]!r} is not a regular expression ({e})"
                ) from None
        trained = {group for _, group in self.rules if group != FROZEN}
        if not trained:
            raise ConfigError(f"{where}.rules: every group is frozen, so the phase would train nothing")
        without_rate = sorted(trained - set(self.learning_rates))
        if without_rate:
            raise ConfigError(f"{where}.learning_rates: its rules' groups {without_rate} have no rate")
        unused = sorted(set(self.learning_rates) - trained)
        if unused:
            raise ConfigError(f"{where}.learning_rates: {unused} name no trained group of its rules")
        if any(lr <= 0 for lr in self.learning_rates.values()):
            raise ConfigError(f"{where}.learning_rates: rates must be positive (freeze a group instead)")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"{where}.schedule={self.schedule!r}: choose one of {SCHEDULES}")
        # A negative budget or count would pass the checks below and silently train nothing (or stop
        # nothing): `budgeted` keeps a nonzero num_steps as it is.
        for key in NON_NEGATIVE_KEYS:
            if getattr(self, key) < 0:
                raise ConfigError(f"{where}.{key}={getattr(self, key)}: must be 0 or more")
        if not 0 <= self.warmup_ratio < 1:
            raise ConfigError(
                f"{where}.warmup_ratio={self.warmup_ratio}: a fraction of the budget, in [0, 1)"
            )
        if self.num_steps <= 0 and self.num_epochs <= 0:
            raise ConfigError(
                f"{where}.num_steps and {where}.num_epochs are both 0: the phase would not train"
            )
        if self.feature_cache_dtype not in FEATURE_CACHE_DTYPES:
            raise ConfigError(
                f"{where}.feature_cache_dtype={self.feature_cache_dtype!r}: choose one of "
                f"{FEATURE_CACHE_DTYPES}"
            )
        if self.feature_cache and self.backbone_dropout:
            raise ConfigError(
                f"{where}.feature_cache=True needs {where}.backbone_dropout=False: the cache holds the "
                "frozen backbone's outputs without dropout, and with dropout they change every step"
            )
        if self.max_train_dev_gap is None:  # the gap rule's own keys are not read without it
            object.__setattr__(self, "gap_eval_examples", 0)
            object.__setattr__(self, "gap_metric", "")

    @property
    def stop(self) -> StopRule:
        return StopRule(max_train_dev_gap=self.max_train_dev_gap, patience_evals=self.patience_evals or None)

    def budgeted(self, steps_per_epoch: int) -> "Phase":
        """This phase with its budget in steps: `num_steps`, else `num_epochs` of `steps_per_epoch`; its
        warm-up likewise (`warmup_steps`, else `warmup_ratio` of the budget)."""
        steps = self.num_steps or max(1, math.ceil(self.num_epochs * steps_per_epoch))
        warmup = self.warmup_steps or int(round(self.warmup_ratio * steps))
        return dataclasses.replace(self, num_steps=steps, warmup_steps=warmup)

    def as_block(self) -> dict[str, Any]:
        """The phase as a plain block (config.json's form of a written phase)."""
        return {key: getattr(self, key) for key in BLOCK_KEYS} | {
            "rules": [list(rule) for rule in self.rules],
            "learning_rates": dict(self.learning_rates),
        }

    @classmethod
    def from_block(cls, block: Mapping[str, Any], source: str, options: Mapping[str, Any]) -> "Phase":
        """A written phase block (`block`, or its JSON form) as a phase, its keys checked; with an
        `adaptation` kind, the kind's rules (its `options`: config.adaptation) go before the block's."""
        keys = set(block.keys())
        unknown = sorted(keys - set(BLOCK_KEYS))
        if unknown:
            raise ConfigError(f"{source}: unknown keys {unknown}; a phase has {sorted(BLOCK_KEYS)}")
        missing = sorted({"name", "rules", "learning_rates"} - keys)
        if missing:
            raise ConfigError(f"{source}: missing keys {missing}; write phases with phases.block()")
        for j, rule in enumerate(block["rules"]):
            if len(rule) != 2 or not all(isinstance(part, str) for part in rule):
                raise ConfigError(f"{source}.rules[{j}]={rule!r}: a rule is a (regex, group) pair")
        values = {key: block[key] for key in BLOCK_KEYS if key in keys}
        if values.get("adaptation"):
            values["rules"] = (*adaptation_rules(values["adaptation"], options, source), *values["rules"])
        return cls(**values, source=source)


def adaptation_kind(kind: str, source: str) -> adaptation_kinds.AdaptationKind:
    """The registered kind `kind`, or a ConfigError naming `source`'s key."""
    if kind not in adaptation_kinds.KINDS:
        raise ConfigError(
            f"{source}.adaptation={kind!r}: choose '' or one of {sorted(adaptation_kinds.KINDS)}"
        )
    return adaptation_kinds.KINDS[kind]


def adaptation_rules(kind: str, options: Mapping[str, Any], source: str) -> tuple[tuple[str, str], ...]:
    """The rules that train an adaptation kind's parameters in the group `adaptation`."""
    patterns = adaptation_kind(kind, source).trained_patterns(options.get(kind) or {})
    return tuple((pattern, ADAPTATION) for pattern in patterns)


# Every key of a phase block with its default ("name", "rules", "learning_rates" have none) and comment.
BLOCK_KEYS: dict[str, dataclasses.Field] = {
    f.name: f for f in dataclasses.fields(Phase) if "doc" in f.metadata
}
OPTION_KEYS = tuple(key for key, f in BLOCK_KEYS.items() if f.default is not dataclasses.MISSING)
BLOCK_DEFAULTS = {key: BLOCK_KEYS[key].default for key in OPTION_KEYS}


def block(
    name: str,
    *,
    rules: Sequence[tuple[str, str]],
    learning_rates: dict[str, float],
    **options,
) -> ml_collections.ConfigDict:
    """One phase for `config.phases`, e.g.
    `block("head", rules=[("backbone/.*", "frozen"), ("head/.*", "head")], learning_rates={"head": 1e-3},
    num_steps=100)`; `options` are the keys of `Phase` (BLOCK_DEFAULTS)."""
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        moved = (
            " (feature_cache_dir is a run option now: config.feature_cache_dir)"
            if "feature_cache_dir" in unknown
            else ""
        )
        raise ConfigError(f"phase {name!r}: unknown keys {unknown}; a phase has {sorted(OPTION_KEYS)}{moved}")
    c = ml_collections.ConfigDict(
        {
            "name": name,
            "rules": [tuple(rule) for rule in rules],
            "learning_rates": ml_collections.ConfigDict({g: float(lr) for g, lr in learning_rates.items()}),
        }
    )
    for key in OPTION_KEYS:  # a placeholder is a shared reference, so each block makes its own
        default = BLOCK_DEFAULTS[key]
        c[key] = placeholder(float) if default is None else default
    for key, value in options.items():
        c[key] = float(value) if isinstance(BLOCK_DEFAULTS[key], float) and value is not None else value
    return c


@dataclasses.dataclass(frozen=True)
class AliasBlock:
    """One of the blocks `phase1.*`, `phase2.*`, `unfreezing.*` that the presets read: its own keys
    (rates, decays) with defaults and comments, and the `Phase` keys it carries into the phases it
    feeds, with the defaults that differ from Phase's (the comments are Phase's)."""

    doc: str
    own: Mapping[str, tuple[Any, str]]
    phase_keys: tuple[str, ...]
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def config(self) -> ml_collections.ConfigDict:
        c = ml_collections.ConfigDict({key: default for key, (default, _) in self.own.items()})
        for key in self.phase_keys:
            c[key] = self.defaults.get(key, BLOCK_DEFAULTS[key])
        return c

    def comments(self) -> dict[str, str]:
        return {key: doc for key, (_, doc) in self.own.items()} | {
            key: BLOCK_KEYS[key].metadata["doc"] for key in self.phase_keys
        }

    def phase_options(self, values: ml_collections.ConfigDict) -> dict[str, Any]:
        """Its Phase keys' values, for a phase it feeds."""
        return {key: values[key] for key in self.phase_keys}


_BUDGET = ("num_steps", "num_epochs", "warmup_steps", "warmup_ratio", "schedule", "weight_decay")
# The inputs of the presets (config/defaults.py builds `config.phase1` etc. from these). With
# `config.phases` written they do not apply, and spec.resolve refuses a changed one.
ALIASES: dict[str, AliasBlock] = {
    "phase1": AliasBlock(
        doc="the frozen-backbone phase (stack_only, and stack-and-finetune's first)",
        own={"learning_rate": (1e-3, "peak learning rate of the head")},
        phase_keys=(
            *_BUDGET,
            "max_train_dev_gap",
            "gap_eval_examples",
            "gap_metric",
            "patience_evals",
            "backbone_dropout",
            "feature_cache",
            "feature_cache_dtype",
        ),
        defaults={"max_train_dev_gap": 0.02, "gap_eval_examples": 2000},
    ),
    "phase2": AliasBlock(
        doc="the all-parameters phase (finetune_only, and stack-and-finetune's second)",
        own={
            "backbone_learning_rate": (2e-5, "peak learning rate of BERT"),
            "head_learning_rate": (
                0.0,
                "0: new_head_learning_rate for a head that starts the phase untrained (finetune_only), "
                "BERT's rate for one an earlier phase trained (stack-and-finetune's phase 2); > 0: this "
                "rate for the head always",
            ),
            "new_head_learning_rate": (1e-3, "a new head's rate (docs/finetune_collapse.md)"),
            "layerwise_lr_decay": (1.0, "< 1: discriminative learning rates per BERT layer"),
            "adaptation_learning_rate": (
                5e-4,
                "peak rate of an adaptation kind's parameters (lora, lp_lora, bitfit, lp_bitfit, adapters; "
                "the LoRA paper's RoBERTa-base GLUE runs: 4e-4 to 5e-4)",
            ),
        },
        phase_keys=(*_BUDGET, "patience_evals"),
        defaults={"num_epochs": 3.0, "warmup_ratio": 0.1, "schedule": "warmup_linear"},
    ),
    "unfreezing": AliasBlock(
        doc="gradual_unfreezing: the phases between the head's and the last (which is phase2.*)",
        own={
            "layers_per_phase": (1, "layer groups unfrozen per phase, top down (pooler with the top)"),
            "layerwise_lr_decay": (
                0.95,
                "layer i of L trains at decay**(L - i) of phase2.backbone_learning_rate (Sun et al. 2019)",
            ),
        },
        phase_keys=("num_steps", "num_epochs"),
        defaults={},
    ),
}


def clear_aliases(config: ml_collections.ConfigDict) -> None:
    """Resets the alias blocks to their defaults: a config file that writes `config.phases` on top of a
    base that set `phase1.*`/`phase2.*` keys (configs/tiny.py's three_phases)."""
    for alias, declared in ALIASES.items():
        for key, value in declared.config().items():
            config[alias][key] = value


@dataclasses.dataclass(frozen=True)
class EncoderShape:
    """What the presets and checks need of the encoder, read from its config (spec.resolve): its depth,
    whether its family has a pooler, and its parameter paths (`backbone/...`)."""

    num_layers: int
    has_pooler: bool
    parameters: tuple[str, ...]

    def trained_by(self, phase: Phase) -> list[str]:
        """The backbone parameters `phase`'s rules give a learning rate."""
        return [name for name in self.parameters if group_of(phase.rules, name) not in (FROZEN, None)]

    def trains(self, phase: Phase) -> bool:
        """Whether `phase` trains any backbone parameter (so backpropagates through the backbone): the one
        answer that training, compute and reports read."""
        return bool(self.trained_by(phase))


def _frozen_backbone_phase(name: str, aliases: ml_collections.ConfigDict, *, guard: bool) -> Phase:
    """phase1.* as a phase: the head alone. `guard` keeps the overfitting rule (a phase that a
    fine-tuning phase follows); without it the head trains its full budget (or until dev stalls)."""
    p1 = aliases.phase1
    options = ALIASES["phase1"].phase_options(p1)
    if not guard:
        options["max_train_dev_gap"] = None
    return Phase(
        name,
        rules=(("backbone/.*", FROZEN), ("head/.*", "head")),
        learning_rates={"head": p1.learning_rate},
        source="config.phase1",
        **options,
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


def _everything_phase(
    name: str, aliases: ml_collections.ConfigDict, shape: EncoderShape, *, head_rate: float
) -> Phase:
    """phase2.* as a phase: the backbone (per-layer groups when layerwise_lr_decay < 1) and the head."""
    p2 = aliases.phase2
    decay = p2.layerwise_lr_decay
    return Phase(
        name,
        rules=(*backbone_rules(shape.num_layers, decay, shape.has_pooler), ("head/.*", "head")),
        learning_rates={
            **backbone_learning_rates(p2.backbone_learning_rate, shape.num_layers, decay, shape.has_pooler),
            "head": head_rate,
        },
        source="config.phase2",
        **ALIASES["phase2"].phase_options(p2),
    )


def _finetune_only(aliases, shape):
    return [_everything_phase("finetune", aliases, shape, head_rate=head_rate(aliases, head_is_new=True))]


def _finetune_only_uniform(aliases, shape):
    rate = aliases.phase2.head_learning_rate or aliases.phase2.backbone_learning_rate
    return [_everything_phase("finetune", aliases, shape, head_rate=rate)]


def _stack_only(aliases, shape):
    # No fine-tuning phase follows, so there is nothing to guard the head for: it trains its full
    # budget (or until dev stops improving) and the best-on-dev checkpoint is kept.
    return [_frozen_backbone_phase("stack", aliases, guard=False)]


def _stack_and_finetune(aliases, shape):
    return [
        _frozen_backbone_phase("phase1", aliases, guard=True),
        _everything_phase("phase2", aliases, shape, head_rate=head_rate(aliases, head_is_new=False)),
    ]


def _gradual_unfreezing(aliases, shape):
    """ULMFiT's schedule on BERT: the head first, then `layers_per_phase` more layer groups per phase,
    top down; layer i of L trains at decay**(L - i) of phase2's rate (the pooler at the full rate, the
    embeddings one step below layer 0), each group at the same rate in every phase it trains in."""
    u, p2, num_layers = aliases.unfreezing, aliases.phase2, shape.num_layers
    units = _layer_units(num_layers, shape.has_pooler)
    rates = {
        "backbone": p2.backbone_learning_rate,
        **{
            f"backbone_layer{i}": p2.backbone_learning_rate * u.layerwise_lr_decay ** (num_layers - i)
            for i in range(num_layers)
        },
        "backbone_embeddings": p2.backbone_learning_rate * u.layerwise_lr_decay ** (num_layers + 1),
    }
    head_lr = head_rate(aliases, head_is_new=False)  # the first phase trained it
    plan = [_frozen_backbone_phase("head", aliases, guard=True)]
    for end in range(u.layers_per_phase, len(units) + u.layers_per_phase, u.layers_per_phase):
        unfrozen = [rule for unit in units[:end] for rule in unit]
        last = end >= len(units)
        lowest = unfrozen[-1][1].removeprefix("backbone_")
        groups = {group for _, group in unfrozen}
        if last:
            options, source = ALIASES["phase2"].phase_options(p2), "config.phase2"
        else:
            options = ALIASES["unfreezing"].phase_options(u) | {"weight_decay": p2.weight_decay}
            source = "config.unfreezing"
        plan.append(
            Phase(
                f"unfreeze_{lowest}",
                rules=(*unfrozen, *([] if last else [("backbone/.*", FROZEN)]), ("head/.*", "head")),
                learning_rates={**{g: rates[g] for g in rates if g in groups}, "head": head_lr},
                source=source,
                **options,
            )
        )
    return plan


def _lp_ft(aliases, shape):
    return [
        _frozen_backbone_phase("linear_probe", aliases, guard=False),
        _everything_phase("finetune", aliases, shape, head_rate=head_rate(aliases, head_is_new=False)),
    ]


def _adapted_phase(name: str, kind: str, aliases, shape: EncoderShape, *, head_rate: float) -> Phase:
    """phase2.* as a phase of an adaptation kind: its parameters and the head train, the rest is frozen."""
    p2 = aliases.phase2
    return Phase(
        name,
        rules=(
            *adaptation_rules(kind, aliases.adaptation, "config.phase2"),
            ("backbone/.*", FROZEN),
            ("head/.*", "head"),
        ),
        learning_rates={ADAPTATION: p2.adaptation_learning_rate, "head": head_rate},
        adaptation=kind,
        source="config.phase2",
        **ALIASES["phase2"].phase_options(p2),
    )


def _adapted(kind: str) -> Callable:
    def preset(aliases, shape):
        return [_adapted_phase(kind, kind, aliases, shape, head_rate=head_rate(aliases, head_is_new=True))]

    preset.__doc__ = f"{kind} alone: its parameters and the new head train from step 0."
    return preset


def _head_then(kind: str) -> Callable:
    def preset(aliases, shape):
        return [
            _frozen_backbone_phase("head", aliases, guard=True),
            _adapted_phase(kind, kind, aliases, shape, head_rate=head_rate(aliases, head_is_new=False)),
        ]

    preset.__doc__ = f"stack-and-finetune's head phase (phase1.*), then {kind} (phase2.*): LP-FT's order."
    return preset


# name -> (the alias blocks it reads, the encoder's shape) -> its phases
PRESETS: dict[str, Callable[[ml_collections.ConfigDict, EncoderShape], list[Phase]]] = {
    "finetune_only": _finetune_only,
    "finetune_only_uniform": _finetune_only_uniform,
    "stack_only": _stack_only,
    "stack_and_finetune": _stack_and_finetune,
    "gradual_unfreezing": _gradual_unfreezing,
    "lp_ft": _lp_ft,
    "lora": _adapted("lora"),
    "lp_lora": _head_then("lora"),
    "bitfit": _adapted("bitfit"),
    "lp_bitfit": _head_then("bitfit"),
    "adapters": _adapted("adapters"),
}
STRATEGIES = tuple(PRESETS)
# The adaptation kind each preset's phases use (the encoder builds its parameters from the start).
PRESET_KINDS = {
    "lora": "lora",
    "lp_lora": "lora",
    "bitfit": "bitfit",
    "lp_bitfit": "bitfit",
    "adapters": "adapters",
}


def adaptation_kinds_of(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The adaptation kinds a config's schedule uses: its preset's, or its written phases'."""
    if config.phases:
        kinds = {}
        for i, b in enumerate(config.phases):
            kind = b.get("adaptation")
            if kind:
                adaptation_kind(kind, f"config.phases[{i}] ({b.get('name')})")
            kinds[kind] = None
        return tuple(kind for kind in kinds if kind)
    kind = PRESET_KINDS.get(config.strategy)
    return (kind,) if kind else ()


def expand(config: ml_collections.ConfigDict, shape: EncoderShape) -> tuple[Phase, ...]:
    """The schedule as phases, checked: `config.phases`, or the preset `config.strategy` names, built for
    the encoder's real shape (its depth, its pooler, its parameters)."""
    if config.unfreezing.layers_per_phase < 1:  # checked whether gradual_unfreezing reads it or not
        raise ConfigError("config.unfreezing.layers_per_phase must be at least 1")
    if not config.phases:
        if config.strategy not in PRESETS:
            raise ConfigError(
                f"config.strategy={config.strategy!r}: choose one of {STRATEGIES}, or write config.phases"
            )
        plan = PRESETS[config.strategy](config, shape)
    else:
        if config.strategy in PRESETS:
            raise ConfigError(
                f"config.phases is written, and config.strategy={config.strategy!r} names a preset: give "
                "the schedule its own name (config.strategy labels it in results and reports)"
            )
        plan = [_written_phase(b, i, config.adaptation) for i, b in enumerate(config.phases)]
        names = [phase.name for phase in plan]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ConfigError(f"config.phases: phase names {repeated} repeat (each names its checkpoints)")
    for phase in plan:
        trained = shape.trained_by(phase)
        if phase.feature_cache and trained:
            raise ConfigError(
                f"{phase.source}: feature_cache=True, but its rules train backbone parameters "
                f"(e.g. {trained[0]!r}); the cache holds a frozen backbone's outputs"
            )
    return tuple(plan)


def _written_phase(b: ml_collections.ConfigDict, index: int, options: Mapping[str, Any]) -> Phase:
    source = f"config.phases[{index}]"
    name = b.get("name")
    if not isinstance(name, str) or not _PHASE_NAME.match(name) or name == "best" or name.endswith("_end"):
        raise ConfigError(
            f"{source}.name={name!r}: letters, digits, '_', '.', '-'; not 'best' or ending in '_end' "
            "(checkpoint folders)"
        )
    return Phase.from_block(b, f"{source} ({name})", options)


def check_rules(plan: Sequence[Phase], param_names: Sequence[str]) -> None:
    """Each phase's rules against the model's parameter paths, before any phase trains: every rule
    labels some parameter (one that no earlier rule took), and every parameter gets a rule."""
    for phase in plan:
        labelled = dict.fromkeys(range(len(phase.rules)), 0)
        for name in param_names:
            j = rule_of(phase.rules, name)
            if j is None:
                raise ConfigError(f"{phase.source}.rules: parameter {name!r} matches no rule")
            labelled[j] += 1
        for j, count in labelled.items():
            if not count:
                raise ConfigError(
                    f"{phase.source}.rules[{j}]={phase.rules[j]!r} matches no parameter that an earlier rule "
                    f"did not take (parameters look like {param_names[0]!r})"
                )


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
