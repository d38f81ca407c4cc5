"""The steps that `train_speed` times and `memory` measures, built the same way in both frameworks.

One model and one fixed batch; three cases per framework:

  full     every parameter trains: the project's phase-2 optimizer (BERT-AdamW, clipping at 1.0) and
           `loop.build_phase_step` (what `loop.run_phase` runs); torch: AdamW over everything, no decay on
           bias/LayerNorm, `clip_grad_norm_(..., 1.0)`.
  phase1   backbone frozen: the project's phase-1 labels (the backbone behind `stop_gradient`, no optimizer
           state for it); torch: `backbone.requires_grad_(False)` and only head parameters in AdamW.
  eval     `steps.eval_step` as runs jit it (`evaluation.jit_eval_step`); torch: `model.eval()` under
           `inference_mode()`.

`adaptation.py` compares full fine-tuning with the parameter-efficient kinds (JAX only): each of its
cases (`ADAPTATION_CASES`) is a one-phase preset with config overrides (`adaptation_config`), and its
step is that phase's, built as above.

The head is the project's `cls_mlp` (dropout, dense 256 tanh, dropout, dense 2 on [CLS]); in torch the
same layers on `transformers.BertModel`'s last hidden state. Dropout is on in both training cases.
A case's `step()` runs one step to completion (JAX results ready, not just dispatched), so timing it
measures the step, not the dispatch.
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from configs import quora
from stackft_jax.config import config_cli, phases, spec
from stackft_jax.config.spec import RunSpec
from stackft_jax.data import task_spec
from stackft_jax.models import bert
from stackft_jax.runtime import sharding
from stackft_jax.training import build, evaluation, loop, optim, steps

CASES = ("full", "phase1", "eval")
# config_overrides of the randomly initialised models; "minilm" is the embedded pretrained MiniLM.
RANDOM_MODELS = {
    "bert_base": {
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
    },
    "tiny": {  # configs/tiny.py's backbone: for smoke tests only
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
    },
}
MODELS = ("minilm", *RANDOM_MODELS)
# The phase of `stack_and_finetune` that each training case runs.
PHASE_OF_CASE = {"phase1": "phase1", "full": "phase2"}
# adaptation.py's cases: (the one-phase preset, `key=value` config overrides). The phase of
# `finetune_only` is the `full` step with the new head at its own rate, as the adapted presets train it.
ADAPTATION_CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "finetune": ("finetune_only", ()),
    "lora": ("lora", ()),  # rank 8, alpha 16, query and value
    "bitfit": ("bitfit", ()),
    "adapters": ("adapters", ()),
    "lora_all": ("lora", ("adaptation.lora.targets=.*",)),  # every projection of every layer
}

Step = Callable[[], None]


@dataclasses.dataclass
class Case:
    step: Step
    optimizer_state_bytes: Callable[[], int] = lambda: 0  # after at least one step


def experiment_config(model: str, seq_len: int) -> ml_collections.ConfigDict:
    """configs/quora.py:demo (embedded MiniLM, cls_mlp head, dropout 0.1), resized to `model`."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose from {MODELS}")
    c = quora.get_config("demo")
    c.max_seq_length = seq_len
    if model in RANDOM_MODELS:
        c.model.init = "random"
        c.model.config_overrides.update(RANDOM_MODELS[model])
    return c


def adaptation_config(model: str, seq_len: int, case: str) -> ml_collections.ConfigDict:
    """`experiment_config` with the preset and options of an `ADAPTATION_CASES` case."""
    if case not in ADAPTATION_CASES:
        raise ValueError(f"unknown adaptation case {case!r}; choose from {tuple(ADAPTATION_CASES)}")
    c = experiment_config(model, seq_len)
    c.strategy, overrides = ADAPTATION_CASES[case]
    for item in overrides:
        config_cli.set_value(c, *item.split("=", 1))
    return c


def case_config(model: str, seq_len: int, case: str) -> ml_collections.ConfigDict:
    """The config a case's model is built from: an adaptation case's, else `experiment_config`."""
    if case in ADAPTATION_CASES:
        return adaptation_config(model, seq_len, case)
    return experiment_config(model, seq_len)


def synthetic_batch(batch_size: int, seq_len: int, vocab_size: int, seed: int = 0) -> dict:
    """A padded QQP-like batch: real lengths spread over [seq_len/4, seq_len] (one row full), segment
    ids 0 then 1, labels 0/1. Both frameworks get exactly these arrays."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(seq_len // 4, 3), seq_len + 1, batch_size)
    lengths[0] = seq_len
    positions = np.arange(seq_len)[None, :]
    real = positions < lengths[:, None]
    input_ids = np.where(real, rng.integers(1000, vocab_size, (batch_size, seq_len)), 0)
    input_ids[:, 0] = 101  # [CLS]
    token_type_ids = (real & (positions >= lengths[:, None] // 2)).astype(np.int32)
    return {
        "input_ids": input_ids.astype(np.int32),
        "token_type_ids": token_type_ids,
        "segment_ids": (token_type_ids + 1) * real,
        "attention_mask": real.astype(np.int32),
        "labels": rng.integers(0, 2, batch_size).astype(np.int32),
        "example_mask": np.ones(batch_size, np.float32),
    }


# ----------------------------------------------------------------------------------------------
# stackft_jax


@dataclasses.dataclass
class JaxModel:
    spec: RunSpec
    task: task_spec.TaskSpec
    bert_config: bert.BertConfig
    graphdef: nnx.GraphDef
    params: Any
    mesh: jax.sharding.Mesh
    plan: dict[str, phases.Phase]


def build_jax(config: ml_collections.ConfigDict) -> JaxModel:
    """What `train.run` builds before its phase loop (`models.build.initial_model`), minus the data."""
    run_spec = spec.resolve(config)
    mesh = sharding.make_mesh()
    graphdef, params, bert_config = build.initial_model(
        run_spec, bert.resolve_model_dir(run_spec.model.name_or_path), mesh
    )
    plan = run_spec.plan(1000)
    return JaxModel(run_spec, run_spec.task, bert_config, graphdef, params, mesh, {p.name: p for p in plan})


def _fresh_copy(params: Any) -> Any:
    # Train steps donate their state; the shared parameters must survive for the next case.
    return jax.tree.map(jnp.copy, params)


def case_phase(m: JaxModel, case: str) -> phases.Phase:
    """The phase a training case runs: "full" and "phase1" on an `experiment_config` model, its preset's
    one phase on an `adaptation_config` model."""
    if case in ADAPTATION_CASES:
        (phase,) = m.plan.values()
        return phase
    return m.plan[PHASE_OF_CASE[case]]


def jax_phase_step(m: JaxModel, case: str, *, copy_params: bool = True) -> tuple[steps.TrainState, Any]:
    """The train state and `loop.PhaseStep` of `case` ("full", "phase1" or an `ADAPTATION_CASES` case
    on its own model), as `loop.run_phase` builds them. The step donates the state: without
    `copy_params`, `m.params` is consumed."""
    phase = case_phase(m, case)
    phase_step = loop.build_phase_step(
        phase,
        list(m.plan).index(phase.name),
        m.params,
        graphdef=m.graphdef,
        objective=m.task.objective,
        mesh=m.mesh,
        seed=m.spec.seed,
        max_grad_norm=m.spec.max_grad_norm,
        nonfinite_guard=m.spec.nonfinite_guard,
    )
    params = _fresh_copy(m.params) if copy_params else m.params
    return steps.TrainState(**phase_step.init_state(params)), phase_step


def jax_train_state(m: JaxModel, case: str, *, copy_params: bool = True) -> tuple[steps.TrainState, Callable]:
    """The train state and the step function `(state, batch) -> (state, metrics)` of `case`."""
    state, phase_step = jax_phase_step(m, case, copy_params=copy_params)
    return state, phase_step.train_step


def jax_eval_fn(m: JaxModel) -> Callable:
    return evaluation.jit_eval_step(m.task.objective, m.graphdef, m.mesh)


def jax_case(m: JaxModel, case: str, batch: dict) -> Case:
    device_batch = sharding.put_batch(batch, m.mesh)
    if case == "eval":
        eval_fn = jax_eval_fn(m)
        return Case(lambda: jax.block_until_ready(eval_fn(m.params, device_batch)))
    state, train_step = jax_train_state(m, case)
    holder = {"state": state}

    def step() -> None:
        holder["state"], metrics = train_step(holder["state"], device_batch)
        jax.block_until_ready((holder["state"], metrics))

    return Case(step, lambda: optim.optimizer_state_bytes(holder["state"].opt_state))


def jax_components(m: JaxModel, batch: dict) -> dict[str, Step]:
    """Pieces of the full step, to see where its time goes: the training-mode forward pass alone,
    forward + backward (gradients of every parameter, no optimizer), and the same without dropout."""
    device_batch = sharding.put_batch(batch, m.mesh)
    key = jax.random.key(m.spec.seed)

    def loss(params, deterministic: bool):
        dropout_key = None if deterministic else key
        return steps.mean_loss(
            params, device_batch, graphdef=m.graphdef, objective=m.task.objective, dropout_key=dropout_key
        )[0]

    forward = jax.jit(functools.partial(loss, deterministic=False))
    grads = jax.jit(jax.value_and_grad(functools.partial(loss, deterministic=False)))
    grads_no_dropout = jax.jit(jax.value_and_grad(functools.partial(loss, deterministic=True)))
    return {
        "forward_train_mode": lambda: jax.block_until_ready(forward(m.params)),
        "forward_backward": lambda: jax.block_until_ready(grads(m.params)),
        "forward_backward_no_dropout": lambda: jax.block_until_ready(grads_no_dropout(m.params)),
    }


# ----------------------------------------------------------------------------------------------
# PyTorch + transformers (imported lazily: only the torch cases need them)


@dataclasses.dataclass
class TorchModel:
    plan: dict[str, phases.Phase]  # the run's phases, as stackft_jax resolves them (learning rates, decay)
    max_grad_norm: float
    module: Any  # torch.nn.Module with .backbone (transformers.BertModel) and the head layers


def build_torch(config: ml_collections.ConfigDict, attn_implementation: str | None = None) -> TorchModel:
    import torch
    import transformers

    run_spec = spec.resolve(config)
    model_dir = bert.resolve_model_dir(run_spec.model.name_or_path)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    if run_spec.model.init == "pretrained":
        backbone = transformers.BertModel.from_pretrained(str(model_dir), **kwargs)
    else:
        hf_config = transformers.BertConfig.from_pretrained(str(model_dir))
        for key, value in run_spec.model.config_overrides.items():  # only the non-zero ones
            setattr(hf_config, key, value)
        backbone = transformers.BertModel(hf_config, **kwargs)
    torch.manual_seed(run_spec.seed)
    head = run_spec.head

    class TaskModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            hidden = backbone.config.hidden_size
            self.backbone = backbone
            self.dropout = torch.nn.Dropout(head.dropout_rate)
            self.hidden = torch.nn.Linear(hidden, head.cls_mlp.hidden_dim)
            self.output = torch.nn.Linear(head.cls_mlp.hidden_dim, 2)

        def forward(self, input_ids, token_type_ids, attention_mask):
            states = self.backbone(
                input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
            ).last_hidden_state
            x = self.dropout(states[:, 0])
            x = self.dropout(torch.tanh(self.hidden(x)))
            return self.output(x)

    plan = run_spec.plan(1000)
    return TorchModel({p.name: p for p in plan}, run_spec.max_grad_norm, TaskModel())


def torch_info(m: TorchModel) -> dict:
    import torch

    return {
        "torch_num_threads": torch.get_num_threads(),
        "torch_num_interop_threads": torch.get_num_interop_threads(),
        "attn_implementation": m.module.backbone.config._attn_implementation,
    }


def _torch_inputs(batch: dict) -> tuple[dict, Any]:
    import torch

    inputs = {
        key: torch.from_numpy(batch[key].astype(np.int64))
        for key in ("input_ids", "token_type_ids", "attention_mask")
    }
    return inputs, torch.from_numpy(batch["labels"].astype(np.int64))


def torch_case(m: TorchModel, case: str, batch: dict) -> Case:
    import torch
    import torch.nn.functional as F

    module = m.module
    inputs, labels = _torch_inputs(batch)
    if case == "eval":
        module.eval()

        def eval_step() -> None:
            with torch.inference_mode():
                logits = module(**inputs)
                logits.argmax(-1)
                F.cross_entropy(logits, labels, reduction="sum")

        return Case(eval_step)

    if case not in PHASE_OF_CASE:
        raise ValueError(f"torch runs the cases {('eval', *PHASE_OF_CASE)}, not {case!r}")
    module.train()
    frozen = case == "phase1"
    module.requires_grad_(True)
    if frozen:
        module.backbone.requires_grad_(False)
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    phase = m.plan[PHASE_OF_CASE[case]]
    lr = phase.learning_rates["head" if frozen else "backbone"]
    no_decay = [p for n, p in named if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for n, p in named if not (n.endswith("bias") or "LayerNorm" in n)]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": phase.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=lr,
        betas=(0.9, 0.999),
        eps=1e-6,
    )
    trainable = [p for _, p in named]

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(module(**inputs), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, m.max_grad_norm)
        optimizer.step()

    def state_bytes() -> int:
        return sum(
            t.numel() * t.element_size()
            for state in optimizer.state.values()
            for t in state.values()
            if torch.is_tensor(t)
        )

    return Case(train_step, state_bytes)


def torch_components(m: TorchModel, batch: dict) -> dict[str, Step]:
    """The same pieces as `jax_components`, for the torch full step."""
    import torch.nn.functional as F

    module = m.module
    module.requires_grad_(True)
    inputs, labels = _torch_inputs(batch)

    def forward() -> None:
        module.train()
        F.cross_entropy(module(**inputs), labels)

    def forward_backward(train_mode: bool) -> None:
        module.train(train_mode)
        module.zero_grad(set_to_none=True)
        F.cross_entropy(module(**inputs), labels).backward()

    return {
        "forward_train_mode": forward,
        "forward_backward": functools.partial(forward_backward, True),
        "forward_backward_no_dropout": functools.partial(forward_backward, False),
    }
