"""Analytic model FLOPs: the matmuls an encoder forward and the light heads need, from the model's real
config (as in the PaLM paper's MFU count), whatever the compiler or the hardware really executes.

Per token and layer, 2 * (4 H^2 + 2 H I) for the Q/K/V/output and feed-forward projections, plus
2 * 2 * S * H for the attention scores and the weighted sum. A pass that also runs the backward through
a part of the model costs 3x that part's forward (forward, plus two matmuls per weight in the backward);
a frozen part and evaluation cost 1x; a frozen part the gradient passes through (an adaptation kind's
phase) 2x, as its weights need no gradient. Left out: embedding lookups, layer norms, softmax and other
elementwise work (under 1 % on BERT shapes), and the heads other than `HEAD_FLOPS`'s (BiLSTMs, CRFs,
BiMPM, DenseNet, Sim-Transformer), whose cost `head_flops` reports as unknown (None).

benchmarks/flops.py (MFU) and training/compute.py (a run's compute) both count with these.
"""

from collections.abc import Callable, Mapping
from typing import Any

# What a training step costs relative to a forward of the same part: forward + backward.
BACKWARD_FACTOR = 3.0
# ... when the part's weights are frozen but the gradient passes through it to trained parameters below
# or inside it (LoRA, BitFit, adapters): forward + the backward's activation half, no weight gradients.
PASS_THROUGH_FACTOR = 2.0


def forward_flops(*, num_layers: int, hidden: int, intermediate: int, batch: int, seq_len: int) -> float:
    """Matmul FLOPs of one BERT encoder forward over `batch` x `seq_len` tokens."""
    tokens = batch * seq_len
    per_token_per_layer = 2 * (4 * hidden * hidden + 2 * hidden * intermediate) + 2 * 2 * seq_len * hidden
    return float(tokens * num_layers * per_token_per_layer)


def encoder_flops(encoder: Any, *, examples: int, seq_len: int) -> float:
    """`forward_flops` of `examples` examples of `seq_len` tokens through an encoder config (BertConfig's
    field names: num_hidden_layers, hidden_size, intermediate_size)."""
    return forward_flops(
        num_layers=encoder.num_hidden_layers,
        hidden=encoder.hidden_size,
        intermediate=encoder.intermediate_size,
        batch=examples,
        seq_len=seq_len,
    )


def _dense_chain(widths: list[int]) -> float:
    return float(sum(2 * a * b for a, b in zip(widths, widths[1:], strict=False)))


def _cls_mlp(block: Mapping[str, Any], hidden: int, outputs: int, seq_len: int) -> float:
    return _dense_chain([hidden, block["hidden_dim"], outputs])  # once per example: the [CLS] vector


def _linear(block: Mapping[str, Any], hidden: int, outputs: int, seq_len: int) -> float:
    return _dense_chain([hidden, outputs])


def _token_mlp(block: Mapping[str, Any], hidden: int, outputs: int, seq_len: int) -> float | None:
    if block.get("lstm_layers", 0) or block.get("crf", False):  # then not a plain per-token MLP
        return None
    widths = [hidden, block["hidden_dim"], outputs] if block.get("hidden_dim", 0) else [hidden, outputs]
    return seq_len * _dense_chain(widths)  # every token


# head name -> (its config block, encoder width, outputs, tokens per example) -> forward FLOPs per example
HEAD_FLOPS: dict[str, Callable[..., float | None]] = {
    "cls_mlp": _cls_mlp,
    "linear": _linear,
    "token_mlp": _token_mlp,
}


def head_flops(head: Mapping[str, Any], *, hidden: int, outputs: int, seq_len: int) -> float | None:
    """Forward FLOPs of the head (`{"name": ..., <name>: its block}`, the run config's form) per example;
    None for a head this module does not count."""
    count = HEAD_FLOPS.get(head["name"])
    return None if count is None else count(head[head["name"]], hidden, outputs, seq_len)


# Dense bfloat16 peak FLOP/s per device (vendor datasheets), by the start of `jax.Device.device_kind`:
# what MFU (model FLOP/s over the devices' peak) is measured against. A CPU has no entry: its MFU is n/a.
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
    "NVIDIA H100": 989e12,  # SXM; the PCIe card is 756e12
    "NVIDIA A100": 312e12,
    "NVIDIA L4": 121e12,
    "NVIDIA A10G": 70e12,
    "NVIDIA V100": 125e12,  # fp16 tensor cores (no bf16 on V100)
    "NVIDIA T4": 65e12,  # fp16
}


def peak_flops(device_kind: str) -> float | None:
    """Per-device bf16 peak for a `device_kind` (longest matching prefix), None when unknown (CPU)."""
    matches = [kind for kind in PEAK_BF16_FLOPS if device_kind.startswith(kind)]
    return PEAK_BF16_FLOPS[max(matches, key=len)] if matches else None
