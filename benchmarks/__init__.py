"""Speed, memory, static-shape and input-pipeline benchmarks; run them as `python -m benchmarks.<name>`."""
