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
  exclude_cells optional, "" by default: "key=v1,key2=v2; key=v3" leaves the cells with all the values
            of one group out of the axes' product (a strategy tried with one head only, say); a cell
            whose baseline cell is left out gets no baseline row, an ensemble missing a member is not
            built; not with `matched`
  num_seeds seeds 0 .. num_seeds-1 per cell
  baseline  "key=value": each other value of that axis is compared with it, for the same other axis
            values and seed (paired)
  metric    the metric the comparisons use (a key of results.json's `final.dev`)
  ensembles optional, "" by default: "key=v1+v2; key2=..." averages the class probabilities of the runs
            with those values of that axis (equal weights, experiments/ensemble.py), per seed and
            combination of the other axes' values; the report builds them from the finished runs in
            WORKDIR/ensembles/ and shows each as a cell whose value is `v1+v2` (compared with the
            baseline like any cell); classification only, refused before training otherwise
  matched   optional, "" by default: "key=value@matched_<rule>:compared|...; ..." adds to axis `key` the
            cell `value@matched_<rule>:compared` (per combination of the other axes' values and seed):
            `value`'s settings with its one phase's num_steps set so that it costs what `compared`
            plans to cost, by rule steps | examples (through the backbone's forward) | flops
            (experiments/budgets.py); each such run's config records the rule and the budget
            (`matched_budget.*`), e.g. "strategy=finetune_only@matched_flops:stack_and_finetune"
  matched_light_heads optional, "" by default: matched cells ("key=value@matched_flops...:compared|...",
            as `matched` writes them) whose FLOPs budget counts the light heads alone (cls_mlp, linear,
            token_mlp), as every matched cell was planned before each head had its FLOPs: a preset names
            its committed grid's cells here, so a rerun plans the steps they ran (experiments/budgets.py)
  comparisons optional, "baseline" by default: the report's comparison rows, "<cell> vs <cell>; ...",
            each cell by the name the report prints (`strategy=stack_and_finetune-name=sim_transformer`,
            an ensemble's `...-name=densenet+highway_lstm`): any two cells (cross-head, strategy against
            strategy, ensemble against single run, either baseline recipe), cell minus the other, paired
            by seed; the word `baseline` adds every cell against its baseline cell (the rows of a grid
            without the key). A name that is no cell is refused before training
  paper_results optional, "" by default: "<cell> vs <cell>: <gain in points> (note); ..." the gain a
            paper reports for that comparison (a lone `<cell>`: against its baseline cell), with an
            optional note on what the number is (no `;` in it); its source goes in the grid config's
            comment; the report's paper-layout table shows it beside the measured gain, `not found`
            where it has none
  equivalence_margin optional, 0.01 by default (1 point of a 0-1 metric): the margin of the TOST
            equivalence test every comparison gets; "level" or "no difference" may be said of a
            comparison only where TOST gives p < 0.05 at this margin
  bootstrap_samples optional, 5000 by default: resamples of the two-level bootstrap (the report prints
            its endpoints' Monte-Carlo error; 5,000 keeps them within 0.1 point, statistics.py)
  tuned_recipes optional, "" by default, with a `budget_steps` axis only: "recipe=a|b; recipe=c|d",
            groups of the baseline axis' values, each group one strategy's recipes; the report picks
            per group (and other axes) the recipe and budget with the best mean score on the selection
            slice and compares each group's pick with the baseline group's (experiments/budget_curves.py)

`comparisons`, `paper_results`, `equivalence_margin`, `bootstrap_samples` and `tuned_recipes` are
report-only: adding or changing them on a grid workdir refuses nothing and retrains nothing
(workdirs.GRID_REPORT_ONLY_KEYS); `--report_only` rewrites the report with them.

The report's primary interval for every comparison is the seed-level paired t-interval (95%, on dev and
on test where the runs scored it); every test is two-sided; where an exact test cannot reach 0.05 at
the grid's seed count the report says so, with its smallest attainable p.

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

Runs with `phase1.feature_cache=True` and no `feature_cache_dir` of their own share
WORKDIR/feature_cache: the frozen backbone's features are built once for all cells and seeds with the
same backbone and data (pretrained weights; a random init differs per seed), so later stack-only and
phase-1 cells cost the head alone. Shards building the same cache at once are safe (feature_cache.py).
`feature_cache_dir=none` keeps each run's caches in its own workdir.
"""

import sys

from absl import app, flags

from stackft_jax.config import config_cli
from stackft_jax.experiments.grid import parse_shard, plan_grid, run_grid, run_states, status_lines
from stackft_jax.runtime import cli_errors
from stackft_jax.runtime.cli_errors import ConfigError

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
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(cli_errors.EXIT_USAGE)
    return cli_errors.parse_flags(rest)


@cli_errors.guarded  # a user's mistake: one line and its exit status (cli_errors.py)
def main(argv: list[str]) -> None:
    from stackft_jax.experiments import grid_report  # scipy, statsmodels, deepsig: only this command
    from stackft_jax.runtime import logs

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
    print(f"report: {grid_report.write_report(grid, FLAGS.workdir)}")


if __name__ == "__main__":
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(main, flags_parser=_parse_flags)
