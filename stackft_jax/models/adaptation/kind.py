"""What an adaptation kind is, and what the encoder (models/bert.py) is told to build for one.

A kind (`AdaptationKind`, one per file beside this one) says which backbone parameters a phase of it
trains (regexes over the task model's '/'-joined parameter paths, fullmatched) and what extra parameters
the encoder needs (`EncoderAdaptation`). The encoder's settings live here rather than in each kind's file
so that the kinds' modules (lora.py, adapters.py) and bert.py can all import them without a cycle.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import jax
from flax import nnx

from stackft_jax.runtime.cli_errors import ConfigError

# The six projections of a layer by the names LoRA's `targets` regex is fullmatched against, and their
# paths inside `layers/{i}/` (the attention output and the feed-forward output are both "output" there).
PROJECTIONS: dict[str, tuple[str, ...]] = {
    "query": ("attention", "query"),
    "key": ("attention", "key"),
    "value": ("attention", "value"),
    "attention_output": ("attention", "output"),
    "intermediate": ("intermediate",),
    "output": ("output",),
}
ADAPTER_ACTIVATIONS = ("gelu", "relu")
# Folded into the `params` stream's key when the caller's Rngs has no `adaptation` stream (a fixed,
# arbitrary number: any other value gives other, equally valid, initial adaptation parameters).
_ADAPTATION_SALT = 0x5EED_ADA9


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """Low-rank updates W + (alpha / rank) * A @ B on the projections whose name `targets` fullmatches."""

    rank: int
    alpha: float
    dropout: float
    targets: str

    def __post_init__(self):
        if not isinstance(self.rank, int) or self.rank < 1:
            raise ConfigError(f"adaptation.lora.rank={self.rank!r}: a positive integer")
        # alpha 0 scales every update to zero (lora_b's gradient is zero too: nothing trains); a negative
        # alpha is the same model as a positive one with A's sign flipped, never what was meant.
        if not self.alpha > 0:
            raise ConfigError(f"adaptation.lora.alpha={self.alpha!r}: a positive number (the update's scale)")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"adaptation.lora.dropout={self.dropout!r}: in [0, 1)")
        try:
            pattern = re.compile(self.targets)
        except re.error as e:
            raise ConfigError(f"adaptation.lora.targets={self.targets!r}: not a regex ({e})") from None
        if not any(pattern.fullmatch(name) for name in PROJECTIONS):
            raise ConfigError(
                f"adaptation.lora.targets={self.targets!r} fullmatches none of the projections "
                f"{', '.join(PROJECTIONS)}"
            )
        # `query|vlaue` fullmatches query: the typo would drop the value projection without a word.
        for alternative, alone in _alternatives(self.targets):
            if not any(re.fullmatch(alone, name) for name in PROJECTIONS):
                raise ConfigError(
                    f"adaptation.lora.targets={self.targets!r}: its alternative {alternative!r} fullmatches "
                    f"none of the projections {', '.join(PROJECTIONS)}"
                )

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def projections(self) -> tuple[str, ...]:
        """The targeted projections' names, in `PROJECTIONS` order."""
        return tuple(name for name in PROJECTIONS if re.fullmatch(self.targets, name))


def _alternatives(pattern: str) -> list[tuple[str, str]]:
    """(alternative, `pattern` with that alternative alone in its place) for every `|` alternative of
    `pattern`, at the top level and inside groups; an enclosing group keeps only its alternative that holds
    it (`(query|key)|value`: `query` alone is `(query)`). A character class's `|` is a character."""
    # Per group: [content start, content end, positions of its `|`, the enclosing group's index].
    groups: list[list] = [[0, len(pattern), [], None]]
    open_groups, i, in_class = [0], 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            i += 2 if pattern[i + 1 : i + 2] == "^" else 1
            i += pattern[i : i + 1] == "]"  # `[]...]`, `[^]...]`: a literal ] first
            continue
        elif char == "(":
            prefix = re.match(r"\?(:|P<\w+>|[=!]|<[=!]|[aiLmsux-]+:)", pattern[i + 1 :])
            groups.append([i + 1 + (prefix.end() if prefix else 0), None, [], open_groups[-1]])
            open_groups.append(len(groups) - 1)
        elif char == ")" and len(open_groups) > 1:
            groups[open_groups.pop()][1] = i
        elif char == "|":
            groups[open_groups[-1]][2].append(i)
        i += 1
    found = []
    for start, end, bars, parent in groups:
        if end is None:  # unbalanced: re.compile has refused it already
            continue
        bounds = [start - 1, *bars, end]
        for left, right in zip(bounds, bounds[1:], strict=False) if bars else ():
            alternative = text = pattern[left + 1 : right]
            inner, up = (start, end), parent
            while up is not None:  # each enclosing group: only its alternative that holds this one
                outer_start, outer_end, outer_bars, up_next = groups[up]
                edges = [outer_start - 1, *outer_bars, outer_end]
                seg_left = max(e for e in edges if e < inner[0])
                seg_right = min(e for e in edges if e >= inner[1])
                text = pattern[seg_left + 1 : inner[0]] + text + pattern[inner[1] : seg_right]
                inner, up = (outer_start, outer_end), up_next
            found.append((alternative, text))
    return found


def projection_shape(name: str, hidden: int, intermediate: int) -> tuple[int, int]:
    """(in, out) of the projection `name` (a `PROJECTIONS` key) in a layer of that width."""
    shapes = {"intermediate": (hidden, intermediate), "output": (intermediate, hidden)}
    return shapes.get(name, (hidden, hidden))


@dataclasses.dataclass(frozen=True)
class AdapterSettings:
    """Houlsby bottleneck adapters x + up(act(down(x))) after each layer's attention and feed-forward."""

    bottleneck: int
    activation: str

    def __post_init__(self):
        if not isinstance(self.bottleneck, int) or self.bottleneck < 1:
            raise ConfigError(f"adaptation.adapters.bottleneck={self.bottleneck!r}: a positive integer")
        if self.activation not in ADAPTER_ACTIVATIONS:
            raise ConfigError(
                f"adaptation.adapters.activation={self.activation!r}: one of {', '.join(ADAPTER_ACTIVATIONS)}"
            )


@dataclasses.dataclass(frozen=True)
class EncoderAdaptation:
    """The extra parameters the encoder builds (None: none of that kind)."""

    lora: LoraSettings | None = None
    adapters: AdapterSettings | None = None

    def combine(self, other: EncoderAdaptation | None) -> EncoderAdaptation:
        """Both kinds' settings (a run whose phases use LoRA and adapters builds both)."""
        if other is None:
            return self
        return EncoderAdaptation(lora=other.lora or self.lora, adapters=other.adapters or self.adapters)


@dataclasses.dataclass(frozen=True)
class AdaptationKind:
    """One way a phase adapts the backbone.

    options:          the kind's option defaults (`config.adaptation.<name>`; each key's comment is in the
                      kind's file, where the dict is written).
    trained_patterns: (options) -> regexes fullmatching the `backbone/...` parameter paths a phase of the
                      kind trains; every other backbone parameter stays frozen.
    encoder_settings: (options) -> the parameters the encoder adds for the kind (None: none).
    foldable:         whether a trained model of the kind can be written as plain encoder weights
                      (transformers' own model classes) without changing its outputs.
    added_flops:      (options, hidden, intermediate) -> the matmul FLOPs per token and layer that the
                      kind's extra parameters add to a forward (training/compute.py).
    """

    name: str
    options: Mapping[str, Any]
    trained_patterns: Callable[[Mapping[str, Any]], tuple[str, ...]]
    encoder_settings: Callable[[Mapping[str, Any]], EncoderAdaptation | None]
    foldable: bool
    added_flops: Callable[[Mapping[str, Any], int, int], float]

    def resolve(self, options: Mapping[str, Any] | None) -> dict[str, Any]:
        """The defaults with `options` over them; an option the kind does not have is an error."""
        given = dict(options or {})
        unknown = sorted(set(given) - set(self.options))
        if unknown:
            raise ConfigError(
                f"adaptation.{self.name} has no option(s) {unknown}; its options: {', '.join(self.options)}"
            )
        return {**self.options, **given}


def adaptation_rngs(rngs: nnx.Rngs) -> nnx.Rngs:
    """The Rngs the adaptation parameters are drawn from: the caller's `adaptation` stream, else a key
    derived from the `params` stream's without drawing from it, so the encoder's and head's own initial
    parameters are the same with and without adaptation."""
    if "adaptation" in rngs:
        return nnx.Rngs(params=rngs["adaptation"]())
    return nnx.Rngs(params=jax.random.fold_in(rngs["params"].key[...], _ADAPTATION_SALT))
