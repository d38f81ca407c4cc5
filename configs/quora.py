"""Quora Question Pairs (GLUE QQP): paraphrase identification, accuracy and F1.

Full run (bert-base-uncased, GLUE QQP from the Hugging Face hub):
  python -m stackft_jax.main --config=configs/quora.py --workdir=runs/qqp
On local files (GLUE TSV with header, or the Quora release TSV):
  python -m stackft_jax.main --config=configs/quora.py --workdir=runs/qqp \
    --config.data.train_file=../shared/data/qqp/train.tsv --config.data.dev_file=../shared/data/qqp/dev.tsv
Offline demo, embedded MiniLM and the packaged sample (minutes on a laptop CPU):
  python -m stackft_jax.main --config=configs/quora.py:demo --workdir=runs/demo
Presets combine with keys: `configs/quora.py:demo,strategy=finetune_only,head=cls_mlp`.
"""

import ml_collections

from stackft_jax.config import config_cli, defaults
from stackft_jax.data.samples import sample_path


def demo(c: ml_collections.ConfigDict) -> None:
    c.model.name_or_path = "embedded:minilm"
    c.data.train_file = str(sample_path("qqp_train.tsv"))
    c.data.dev_file = str(sample_path("qqp_dev.tsv"))
    c.max_seq_length = 64
    c.per_device_batch_size = 16
    c.eval_per_device_batch_size = 64
    c.phase1.num_steps = 60
    c.phase1.gap_eval_examples = 200
    c.phase1.max_train_dev_gap = 0.05
    c.phase2.num_steps = 60
    c.phase2.backbone_learning_rate = 5e-5
    c.phase2.warmup_ratio = 0.1
    c.log_every_steps = 10
    c.eval_every_steps = 20
    c.checkpoint_every_steps = 20


def mini(c: ml_collections.ConfigDict) -> None:
    """Embedded MiniLM on real data: the few-hundred-steps-per-phase check of the README."""
    c.model.name_or_path = "embedded:minilm"
    c.per_device_batch_size = 32
    c.phase1.num_steps = 300
    c.phase1.max_train_dev_gap = 0.03
    c.phase1.gap_eval_examples = 1000
    c.phase2.num_steps = 300
    c.phase2.backbone_learning_rate = 5e-5
    c.eval_every_steps = 100
    c.checkpoint_every_steps = 100
    # Random batches in the doubling buckets and the select guard, what the committed CPU grids built on
    # this preset ran with (docs/grids/), so they read back as finished; new grids set
    # batching.bucket_tokens=16 (stackft_jax/data/batching.py) and nonfinite_guard=skip_update
    # (training/steps.py), the library's defaults.
    c.batching.scheme = "random"
    c.batching.bucket_tokens = 0
    c.batching.loss_weighting = "batch_mean"
    c.batching.min_row_share = 0.0
    c.nonfinite_guard = "select"


PRESETS = {"demo": demo, "mini": mini}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = defaults.get_config()
    c.data.task = "qqp"
    c.model.name_or_path = "bert-base-uncased"
    # Wang et al.: phase 1 at lr 1e-3 until just before the head overfits; phase 2 at 2e-5.
    c.phase1.learning_rate = 1e-3
    c.phase1.num_epochs = 1.0
    c.phase2.backbone_learning_rate = 2e-5
    c.phase2.num_epochs = 3.0
    c.eval_every_steps = 1000
    c.checkpoint_every_steps = 1000
    config_cli.apply_arg(c, arg, PRESETS)
    return c
