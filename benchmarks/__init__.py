"""Speed, memory, static-shape and input-pipeline benchmarks; run them as `python -m benchmarks.<name>`."""

from stackft_jax.runtime import xla_flags

# Time the programs `python -m stackft_jax.main` runs: the same XLA:CPU flags, set before any backend.
xla_flags.apply_cpu_defaults()
