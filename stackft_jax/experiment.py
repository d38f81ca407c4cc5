"""Experiments: a grid of runs (axes x seeds) over one base config, and its statistical report.

    python -m stackft_jax.experiment --config=configs/experiments/paper_qqp.py:small --workdir=runs/grid
    python -m stackft_jax.experiment --config=... --workdir=runs/grid --shard=1/2   # every 2nd cell-seed
    python -m stackft_jax.experiment --config=... --workdir=runs/grid --shard=0/2 --status  # what is left

A grid config (configs/experiments/*.py) holds:

  base      the experiment config and its presets and keys, as `--config=` takes it
            ("configs/quora.py:mini,data.train_file=...")
  axes      "key=v1|v2|...; key2=..." over any config keys (strategy, head.name, phase1.num_steps, ...);
            a value that sets several keys is `label:key=value,key=value` under a name of your choosing
            ("method=frozen:strategy=stack_only,model.scalar_mix=True|tuned:strategy=finetune_only"),
            and the label names it in run folders, the baseline and the report
  num_seeds seeds 0 .. num_seeds-1 per cell
  baseline  "key=value": each other value of that axis is compared with it, for the same other axis
            values and seed (paired)
  metric    the metric the comparisons use (a key of results.json's `final.dev`)
  ensembles optional, "" by default: "key=v1+v2; key2=..." averages the class probabilities of the runs
            with those values of that axis (equal weights, experiments/ensemble.py), per seed and
            combination of the other axes' values; the report builds them from the finished runs in
            WORKDIR/ensembles/ and shows each as a cell whose value is `v1+v2` (compared with the
            baseline like any cell); classification only, refused before training otherwise
  paper_results optional, "" by default: "<cell name>: <gain in points>; ..." the gain over the baseline
            that a paper reports for that cell (source in the grid config's comment); the report's
            paper-layout table shows it beside the measured gain, `not found` where it has none

A test split for every run is the base config's `data.test_file` (`base="...,data.test_file=FILE"`); the
report shows test beside dev wherever runs scored it.

Every cell-seed is an ordinary run in `WORKDIR/runs/<cell>-seed<k>` (so it resumes like any run, and is
bound to its config like any workdir); finished runs are read back, so the grid resumes where it stopped
and a finished grid only rewrites the report and its ensembles (experiments/report.py). Runs go seed by
seed, so a grid cut short still has comparable cells. `--shard=i/N` runs the cell-seeds whose position
in that order is i mod N: N machines over one shared workdir (or merged later) split a grid; the report
is written by whichever finds every run finished. Processes of one machine can share a grid (or a
shard) without splitting it in advance: each skips a run that another live process holds (its workdir
lock) and takes the next, so `taskset -c 0 ... & taskset -c 1 ...` over one workdir balances itself
when cells cost unequal amounts (single-host processes; a multi-host grid uses --shard).

A grid workdir belongs to its grid config as a run workdir to its run config: WORKDIR/grid_config.json
records it, and a rerun with another (another base, axes, seeds, metric, ...) is refused before any
work, naming the differing keys; `--allow_config_change` goes on with the new one on purpose (runs whose
cell config changed then resume under the new values; the ensembles are rebuilt). Every cell, the
metric, the baseline, the ensembles and the seed count are checked before the first cell trains; an axis
over `seed` is refused (the grid sets it).

Grids that share cells train them once: `--reuse_runs_from=OTHER_WORKDIR[,...]` copies each unfinished
run of this shard, when its turn comes, from a finished run there with the same resolved config (the
binding a rerun compares; any run name) into WORKDIR/runs: its record without checkpoints, with
`reused_from.json` naming the source; the report counts them beside the costs.

Runs with `phase1.feature_cache=True` and no `phase1.feature_cache_dir` of their own share
WORKDIR/feature_cache: the frozen backbone's features are built once for all cells and seeds with the
same backbone and data (pretrained weights; a random init differs per seed), so later stack-only and
phase-1 cells cost the head alone. Shards building the same cache at once are safe (feature_cache.py).
`phase1.feature_cache_dir=none` keeps each run's caches in its own workdir.
"""

import sys

from absl import app, flags

from stackft_jax import cli_errors, config_cli
from stackft_jax.experiments.grid import parse_shard, plan_grid, run_grid, run_states, status_lines

FLAGS = flags.FLAGS
flags.DEFINE_string("config", None, "grid config file, FILE.py[:presets,key=value,...]")
flags.DEFINE_string("workdir", None, "the grid's directory: runs/ and the report")
flags.DEFINE_string("shard", "0/1", "run only the cell-seeds at positions i mod N")
flags.DEFINE_bool("report_only", False, "write the report of the finished runs, train nothing")
flags.DEFINE_bool(
    "status",
    False,
    "list which runs are finished, started or not started (and the shard of --shard's N that runs "
    "each); train and write nothing",
)
flags.DEFINE_bool(
    "allow_config_change",
    False,
    "Go on with a grid workdir although its recorded grid config differs (the new one is recorded, "
    "the old one kept in grid_config_history.jsonl); its runs may then change config too.",
)

flags.DEFINE_list(
    "reuse_runs_from",
    [],
    "other grids' workdirs: a run of this grid that one of them finished with the same resolved config "
    "is copied from there (its record, not its checkpoints) instead of trained again",
)

_OVERRIDES: list[str] = []  # the `--config.KEY=VALUE` items, taken out of argv before absl parses it


def _parse_flags(argv: list[str]) -> list[str]:
    try:
        _OVERRIDES[:], rest = config_cli.split_override_flags(argv)
    except config_cli.ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(cli_errors.EXIT_USAGE)
    return cli_errors.parse_flags(rest)


@cli_errors.guarded  # a user's mistake: one line and its exit status (cli_errors.py)
def main(argv: list[str]) -> None:
    from stackft_jax import logs
    from stackft_jax.experiments import report

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logs.setup()
    grid = config_cli.load(FLAGS.config, _OVERRIDES, kind="grid")
    shard = parse_shard(FLAGS.shard)
    if FLAGS.status:
        print("\n".join(status_lines(run_states(grid, FLAGS.workdir), shard[1])))
        return
    # Every cell, metric and value checked, and the workdir bound to this grid, before any run trains.
    allow = FLAGS.allow_config_change
    if FLAGS.report_only:
        plan_grid(grid, FLAGS.workdir, allow_config_change=allow)
        done = True
    else:
        done = run_grid(
            grid, FLAGS.workdir, shard=shard, allow_config_change=allow, reuse_runs_from=FLAGS.reuse_runs_from
        )
    if not done:
        print(f"shard {FLAGS.shard} finished; the report is written once every shard has")
        return
    # --report_only over an unfinished grid names the missing run
    print(f"report: {report.write_report(grid, FLAGS.workdir)}")


if __name__ == "__main__":
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(main, flags_parser=_parse_flags)
