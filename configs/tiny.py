"""A tiny randomly initialised BERT on the test fixtures: seconds per run, for tests and smoke checks.

python -m stackft_jax.main --config=configs/tiny.py --workdir=/tmp/tiny
python -m stackft_jax.main --config=configs/tiny.py:conll --workdir=/tmp/tiny_conll   # word tagging
python -m stackft_jax.main --config=configs/tiny.py:three_phases --workdir=/tmp/tiny3   # a written schedule
"""

from pathlib import Path

import ml_collections

from stackft_jax.config import config_cli, defaults, phases
from stackft_jax.data.samples import sample_path

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"


def conll(c: ml_collections.ConfigDict) -> None:
    """NER on the packaged CoNLL sample; max_seq_length 32 splits its longest sentences into windows."""
    c.data.task = "conll2003"
    c.data.train_file = str(sample_path("conll_train.txt"))
    c.data.dev_file = str(sample_path("conll_dev.txt"))
    c.head.name = "bilstm_crf"
    for name in ("bilstm", "bilstm_crf"):
        c.head[name].lstm_units = 8
    c.head.token_mlp.hidden_dim = 16


def three_phases(c: ml_collections.ConfigDict) -> None:
    """A schedule written in the config, no library code: the head alone, then the head with the top
    layer and the pooler, then everything at a lower rate."""
    c.strategy = "head_top_all"  # the schedule's name in results and reports
    phases.clear_aliases(c)  # the phase1.*/phase2.* keys set below for the presets do not apply here
    c.phases = [
        phases.block(
            "head",
            rules=[("backbone/.*", "frozen"), ("head/.*", "head")],
            learning_rates={"head": 1e-3},
            num_steps=4,
            max_train_dev_gap=1.0,
            gap_eval_examples=16,
        ),
        phases.block(
            "top",
            rules=[(r"backbone/(layers/1|pooler)/.*", "top"), ("backbone/.*", "frozen"), ("head/.*", "head")],
            learning_rates={"top": 1e-3, "head": 1e-3},
            num_steps=4,
        ),
        phases.block(
            "all",
            rules=[(".*", "all")],
            learning_rates={"all": 5e-4},
            num_steps=4,
            schedule="warmup_linear",
            warmup_steps=1,
        ),
    ]


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = defaults.get_config()
    c.model.name_or_path = "embedded:minilm"  # its tokenizer and vocabulary; weights are random
    c.model.init = "random"
    c.model.config_overrides.hidden_size = 32
    c.model.config_overrides.num_hidden_layers = 2
    c.model.config_overrides.num_attention_heads = 4
    c.model.config_overrides.intermediate_size = 64
    c.head.cls_mlp.hidden_dim = 16
    c.data.task = "qqp"
    c.data.train_file = str(FIXTURES / "qqp" / "train.tsv")
    c.data.dev_file = str(FIXTURES / "qqp" / "dev.tsv")
    c.max_seq_length = 32
    c.per_device_batch_size = 1
    c.eval_per_device_batch_size = 2
    c.phase1.num_steps = 6
    c.phase1.gap_eval_examples = 16
    c.phase1.max_train_dev_gap = 1.0  # never triggers: tests set it when they want it
    c.phase2.num_steps = 6
    c.phase2.backbone_learning_rate = 1e-3
    c.log_every_steps = 2
    c.eval_every_steps = 3
    c.checkpoint_every_steps = 2
    c.async_checkpointing = False
    config_cli.apply_arg(c, arg, {"conll": conll, "three_phases": three_phases})
    return c
