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

from stackft_jax.models.flops import BACKWARD_FACTOR, forward_flops

# Dense bfloat16 peak FLOP/s per device (vendor datasheets), by the start of `jax.Device.device_kind`.
PEAK_BF16_FLOPS = {
    "TPU v2": 45e12 / 2,  # per core: a v2 chip is two cores of 22.5 TFLOP/s
    "TPU v3": 123e12 / 2,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
    "NVIDIA H200": 989e12,
    "NVIDIA H100": 989e12,  # SXM; the PCIe card is 756e12: pass --peak-tflops for it
    "NVIDIA A100": 312e12,
    "NVIDIA L4": 121e12,
    "NVIDIA A10G": 70e12,
    "NVIDIA V100": 125e12,  # fp16 tensor cores (no bf16 on V100)
    "NVIDIA T4": 65e12,  # fp16
}

FORWARD_PASSES = {"full": BACKWARD_FACTOR, "phase1": 1.0, "eval": 1.0}


def step_flops(case: str, **shape: int) -> float:
    """Model FLOPs of one `full` / `phase1` / `eval` step (see the module docstring)."""
    if case not in FORWARD_PASSES:
        raise ValueError(f"unknown case {case!r}; choose from {sorted(FORWARD_PASSES)}")
    return FORWARD_PASSES[case] * forward_flops(**shape)


def peak_flops(device_kind: str) -> float | None:
    """Per-device bf16 peak for a `device_kind` (longest matching prefix), None when unknown."""
    matches = [kind for kind in PEAK_BF16_FLOPS if device_kind.startswith(kind)]
    return PEAK_BF16_FLOPS[max(matches, key=len)] if matches else None


def mfu(flops_per_step: float, seconds_per_step: float, peak_per_device: float, num_devices: int) -> float:
    return flops_per_step / seconds_per_step / (peak_per_device * num_devices)
