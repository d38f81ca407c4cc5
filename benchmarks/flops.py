"""Model FLOPs of a BERT step and model FLOPs utilisation (MFU) against a device's peak; the counting
itself is the library's (stackft_jax/models/flops.py, which a run's compute record uses too).

Model FLOPs count only the matmuls the model needs (as in the PaLM paper's MFU), whatever the compiler
or the hardware really executes: per token and layer, 2 * (4 H^2 + 2 H I) for the Q/K/V/output and
feed-forward projections, plus 2 * 2 * S * H for the attention scores and the weighted sum; a training
step with a backward pass through a part of the model costs 3x that part's forward (forward + two
matmuls per weight in the backward), a frozen part (phase 1) and evaluation cost 1x. The task head and
embeddings lookups are left out (under 1 % for the cls_mlp head on BERT).
"""

from __future__ import annotations

from stackft_jax.models.flops import BACKWARD_FACTOR, PEAK_BF16_FLOPS, forward_flops, peak_flops

__all__ = ["PEAK_BF16_FLOPS", "peak_flops", "step_flops", "mfu"]

FORWARD_PASSES = {"full": BACKWARD_FACTOR, "phase1": 1.0, "eval": 1.0}


def step_flops(case: str, **shape: int) -> float:
    """Model FLOPs of one `full` / `phase1` / `eval` step (see the module docstring)."""
    if case not in FORWARD_PASSES:
        raise ValueError(f"unknown case {case!r}; choose from {sorted(FORWARD_PASSES)}")
    return FORWARD_PASSES[case] * forward_flops(**shape)


def mfu(flops_per_step: float, seconds_per_step: float, peak_per_device: float, num_devices: int) -> float:
    return flops_per_step / seconds_per_step / (peak_per_device * num_devices)
