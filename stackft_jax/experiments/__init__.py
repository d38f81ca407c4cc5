"""The experiment layer: grids of ordinary runs, their statistics and report, ensembles of finished runs.

  cells.py       a grid config's cells: axes, runs (cell x seed), baseline, ensembles, the paper's gains
  grid.py        running a grid: each run's config resolved once (spec.resolve), checks, shards, resume
  report.py      the report of a finished grid: per-cell intervals, paired comparisons, costs, boundaries
  statistics.py  the statistics on arrays the report uses: per-example counts, bootstrap, exact tests
  markdown.py    report.md: the report's tables with their captions
  figures.py     the report's figures
  ensemble.py    ensembles of finished classification runs (averaged class probabilities)
  compute.py     a run's compute per phase (steps, examples through the backbone, FLOPs, wall time)
  budgets.py     matched-budget cells: a baseline given the compared strategy's steps, examples or FLOPs
                 (its plan, or its cost without a feature cache)
  budget_curves.py  the `budget_steps` axis: learning curves, each curve's best budget on the selection
                 split, best-budget comparisons on test

The commands are thin modules at the package top: experiment.py (`python -m stackft_jax.experiment`)
and ensemble.py (`python -m stackft_jax.ensemble`). Nothing here trains by itself: a grid's runs are
train.run calls, and everything the report reads is a run's files.
"""
