"""Speed, memory, static-shape and input-pipeline benchmarks; run them as `python -m benchmarks.<name>`.

They time the programs the commands run: XLA's own flags, plus any the user sets in XLA_FLAGS."""
