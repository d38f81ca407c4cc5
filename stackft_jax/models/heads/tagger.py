"""Word-tagging heads (NER): scores over the task's tags for every word, from its first sub-token state.

One module, four registered configurations (their names are part of the interface):

  token_mlp   words -> dense(hidden_dim, ReLU) -> dense(tags): the paper's finetune-only NER head,
              "BERT + two dense layers" (Wang et al. 2019).
  bilstm      words -> BiLSTM -> dense(tags): the paper's stacked head.
  bilstm_crf  words -> BiLSTM -> dense(tags) -> linear-chain CRF: AllenNLP's CRF tagger, the task
              network Peters et al. 2019 used for NER.
  crf         words -> dense(tags) -> linear-chain CRF, directly on the BERT word states.

The words are `Features.word_states()`: packed left, so the BiLSTM and the CRF see contiguous words and
never a sub-token or a padding label, and cut to the batch's `word_width` (at most its length bucket), so
the BiLSTM and CRF scans run over about the real words, not all `max_seq_length - 2` slots. Dense kernels
use Kaiming (He) normal initialisation, as Wang et al. initialised their stacked networks. With `crf`,
the outputs are `CrfWordScores` (sequence NLL, Viterbi); without, `WordLogits` (per-word cross-entropy,
argmax): objectives.WORD_TAGGING takes both.
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from stackft_jax.models import crf
from stackft_jax.models.dense import Dense
from stackft_jax.models.dropout import Dropout
from stackft_jax.models.features import Features
from stackft_jax.models.layers import MaskedBiLstm
from stackft_jax.models.word_scores import CrfWordScores, WordLogits


def _config(*, hidden_dim: int, lstm_layers: int, use_crf: bool) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        {
            "hidden_dim": hidden_dim,  # width of the ReLU dense layer before the tag scores; 0: none
            "lstm_layers": lstm_layers,  # stacked BiLSTM layers over the words; 0: none
            "lstm_units": 256,  # units per direction of each BiLSTM layer
            "crf": use_crf,  # a linear-chain CRF over the tag scores (NLL training, Viterbi decoding)
            "iob2_constraints": True,  # CRF only: forbid O -> I-X and B-X -> I-Y in training and decoding
            # Softmax heads only: decode the most probable well-formed IOB2 sequence (Viterbi over the
            # per-word log-probabilities, the CRF's constraints, no learned transitions); training as is.
            "iob2_decoding": False,
        }
    )


def token_mlp_config() -> ml_collections.ConfigDict:
    return _config(hidden_dim=256, lstm_layers=0, use_crf=False)


def bilstm_config() -> ml_collections.ConfigDict:
    return _config(hidden_dim=0, lstm_layers=1, use_crf=False)


def bilstm_crf_config() -> ml_collections.ConfigDict:
    return _config(hidden_dim=0, lstm_layers=1, use_crf=True)


def crf_config() -> ml_collections.ConfigDict:
    return _config(hidden_dim=0, lstm_layers=0, use_crf=True)


class WordTaggerHead(nnx.Module):
    """words -> dropout -> [BiLSTM -> dropout] x lstm_layers -> [dense(ReLU) -> dropout] -> dense(tags)
    [-> CRF]."""

    reads = "words"  # what it reads (heads.head_input): words, one score vector each

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        *,
        hidden_size: int,
        num_outputs: int,
        output_names: Sequence[str] = (),
        dropout_rate: float,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ):
        kaiming = nnx.initializers.he_normal()
        self.dropout = Dropout(dropout_rate)
        self.dtype = dtype
        width = hidden_size
        lstms = []
        for _ in range(config.lstm_layers):
            lstms.append(MaskedBiLstm(width, config.lstm_units, dtype=dtype, rngs=rngs))
            width = 2 * config.lstm_units
        self.lstms = nnx.List(lstms)
        hidden = None
        if config.hidden_dim:
            hidden = Dense(width, config.hidden_dim, kernel_init=kaiming, dtype=dtype, rngs=rngs)
            width = config.hidden_dim
        self.hidden = hidden
        self.output = Dense(width, num_outputs, kernel_init=kaiming, dtype=dtype, rngs=rngs)
        self.crf = self._crf(config, num_outputs, output_names, rngs) if config.crf else None
        self.decode_constraints = None  # static: the fixed moves a softmax head decodes under
        if config.get("iob2_decoding") and not config.crf:
            self.decode_constraints = self._iob2(output_names, num_outputs, "iob2_decoding")

    @staticmethod
    def _crf(
        config: ml_collections.ConfigDict, num_outputs: int, output_names: Sequence[str], rngs: nnx.Rngs
    ) -> crf.CRF:
        if not config.iob2_constraints:
            return crf.CRF(num_outputs, rngs=rngs)
        constraints = WordTaggerHead._iob2(output_names, num_outputs, "iob2_constraints")
        return crf.CRF(num_outputs, constraints=constraints, rngs=rngs)

    @staticmethod
    def _iob2(output_names: Sequence[str], num_outputs: int, key: str) -> crf.Constraints:
        if len(output_names) != num_outputs:
            raise ValueError(
                f"config.head.<name>.{key} needs the task's tag names; the task gives "
                f"{len(output_names)} names for {num_outputs} tags"
            )
        return crf.iob2_constraints(output_names)

    def _dropout(self, x: jax.Array, slots: int, *, deterministic: bool, rngs: nnx.Rngs | None) -> jax.Array:
        """Dropout on the trimmed words [batch, word_width, ...] with the mask drawn for all `slots`
        word slots and cut back: which words drop depends on the seed and step, never on the batch's
        length bucket, so trimming changes no number of an untrimmed run."""
        if deterministic:
            return x
        width = x.shape[1]
        padded = jnp.pad(x, ((0, 0), (0, slots - width), *((0, 0),) * (x.ndim - 2)))
        return self.dropout(padded, deterministic=False, rngs=rngs)[:, :width]

    def __call__(
        self, features: Features, *, deterministic: bool, rngs: nnx.Rngs | None = None
    ) -> WordLogits | CrfWordScores:
        num_words = features.num_words
        slots = features.word_starts.shape[1]
        x = features.word_states().astype(self.dtype)  # [batch, word_width, hidden]
        x = self._dropout(x, slots, deterministic=deterministic, rngs=rngs)
        for lstm in self.lstms:
            x, _ = lstm(x, num_words)
            x = self._dropout(x, slots, deterministic=deterministic, rngs=rngs)
        if self.hidden is not None:
            x = jax.nn.relu(self.hidden(x))
            x = self._dropout(x, slots, deterministic=deterministic, rngs=rngs)
        scores = self.output(x).astype(jnp.float32)
        if self.crf is not None:
            return CrfWordScores(scores, self.crf.potentials())
        if self.decode_constraints is not None:
            return WordLogits(scores, crf.constraint_potentials(self.decode_constraints))
        return WordLogits(scores)
