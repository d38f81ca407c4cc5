"""What each strategy means, as data.

A strategy is a list of phases. A phase says which parameter groups train at which peak learning rate
(groups absent from `learning_rates` are frozen), how long it runs and when it stops early.

- `finetune_only`      one phase, `finetune`, configured by `phase2.*`: BERT + head all train from step 0.
- `stack_only`         one phase, `stack`, configured by `phase1.*`: the backbone stays frozen; a learned
                       scalar mix of all layers feeds the head when `model.scalar_mix` is on (Peters et al.).
- `stack_and_finetune` `phase1` (backbone frozen, head lr ~1e-3, stop before the head overfits), then
                       `phase2` (everything, low lr) from the phase-1 parameters with a fresh optimizer.

A frozen-backbone phase may run its backbone without dropout (`phase1.backbone_dropout=False`); it can then
train the head from backbone features computed once (`phase1.feature_cache`, see feature_cache.py).
"""

import dataclasses
import math

import ml_collections

from stackft_jax.optim import FROZEN

STRATEGIES = ("finetune_only", "stack_only", "stack_and_finetune")


@dataclasses.dataclass(frozen=True)
class StopRule:
    """Phase 1 stops at the first of: its step budget; train accuracy exceeding dev accuracy by more
    than `max_train_dev_gap` (Wang et al.: hand phase 2 a head that has not yet overfitted); the dev
    metric not improving for `patience_evals` evaluations. None disables a rule."""

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
    backbone_dropout: bool = True  # False: the backbone runs deterministically, the head keeps dropout
    feature_cache: bool = False  # train from stored backbone features (frozen, dropout-free backbone)
    feature_cache_dtype: str = "float32"
    feature_cache_dir: str = ""  # shared by runs, one folder per fingerprint; "" or "none": the workdir

    def __post_init__(self):
        if self.feature_cache and (self.backbone_dropout or self.trains_backbone):
            raise ValueError(
                f"phase {self.name}: a feature cache needs a frozen backbone that runs without dropout"
            )

    @property
    def trains_backbone(self) -> bool:
        return any(
            group != FROZEN and pattern.startswith("backbone") for pattern, group in self.rules
        )


def _num_steps(block: ml_collections.ConfigDict, steps_per_epoch: int, key: str) -> int:
    if block.num_steps > 0:
        return int(block.num_steps)
    if block.num_epochs > 0:
        return max(1, math.ceil(block.num_epochs * steps_per_epoch))
    raise ValueError(f"{key}.num_steps and {key}.num_epochs are both 0: the phase would not train")


def _warmup_steps(block: ml_collections.ConfigDict, num_steps: int) -> int:
    return block.warmup_steps or int(round(block.warmup_ratio * num_steps))


def backbone_rules(num_layers: int, layerwise_lr_decay: float) -> tuple[tuple[str, str], ...]:
    """Discriminative learning rates (Howard & Ruder; Peters et al.): with decay < 1, layer i of L gets
    its own group whose lr is scaled by decay**(L - i); embeddings sit below layer 0, the pooler on top."""
    if layerwise_lr_decay == 1.0:
        return (("backbone/.*", "backbone"),)
    rules = [(rf"backbone/layers/{i}/.*", f"backbone_layer{i}") for i in range(num_layers)]
    rules += [("backbone/embeddings/.*", "backbone_embeddings"), ("backbone/.*", "backbone")]
    return tuple(rules)


def backbone_learning_rates(
    peak: float, num_layers: int, layerwise_lr_decay: float
) -> dict[str, float]:
    if layerwise_lr_decay == 1.0:
        return {"backbone": peak}
    rates = {
        f"backbone_layer{i}": peak * layerwise_lr_decay ** (num_layers - i)
        for i in range(num_layers)
    }
    rates["backbone_embeddings"] = peak * layerwise_lr_decay ** (num_layers + 1)
    rates["backbone"] = peak
    return rates


def frozen_backbone_phase(
    name: str, block: ml_collections.ConfigDict, steps_per_epoch: int, *, guard_overfitting: bool
) -> Phase:
    num_steps = _num_steps(block, steps_per_epoch, "phase1")
    return Phase(
        name=name,
        rules=(("backbone/.*", FROZEN), ("head/.*", "head")),
        learning_rates={"head": block.learning_rate},
        num_steps=num_steps,
        warmup_steps=_warmup_steps(block, num_steps),
        schedule=block.schedule,
        weight_decay=block.weight_decay,
        stop=StopRule(
            max_train_dev_gap=block.max_train_dev_gap if guard_overfitting else None,
            patience_evals=block.patience_evals or None,
        ),
        gap_eval_examples=block.gap_eval_examples if guard_overfitting else 0,
        backbone_dropout=block.backbone_dropout,
        feature_cache=block.feature_cache,
        feature_cache_dtype=block.feature_cache_dtype,
        feature_cache_dir=block.feature_cache_dir,
    )


def full_phase(
    name: str, block: ml_collections.ConfigDict, steps_per_epoch: int, num_layers: int
) -> Phase:
    num_steps = _num_steps(block, steps_per_epoch, "phase2")
    head_lr = block.head_learning_rate or block.backbone_learning_rate
    return Phase(
        name=name,
        rules=backbone_rules(num_layers, block.layerwise_lr_decay) + (("head/.*", "head"),),
        learning_rates={
            **backbone_learning_rates(
                block.backbone_learning_rate, num_layers, block.layerwise_lr_decay
            ),
            "head": head_lr,
        },
        num_steps=num_steps,
        warmup_steps=_warmup_steps(block, num_steps),
        schedule=block.schedule,
        weight_decay=block.weight_decay,
        stop=StopRule(patience_evals=block.patience_evals or None),
    )


def phases_for(
    config: ml_collections.ConfigDict, steps_per_epoch: int, num_layers: int
) -> list[Phase]:
    strategy = config.strategy
    if strategy == "finetune_only":
        return [full_phase("finetune", config.phase2, steps_per_epoch, num_layers)]
    if strategy == "stack_only":
        # No phase 2 follows, so there is nothing to guard the head for: it trains its full budget
        # (or until dev stops improving) and the best-on-dev checkpoint is kept.
        return [
            frozen_backbone_phase("stack", config.phase1, steps_per_epoch, guard_overfitting=False)
        ]
    if strategy == "stack_and_finetune":
        return [
            frozen_backbone_phase("phase1", config.phase1, steps_per_epoch, guard_overfitting=True),
            full_phase("phase2", config.phase2, steps_per_epoch, num_layers),
        ]
    raise ValueError(f"config.strategy={strategy!r}: choose one of {STRATEGIES}")


@dataclasses.dataclass
class StopTracker:
    """Applies a phase's StopRule at each evaluation; its fields are saved with every checkpoint."""

    rule: StopRule
    best_dev_metric: float = -math.inf
    evals_since_best: int = 0

    def update(
        self, dev_metric: float, *, train_accuracy: float | None, dev_accuracy: float | None
    ) -> str | None:
        """Records one evaluation; returns why the phase must stop now, or None."""
        if dev_metric > self.best_dev_metric:
            self.best_dev_metric, self.evals_since_best = dev_metric, 0
        else:
            self.evals_since_best += 1
        gap_limit = self.rule.max_train_dev_gap
        if gap_limit is not None and train_accuracy is not None and dev_accuracy is not None:
            gap = train_accuracy - dev_accuracy
            if gap > gap_limit:
                return f"train/dev accuracy gap {gap:.4f} exceeded max_train_dev_gap={gap_limit}"
        patience = self.rule.patience_evals
        if patience is not None and self.evals_since_best >= patience:
            return f"dev metric did not improve for {patience} evaluations"
        return None

    def state_dict(self) -> dict:
        return {"best_dev_metric": self.best_dev_metric, "evals_since_best": self.evals_since_best}

    def load_state_dict(self, state: dict) -> None:
        self.best_dev_metric = float(state["best_dev_metric"])
        self.evals_since_best = int(state["evals_since_best"])
