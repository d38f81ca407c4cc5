"""benchmarks/flops.py and train_speed's accelerator report (bf16 throughput, MFU), run on the CPU."""

import json

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from benchmarks import flops, train_speed
from stackft_jax.models import bert


def _read(path):
    return json.loads(path.read_text())


@pytest.mark.slow
def test_train_speed_accelerator_report(tmp_path):
    # Forced on the CPU with a made-up peak, so the MFU arithmetic runs where CI runs.
    out = tmp_path / "train_speed.json"
    train_speed.main(
        [
            "--quick",
            "--models=tiny",
            "--frameworks=jax",
            "--accelerator-report=on",
            "--peak-tflops=0.5",
            f"--out={out}",
        ]
    )
    payload = _read(out)
    report = payload["results"]["tiny"]["accelerator"]
    assert set(report["dtypes"]) == {"float32", "bfloat16"}
    assert report["peak_flops_per_device"] == 0.5e12
    for by_case in report["dtypes"].values():
        assert set(by_case) == {"full", "phase1", "eval"}
        for entry in by_case.values():
            expected = entry["model_flops_per_step"] / entry["median_s"] / (0.5e12 * report["num_devices"])
            assert entry["mfu"] == pytest.approx(expected)
        # A full step does a backward pass: three times the forward's model FLOPs.
        assert by_case["full"]["model_flops_per_step"] == 3 * by_case["eval"]["model_flops_per_step"]
    assert "| tiny |" in payload["table_markdown"] and "bfloat16" in payload["table_markdown"]


def test_model_flops_match_xla_cost_analysis():
    """The analytic matmul count agrees with XLA's own FLOP count of a BERT forward (a model large
    enough that the matmuls dominate elementwise work)."""
    config = bert.BertConfig(
        vocab_size=100, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024
    )
    model = bert.BertModel(config, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    ids = jnp.zeros((4, 128), jnp.int32)

    def forward(params, ids):
        return nnx.merge(graphdef, params)(ids, ids, jnp.ones_like(ids), deterministic=True).hidden_states[-1]

    cost = jax.jit(forward).lower(params, ids).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    analytic = flops.forward_flops(num_layers=2, hidden=256, intermediate=1024, batch=4, seq_len=128)
    assert analytic == pytest.approx(cost["flops"], rel=0.1)


def test_peak_flops_lookup():
    assert flops.peak_flops("TPU v5 lite") == 197e12
    assert flops.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert flops.peak_flops("cpu") is None
