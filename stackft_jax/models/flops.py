"""Analytic model FLOPs: the matmuls an encoder forward and every head need, from the model's real
config (as in the PaLM paper's MFU count), whatever the compiler or the hardware really executes.

Per token and layer, 2 * (4 H^2 + 2 H I) for the Q/K/V/output and feed-forward projections, plus
2 * 2 * S * H for the attention scores and the weighted sum. A pass that also runs the backward through
a part of the model costs 3x that part's forward (forward, plus two matmuls per weight in the backward);
a frozen part and evaluation cost 1x; a frozen part the gradient passes through (an adaptation kind's
phase) 2x, as its weights need no gradient. Left out of the encoder: embedding lookups, layer norms,
softmax and other elementwise work (under 1 % on BERT shapes).

Every registered head has its count in `HEAD_FLOPS` (tests/test_head_flops.py checks each against XLA's
cost analysis of the head's forward within 10%, and fails for a head without one). A head counts its
matmuls and convolutions, plus the elementwise work that is a large part of it: the LSTM gates, the
CRF's forward algorithm (its training objective; Viterbi decoding costs about the same), BiMPM's
multi-perspective cosines. Heads run on static shapes: a pair head's two sentences are each packed to
the input length and a tagger scores `max_seq_length - 2` word slots, so the count is of what runs at
the longest length bucket, padding included, like the encoder's.

benchmarks/flops.py (MFU) and training/compute.py (a run's compute) both count with these.
"""

from collections.abc import Callable, Mapping
from typing import Any

# What a training step costs relative to a forward of the same part: forward + backward.
BACKWARD_FACTOR = 3.0
# ... when the part's weights are frozen but the gradient passes through it to trained parameters below
# or inside it (LoRA, BitFit, adapters): forward + the backward's activation half, no weight gradients.
PASS_THROUGH_FACTOR = 2.0
# Elementwise FLOPs per unit and position of an LSTM direction beyond its matmuls (bias and gate adds,
# three sigmoids, two tanhs, the cell and hidden updates), as XLA's cost analysis counts them.
LSTM_ELEMENTWISE = 30
# FLOPs per (from, to) tag pair and position of the CRF's forward algorithm (add, max, subtract, exp,
# sum and log of a log-sum-exp, the emission and the step mask), as XLA counts them.
CRF_ELEMENTWISE = 9


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


def _lstm(inputs: int, units: int) -> float:
    """One LSTM direction, per position: input and recurrent projections to the four gates, and the
    gates' elementwise work."""
    return 2.0 * (inputs + units) * 4 * units + LSTM_ELEMENTWISE * units


def _bilstm(inputs: int, units: int) -> float:
    return 2 * _lstm(inputs, units)


def _crf(tags: int) -> float:
    """The forward algorithm (the training objective), per position: every (from, to) tag pair."""
    return CRF_ELEMENTWISE * tags * tags


def _cls_mlp(block: Mapping[str, Any], hidden: int, outputs: int, seq_len: int) -> float:
    return _dense_chain([hidden, block["hidden_dim"], outputs])  # once per example: the [CLS] vector


def _linear(block: Mapping[str, Any], hidden: int, outputs: int, seq_len: int) -> float:
    return _dense_chain([hidden, outputs])


def _tagger(block: Mapping[str, Any], hidden: int, outputs: int, seq_len: int) -> float:
    """Every word slot (the batch's word width: max_seq_length - 2 at the longest bucket)."""
    per_word, width = 0.0, hidden
    for _ in range(block["lstm_layers"]):
        per_word += _bilstm(width, block["lstm_units"])
        width = 2 * block["lstm_units"]
    widths = [width, block["hidden_dim"], outputs] if block["hidden_dim"] else [width, outputs]
    per_word += _dense_chain(widths)
    if block["crf"]:
        per_word += _crf(outputs)
    return word_slots(seq_len) * per_word


def word_slots(seq_len: int) -> int:
    return max(1, seq_len - 2)  # [CLS] and [SEP] carry no word


def _multi_perspective_matching(dim: int, perspectives: int, length: int) -> float:
    """One direction of BiMPM's matching (bimpm.match_one_direction) over a pair of `length`-token
    sentences of `dim`-wide states: weighting, dot products and norms of the four strategies."""
    k, d, n = perspectives, dim, length
    pairwise = 2 * n * n * k * d + 6 * n * k * d  # max-pooling: every (i, j) and perspective
    cosine = 2 * n * n * d + 4 * n * d  # the attention weights: plain cosines of every (i, j)
    attentive_means = 2 * (2 * n * n * d)
    # full, attentive and max-attentive: weight both sides, two norms and a dot, for P and for Q
    per_strategy = 2 * (n * k * d * 7)
    return float(pairwise + cosine + attentive_means + 3 * per_strategy)


def _bimpm_matching(block: Mapping[str, Any], hidden: int, seq_len: int) -> float:
    """Per pair: the context BiLSTM over both sentences, then the matching of both LSTM directions."""
    total = 0.0
    dim = hidden
    if block["use_context_lstm"]:
        total += 2 * seq_len * _bilstm(hidden, block["context_lstm_units"])
        dim = block["context_lstm_units"]
    return total + 2 * _multi_perspective_matching(dim, block["num_perspectives"], seq_len)


def _matching_width(block: Mapping[str, Any]) -> int:
    return 2 * 4 * block["num_perspectives"]  # bimpm.BiMpmMatching.output_dim


def _bimpm(block: Mapping[str, Any], hidden: int, outputs: int, seq_len: int) -> float:
    units = block["aggregation_lstm_units"]
    aggregation = 2 * seq_len * _bilstm(_matching_width(block), units)
    return (
        _bimpm_matching(block, hidden, seq_len)
        + aggregation
        + _dense_chain([4 * units, block["mlp_hidden_dim"], outputs])
    )


def _sim_transformer(block: Mapping[str, Any], hidden: int, outputs: int, seq_len: int) -> float:
    dim = block["model_dim"]
    per_token_layer = 2 * 4 * dim * dim + 2 * 2 * dim * block["ff_dim"] + 2 * 2 * seq_len * dim
    tokens = 2 * seq_len  # both sentences, each packed to the input length
    return (
        _bimpm_matching(block, hidden, seq_len)
        + tokens * 2 * _matching_width(block) * dim
        + tokens * block["num_layers"] * per_token_layer
        + _dense_chain([4 * dim, block["mlp_hidden_dim"], outputs])
    )


def _esim(block: Mapping[str, Any], hidden: int, outputs: int, seq_len: int) -> float:
    units, tokens = block["lstm_units"], 2 * seq_len
    alignment = 3 * 2 * seq_len * seq_len * 2 * units  # scores, and both aligned sums
    return (
        tokens * _bilstm(hidden, units)
        + alignment
        + tokens * 2 * 8 * units * units  # the projection of [a; a~; a - a~; a * a~]
        + tokens * _bilstm(units, units)
        + _dense_chain([8 * units, block["mlp_hidden_dim"], outputs])
    )


def _densenet(block: Mapping[str, Any], hidden: int, outputs: int, seq_len: int) -> float:
    kernel, growth, length = block["kernel_size"], block["growth_rate"], seq_len
    channels = block["stem_channels"]
    total = 2.0 * length * kernel * hidden * channels
    for index in range(block["num_blocks"]):
        if index:
            compressed = max(1, int(channels * block["compression"]))
            total += 2.0 * length * channels * compressed  # the transition's 1x1 convolution
            channels, length = compressed, -(-length // 2)
        for k in range(block["convs_per_block"]):
            total += 2.0 * length * kernel * (channels + k * growth) * growth
        concat = block.get("block_output", "concat") == "concat"
        channels = channels + block["convs_per_block"] * growth if concat else growth
    return total + _dense_chain([2 * channels + hidden, outputs])


def _highway_lstm(block: Mapping[str, Any], hidden: int, outputs: int, seq_len: int) -> float:
    units = block["lstm_units"]
    per_position = 0.0
    for layer in range(block["num_lstm_layers"]):
        inputs, gates = (hidden, 4) if layer == 0 else (units, 5)  # a highway layer's carry gate
        per_position += 2 * inputs * gates * units + 2 * units * 4 * units + LSTM_ELEMENTWISE * units
    return 2 * seq_len * per_position + _dense_chain([4 * units + hidden, outputs])


# head name -> (its config block, encoder width, outputs, tokens per example) -> forward FLOPs per example
HEAD_FLOPS: dict[str, Callable[..., float | None]] = {
    "cls_mlp": _cls_mlp,
    "linear": _linear,
    "bimpm": _bimpm,
    "bimpm_no_context": _bimpm,
    "sim_transformer": _sim_transformer,
    "esim": _esim,
    "densenet": _densenet,
    "highway_lstm": _highway_lstm,
    "token_mlp": _tagger,
    "bilstm": _tagger,
    "bilstm_crf": _tagger,
    "crf": _tagger,
}


def _light_token_mlp(block: Mapping[str, Any], hidden: int, outputs: int, seq_len: int) -> float | None:
    """`token_mlp` as counted before every head had its count: every token, no LSTM or CRF."""
    if block.get("lstm_layers", 0) or block.get("crf", False):
        return None
    widths = [hidden, block["hidden_dim"], outputs] if block.get("hidden_dim", 0) else [hidden, outputs]
    return seq_len * _dense_chain(widths)


# The heads counted before every head had its count (2026-11-28): the light ones, a tagger's MLP over
# every token; every other head counted 0. Matched cells planned then (a grid's `matched_light_heads`,
# experiments/budgets.py) keep the step counts they ran by planning with this count.
LIGHT_HEAD_FLOPS: dict[str, Callable[..., float | None]] = {
    "cls_mlp": _cls_mlp,
    "linear": _linear,
    "token_mlp": _light_token_mlp,
}
# Which heads a count includes: every registered one (the default), or the light ones alone.
HEAD_COUNTS = {"every": HEAD_FLOPS, "light": LIGHT_HEAD_FLOPS}


def head_flops(
    head: Mapping[str, Any], *, hidden: int, outputs: int, seq_len: int, counted: str = "every"
) -> float | None:
    """Forward FLOPs of the head (`{"name": ..., <name>: its block}`, the run config's form) per example
    of `seq_len` tokens; None for a name the count `counted` (HEAD_COUNTS) leaves out (`every`: every
    registered head is in it)."""
    count = HEAD_COUNTS[counted].get(head["name"])
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
