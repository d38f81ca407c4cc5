"""Random transformers encoders of every supported family, and small tokenizers the tests train themselves.

No non-BERT checkpoint can be downloaded here, so every family is tested on random weights: a PyTorch
model of the family's own transformers class, with every parameter redrawn (biases and LayerNorm too, so a
swapped or untransposed tensor cannot hide behind the small default init), saved to a folder as a user's
checkpoint would be.
"""

from collections.abc import Sequence
from pathlib import Path

import tokenizers
import torch
import transformers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

FAMILIES = ("bert", "roberta", "xlm-roberta", "electra", "distilbert")
SMALL = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 64}
BASE = {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "intermediate_size": 3072}
SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # RoBERTa's and XLM-R's ids 0-4


def hf_config(
    family: str,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    vocab_size: int = 128,
    max_length: int = 64,
) -> transformers.PretrainedConfig:
    """The family's transformers config with the shape its released checkpoints have: RoBERTa / XLM-R
    with one token type, padding id 1 and two extra positions; ELECTRA embedding at half the width;
    DistilBERT with its sinusoidal position table."""
    if family == "distilbert":
        return transformers.DistilBertConfig(
            vocab_size=vocab_size,
            dim=hidden_size,
            n_layers=num_layers,
            n_heads=num_heads,
            hidden_dim=intermediate_size,
            max_position_embeddings=max_length,
            sinusoidal_pos_embds=True,
        )
    shape = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "intermediate_size": intermediate_size,
    }
    if family in ("roberta", "xlm-roberta"):
        cls = transformers.RobertaConfig if family == "roberta" else transformers.XLMRobertaConfig
        return cls(**shape, max_position_embeddings=max_length + 2, type_vocab_size=1, pad_token_id=1)
    if family == "electra":
        return transformers.ElectraConfig(
            **shape, embedding_size=hidden_size // 2, max_position_embeddings=max_length
        )
    return transformers.BertConfig(**shape, max_position_embeddings=max_length)


def random_encoder(
    family: str,
    *,
    seed: int = 0,
    std: float = 0.3,
    matrix_std: float | None = None,
    model_class: type | None = None,
    **shape,
) -> torch.nn.Module:
    """The family's encoder (the bare AutoModel, or `model_class`: a task / pre-training class) with every
    parameter drawn from N(0, std); weight matrices from N(0, matrix_std) when given (a base-sized model
    with std 0.3 matrices saturates every softmax, and a near tie then decides the comparison)."""
    torch.manual_seed(seed)
    config = hf_config(family, **shape)
    model = (model_class(config) if model_class else transformers.AutoModel.from_config(config)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            matrix = p.ndim == 2 and "embeddings" not in name
            p.normal_(0.0, matrix_std if matrix and matrix_std is not None else std)
    return model


def torch_hidden_states(model: torch.nn.Module, batch: dict) -> list:
    """Every layer's hidden states (embeddings first) as numpy arrays: `output_hidden_states=True`."""
    inputs = {k: torch.as_tensor(v).long() for k, v in batch.items()}
    if not getattr(model.config, "type_vocab_size", 0):
        inputs.pop("token_type_ids", None)
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
    return [h.numpy() for h in out.hidden_states]


def train_bpe(
    folder: Path, corpus: Sequence[str], vocab_size: int = 400
) -> transformers.PreTrainedTokenizerBase:
    """A byte-level BPE tokenizer in RoBERTa's layout (<s> a </s></s> b </s>), saved to `folder`."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    wrapped = transformers.RobertaTokenizerFast(tokenizer_object=tokenizer)
    wrapped.save_pretrained(folder)
    return wrapped


def train_unigram(
    folder: Path, corpus: Sequence[str], vocab_size: int = 200
) -> transformers.PreTrainedTokenizerBase:
    """A SentencePiece-style Unigram tokenizer ("▁word" pieces) in XLM-R's layout, saved to `folder`."""
    tokenizer = tokenizers.Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, unk_token="<unk>")
    tokenizer.train_from_iterator(corpus, trainer)
    wrapped = transformers.XLMRobertaTokenizerFast(tokenizer_object=tokenizer)
    wrapped.save_pretrained(folder)
    return wrapped
