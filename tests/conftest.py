"""Test session set-up: 8 virtual CPU devices, so every test exercises the sharded code path."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
# The XLA:CPU flags the command line uses, so tests run the programs users run.
from stackft_jax import xla_flags  # noqa: E402

xla_flags.apply_cpu_defaults()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Compiled programs are reused across tests and the CLI subprocesses they start.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", "/tmp/stackft_jax_test_jax_cache")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
