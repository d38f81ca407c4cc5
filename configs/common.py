"""Defaults shared by every experiment. Task configs import `get_config` and change a few keys.

Keys that form the interface (see README, "Configuration"):
  model.name_or_path         hub id (bert-base-uncased), local folder, or "embedded:minilm"
  data.task                  qqp | mrpc | stsb | sst2
  data.train_file / dev_file / test_file   local files; unset -> the Hugging Face dataset
  strategy                   finetune_only | stack_only | stack_and_finetune
  seed, max_seq_length, per_device_batch_size (global batch = per-device x device count)
  phase1.*                   the frozen-backbone phase (stack_only, and phase 1 of stack_and_finetune)
  phase2.*                   the all-parameters phase (finetune_only, and phase 2 of stack_and_finetune)
Presets: `--config=configs/quora.py:demo,head=cls_mlp,strategy=finetune_only` (comma-separated; a bare
word names a preset of that file, `key=value` sets a key).
"""

import ml_collections
from ml_collections.config_dict import placeholder

from stackft_jax.models.heads import default_head_configs


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.strategy = "stack_and_finetune"
    c.seed = 0
    c.max_seq_length = 128
    c.per_device_batch_size = 32
    c.eval_per_device_batch_size = 64

    c.model = ml_collections.ConfigDict()
    c.model.name_or_path = "bert-base-uncased"
    c.model.init = (
        "pretrained"  # or "random": BERT config and tokenizer from name_or_path, random weights
    )
    c.model.allow_pickle = (
        False  # load pytorch_model.bin (unpickling runs code) when no safetensors
    )
    c.model.dtype = "float32"  # compute dtype; "bfloat16" on TPU/GPU (parameters stay float32)
    c.model.scalar_mix = False  # heads see a learned mix of all BERT layers instead of the last
    c.model.dropout_rate = placeholder(float)  # overrides BERT's hidden/attention dropout when set
    c.model.config_overrides = ml_collections.ConfigDict(
        {"hidden_size": 0, "num_hidden_layers": 0, "num_attention_heads": 0, "intermediate_size": 0}
    )  # non-zero values replace config.json's (tiny random models for tests)

    c.head = default_head_configs()
    c.head.name = "cls_mlp"
    c.head.dropout_rate = 0.1

    c.data = ml_collections.ConfigDict()
    c.data.task = "qqp"
    c.data.train_file = placeholder(str)
    c.data.dev_file = placeholder(str)
    c.data.test_file = placeholder(str)
    c.data.cache_dir = placeholder(str)  # tokenized-data cache; default ~/.cache/stackft_jax

    c.phase1 = ml_collections.ConfigDict()
    c.phase1.learning_rate = 1e-3
    c.phase1.num_steps = 0  # 0: use num_epochs
    c.phase1.num_epochs = 1.0
    c.phase1.warmup_steps = 0
    c.phase1.warmup_ratio = 0.0
    c.phase1.schedule = "constant"
    c.phase1.weight_decay = 0.01
    c.phase1.max_train_dev_gap = 0.02  # stop once train accuracy exceeds dev accuracy by this much
    c.phase1.gap_eval_examples = 2000  # train examples scored (eval mode) to measure that gap
    c.phase1.patience_evals = 0  # stop after this many evals without dev improvement; 0: off
    # With backbone dropout off, the frozen backbone maps each example to the same features at every
    # step, so `feature_cache` can compute them once and train the head on them (stackft_jax/
    # feature_cache.py). The head keeps its own dropout either way.
    c.phase1.backbone_dropout = True  # the frozen backbone runs in training mode (with dropout)
    c.phase1.feature_cache = False  # needs backbone_dropout=False; files under WORKDIR/feature_cache
    c.phase1.feature_cache_dtype = "float32"  # or "bfloat16": half the disk and page cache

    c.phase2 = ml_collections.ConfigDict()
    c.phase2.backbone_learning_rate = 2e-5
    c.phase2.head_learning_rate = 0.0  # 0: same as backbone_learning_rate
    c.phase2.layerwise_lr_decay = 1.0  # < 1: discriminative learning rates per BERT layer
    c.phase2.num_steps = 0
    c.phase2.num_epochs = 3.0
    c.phase2.warmup_steps = 0
    c.phase2.warmup_ratio = 0.1
    c.phase2.schedule = "warmup_linear"
    c.phase2.weight_decay = 0.01
    c.phase2.patience_evals = 0

    c.max_grad_norm = 1.0
    c.log_every_steps = 50
    c.eval_every_steps = 500
    c.checkpoint_every_steps = 500
    c.keep_checkpoints = 2
    c.async_checkpointing = True
    return c


SHORTHANDS = {"task": "data.task", "head": "head.name"}


def expand_shorthands(arg: str | None) -> list[str]:
    """`task=mrpc,head=esim` -> `data.task=mrpc`, `head.name=esim`; other items unchanged."""
    items = []
    for item in filter(None, (arg or "").split(",")):
        key, sep, value = item.partition("=")
        items.append(f"{SHORTHANDS.get(key, key)}={value}" if sep else item)
    return items


def apply_arg(config: ml_collections.ConfigDict, arg: str | None, presets: dict) -> None:
    """Applies `name1,key=value,...` from `--config=file.py:<arg>` in order; presets are functions
    that edit the config in place."""
    for item in expand_shorthands(arg):
        if "=" not in item:
            if item not in presets:
                raise ValueError(
                    f"unknown preset {item!r}; presets of this config: {sorted(presets)}"
                )
            presets[item](config)
            continue
        key, value = item.split("=", 1)
        parent = config
        *path, leaf = key.split(".")
        for part in path:
            parent = parent[part]
        if leaf not in parent:
            raise KeyError(f"config key {key!r} does not exist (from config argument {item!r})")
        current = parent[leaf]
        if isinstance(current, bool):
            parent[leaf] = value.lower() in ("1", "true", "yes")
        elif isinstance(current, int | float) and not isinstance(current, bool):
            parent[leaf] = type(current)(value)
        else:
            parent[leaf] = value
