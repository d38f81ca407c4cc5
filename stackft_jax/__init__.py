"""stackft_jax: stack-and-finetune adaptation of pretrained BERT encoders in JAX/Flax."""

__version__ = "0.1.0"
