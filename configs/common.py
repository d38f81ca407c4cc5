"""The run defaults, for config files written against `configs.common`: they live in the package
(stackft_jax/config/defaults.py), so a config file anywhere, and a recorded config.json, start from
the installed package's defaults. New config files import `stackft_jax.config.defaults` directly."""

from stackft_jax.config.config_cli import apply_arg
from stackft_jax.config.config_cli import items_of as expand_shorthands
from stackft_jax.config.defaults import get_config

__all__ = ["apply_arg", "expand_shorthands", "get_config"]
