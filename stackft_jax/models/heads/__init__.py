"""Task heads, chosen by name (`config.head.name`).

Adding a head: write `heads/<name>.py` with a `default_config()` (a dict literal, each entry with a
trailing `#` comment: `--show_config` prints it) and an `nnx.Module` whose constructor is
`(config, *, hidden_size, num_outputs, output_names, dropout_rate, dtype, rngs)` and whose call is
`(features: Features, *, deterministic, rngs) -> outputs`; then add one line below. The outputs are what
the task's objective (objectives.py) takes: `[batch, num_outputs]` logits for sentence(-pair) tasks, a
`WordScores` (models/word_scores.py) for word tagging, where `features.word_states()` gives the words.
A head that needs the two texts of a pair sets the class attribute `reads = PAIR`, a word tagger
`reads = WORDS` (spec.resolve refuses them on other tasks).
`num_outputs` is the task's number of classes or tags (1 for regression); `output_names` their names
(a tagging head's CRF derives its IOB2 constraints from them; other heads ignore them).
"""

import difflib

import ml_collections
from flax import nnx

from stackft_jax.models.heads import (
    bimpm,
    cls_mlp,
    densenet,
    esim,
    highway_lstm,
    linear,
    sim_transformer,
    tagger,
)
from stackft_jax.models.objectives import WORD_TAGGING, Objective
from stackft_jax.runtime.cli_errors import ConfigError

# name -> (function returning the head's default config block, head class)
HEADS = {
    "cls_mlp": (cls_mlp.default_config, cls_mlp.ClsMlpHead),
    "linear": (linear.default_config, linear.LinearHead),  # LP-FT's linear probe
    "bimpm": (bimpm.default_config, bimpm.BiMpmHead),
    "bimpm_no_context": (bimpm.no_context_default_config, bimpm.BiMpmHead),
    "sim_transformer": (sim_transformer.default_config, sim_transformer.SimTransformerHead),
    "esim": (esim.default_config, esim.EsimHead),
    # Text classification (Yahoo Answers).
    "densenet": (densenet.default_config, densenet.DenseNetHead),
    "highway_lstm": (highway_lstm.default_config, highway_lstm.HighwayLstmHead),
    # Word tagging (NER): one module, four configurations (heads/tagger.py).
    "token_mlp": (tagger.token_mlp_config, tagger.WordTaggerHead),
    "bilstm": (tagger.bilstm_config, tagger.WordTaggerHead),
    "bilstm_crf": (tagger.bilstm_crf_config, tagger.WordTaggerHead),
    "crf": (tagger.crf_config, tagger.WordTaggerHead),
}


# What a head reads (its class's `reads`; default TEXT): any text or text pair through [CLS] or pooled
# states, the two texts of a pair, or words. spec.resolve checks it against the task.
TEXT, PAIR, WORDS = "text", "sentence_pair", "words"


def head_input(name: str) -> str:
    return getattr(HEADS[name][1], "reads", TEXT)


def default_head_configs() -> ml_collections.ConfigDict:
    """One config block per registered head, e.g. `config.head.cls_mlp.hidden_dim`."""
    return ml_collections.ConfigDict({name: default() for name, (default, _) in HEADS.items()})


def check_head(head_config: ml_collections.ConfigDict) -> None:
    """A registered head's name (a grid's mistyped axis value fails before any cell trains)."""
    name = head_config.name
    if name not in HEADS:
        close = difflib.get_close_matches(name, list(HEADS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"config.head.name={name!r} is not a registered head{hint} (heads: {', '.join(sorted(HEADS))})"
        )
    own = head_config[name]
    if own.get("iob2_decoding") and own.get("crf"):
        raise ConfigError(
            f"config.head.{name}.iob2_decoding decodes a softmax head under IOB2 constraints; {name} has a "
            f"CRF, which decodes under config.head.{name}.iob2_constraints"
        )


def is_word_tagger(head_config: ml_collections.ConfigDict) -> bool:
    return HEADS.get(head_config.name, (None, None))[1] is tagger.WordTaggerHead


def check_fits(head_config: ml_collections.ConfigDict, objective: Objective, *, task_name: str) -> None:
    """Word taggers score words (a word tagging task's outputs); the other heads score a sentence."""
    tags_words = objective is WORD_TAGGING
    if is_word_tagger(head_config) != tags_words:
        fitting = sorted(n for n, (_, cls) in HEADS.items() if (cls is tagger.WordTaggerHead) == tags_words)
        raise ConfigError(
            f"config.head.name={head_config.name!r} is a {'word tagging' if not tags_words else 'sentence'} "
            f"head, and data.task={task_name!r} is a {objective.name} task: choose one of {fitting}"
        )


def build_head(head_config: ml_collections.ConfigDict, **kwargs) -> nnx.Module:
    check_head(head_config)
    _, cls = HEADS[head_config.name]
    return cls(head_config[head_config.name], **kwargs)


def is_linear(head_config: ml_collections.ConfigDict) -> bool:
    """Whether the configured head maps BERT states to outputs with one dense layer: `linear`, or a
    word tagger with no hidden layer, BiLSTM or CRF (LP-FT's probe for word tagging)."""
    name = head_config.name
    if name == "linear":
        return True
    if is_word_tagger(head_config):
        block = head_config[name]
        return block.hidden_dim == 0 and block.lstm_layers == 0 and not block.crf
    return False
