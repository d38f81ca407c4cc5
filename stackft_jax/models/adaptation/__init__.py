"""Parameter-efficient adaptation kinds, chosen by name: which backbone parameters a phase of the kind
trains (besides the head) and what parameters the encoder adds for it.

Adding a kind: write `adaptation/<name>.py` with an `OPTIONS` dict literal (each entry with a trailing `#`
comment) and a `KIND = AdaptationKind(...)` (kind.py), then add one line below. A kind that adds encoder
parameters also adds its settings to `EncoderAdaptation` (kind.py) and builds them in models/bert.py.

The config side asks:
    KINDS[name].trained_patterns(options)   # regexes over `backbone/...` paths a phase of it trains
    default_adaptation_configs()            # config.adaptation.<kind>.<option> blocks
    encoder_adaptation(kinds, options)      # what build_model(..., adaptation=...) gets
"""

import inspect
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import ml_collections

from stackft_jax.models.adaptation import adapters, bitfit, lora
from stackft_jax.models.adaptation.kind import (
    AdaptationKind,
    AdapterSettings,
    EncoderAdaptation,
    LoraSettings,
)
from stackft_jax.runtime.cli_errors import ConfigError

__all__ = [
    "KINDS",
    "AdaptationKind",
    "AdapterSettings",
    "EncoderAdaptation",
    "LoraSettings",
    "check_options",
    "default_adaptation_configs",
    "encoder_adaptation",
    "option_sources",
]

KINDS: dict[str, AdaptationKind] = {
    "bitfit": bitfit.KIND,
    "lora": lora.KIND,
    "adapters": adapters.KIND,
}


def default_adaptation_configs() -> ml_collections.ConfigDict:
    """One block of options per kind, e.g. `config.adaptation.lora.rank`."""
    return ml_collections.ConfigDict({name: dict(kind.options) for name, kind in KINDS.items()})


def check_options(options: Mapping[str, Mapping[str, Any]]) -> None:
    """Every kind's options (`config.adaptation`), whether a phase uses the kind or not: a value that cannot
    mean anything (lora.rank=0, lora.alpha=0, a `targets` alternative naming no projection) is refused
    wherever it is set, so that a later strategy that reads it does not meet it first (ConfigError)."""
    for name, kind in KINDS.items():
        kind.encoder_settings(kind.resolve(options.get(name)))


def option_sources() -> dict[str, Path]:
    """Each kind's file, where its options' comments are written (for `--show_config`)."""
    return {name: Path(inspect.getsourcefile(kind.trained_patterns)) for name, kind in KINDS.items()}


def encoder_adaptation(
    kinds: Iterable[str], options: Mapping[str, Mapping[str, Any]] | None = None
) -> EncoderAdaptation | None:
    """What the encoder builds for a run whose phases use `kinds`, each with `options[kind]` over its
    defaults; None when no kind adds parameters (no kind, or BitFit only)."""
    options = options or {}
    settings = None
    for name in kinds:
        if name not in KINDS:
            raise ConfigError(f"adaptation kind {name!r} is not registered (kinds: {', '.join(KINDS)})")
        extra = KINDS[name].encoder_settings(options.get(name) or {})
        settings = extra if settings is None else settings.combine(extra)
    return settings
