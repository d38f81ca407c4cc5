"""CoNLL-2003 English NER (Wang et al. 2019's second experiment): entity F1 (seqeval, strict IOB2) and
token accuracy (the paper's measure) on dev.

Full run (bert-base-cased, the Hugging Face conll2003 dataset):
  python -m stackft_jax.main --config=configs/conll03.py --workdir=runs/conll
On the original files (IOB1 tags, -DOCSTART- lines; converted to IOB2 on reading):
  python -m stackft_jax.main --config=configs/conll03.py:head=bilstm_crf --workdir=runs/conll \
    --config.data.train_file=../shared/data/conll2003/eng.train \
    --config.data.dev_file=../shared/data/conll2003/eng.testa
Offline demo, embedded MiniLM and the packaged sample (a few minutes on a laptop CPU):
  python -m stackft_jax.main --config=configs/conll03.py:demo --workdir=runs/conll_demo
Heads: token_mlp (the paper's finetune-only "BERT + 2 dense layers"), bilstm (its stacked network, the
default), bilstm_crf (Peters et al.'s AllenNLP tagger), crf. Presets combine with keys:
`configs/conll03.py:demo,head=crf,strategy=finetune_only`. `mini` is one epoch per phase with the
embedded MiniLM on real files (give them as above). The embedded MiniLM is uncased: NER loses the
casing cue, so expect lower F1 than a cased BERT (README, "Named-entity recognition").
"""

import ml_collections

from stackft_jax.config import config_cli, defaults
from stackft_jax.data.samples import sample_path


def demo(c: ml_collections.ConfigDict) -> None:
    c.model.name_or_path = "embedded:minilm"
    c.data.train_file = str(sample_path("conll_train.txt"))
    c.data.dev_file = str(sample_path("conll_dev.txt"))
    c.max_seq_length = 64
    c.per_device_batch_size = 16
    c.eval_per_device_batch_size = 64
    c.phase1.num_steps = 50
    c.phase1.gap_eval_examples = 200
    c.phase1.max_train_dev_gap = 0.05
    c.phase2.num_steps = 50
    c.phase2.backbone_learning_rate = 1e-4
    c.log_every_steps = 10
    c.eval_every_steps = 25
    c.checkpoint_every_steps = 25


def mini(c: ml_collections.ConfigDict) -> None:
    """Embedded MiniLM on the real files: one epoch per phase (439 steps at batch 32)."""
    c.model.name_or_path = "embedded:minilm"
    c.phase1.num_epochs = 1.0
    c.phase1.gap_eval_examples = 1000
    c.phase2.num_epochs = 1.0
    c.phase2.backbone_learning_rate = 5e-5
    c.eval_every_steps = 200
    c.checkpoint_every_steps = 200
    # Token accuracy, what the committed CPU grids built on this preset ran with (docs/grids/
    # paper_conll_small, pilot_conll), so they read back as finished; new grids set
    # phase1.gap_metric=f1, the task's own (paper_conll.py:test).
    c.phase1.gap_metric = "accuracy"
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
    c.data.task = "conll2003"
    c.model.name_or_path = "bert-base-cased"  # NER needs case: "U.S." vs "us", "Apple" vs "apple"
    c.head.name = "bilstm"
    # Sentences average 14 words (about 20 sub-tokens); longer ones are split into windows, never cut.
    c.max_seq_length = 128
    # Wang et al.: phase 1 at lr 1e-3 until just before the head overfits; phase 2 at a low rate.
    c.phase1.learning_rate = 1e-3
    c.phase1.num_epochs = 1.0
    # The gap rule compares entity F1 (phase1.gap_metric "" = the task's primary metric): token accuracy,
    # near 1 on NER, moved by at most 0.011 while the entity-F1 gap was 0.04-0.085, so with it the 0.02
    # rule never fired (docs/grids/paper_conll_small ran so: the `mini` preset keeps it for that grid).
    c.phase2.backbone_learning_rate = 3e-5
    c.phase2.num_epochs = 3.0
    c.eval_every_steps = 500
    c.checkpoint_every_steps = 500
    config_cli.apply_arg(c, arg, PRESETS)
    return c
