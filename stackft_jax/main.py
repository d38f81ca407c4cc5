"""Command line: `python -m stackft_jax.main --config=configs/quora.py --workdir=runs/qqp`.

Rerunning the same command with the same --workdir resumes from its checkpoints. Config keys are set
as `--config=FILE.py:preset,key=value` or `--config.key=value` (config_cli.py); `--show_config` lists them.
"""

import logging
import os
import sys

from absl import app, flags

from stackft_jax.config import config_cli
from stackft_jax.runtime import cli_errors
from stackft_jax.runtime.cli_errors import ConfigError


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


FLAGS = flags.FLAGS
flags.DEFINE_string(
    "config",
    None,
    "Experiment config FILE.py[:preset,key=value,...], or a run's recorded WORKDIR/config.json (it reruns "
    "that run); keys also as --config.KEY=VALUE flags.",
)
flags.DEFINE_bool("show_config", False, "Print every config key with its value and comment, then exit.")
# The `--config.KEY=VALUE` items, taken out of argv before absl parses it (see _parse_flags).
_OVERRIDES: list[str] = []
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and results.")
flags.DEFINE_bool(
    "distributed",
    False,
    "Multi-host run: call jax.distributed.initialize(), which finds the cluster itself on TPU pods, "
    "SLURM and Open MPI. Implied by --coordinator_address.",
)
flags.DEFINE_string(
    "coordinator_address",
    os.environ.get("JAX_COORDINATOR_ADDRESS"),
    "host:port of process 0's coordinator, for clusters jax does not detect (env JAX_COORDINATOR_ADDRESS).",
)
flags.DEFINE_integer(
    "num_processes", _env_int("JAX_NUM_PROCESSES"), "Processes in the run (env JAX_NUM_PROCESSES)."
)
flags.DEFINE_integer("process_id", _env_int("JAX_PROCESS_ID"), "This process's id (env JAX_PROCESS_ID).")
flags.DEFINE_bool(
    "allow_config_change",
    False,
    "Resume a workdir although its recorded config differs in keys that change results (the new "
    "config is recorded, the old one kept in config_history.jsonl).",
)


def _parse_flags(argv: list[str]) -> list[str]:
    try:
        _OVERRIDES[:], rest = config_cli.split_override_flags(argv)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(cli_errors.EXIT_USAGE)
    return cli_errors.parse_flags(rest)


@cli_errors.guarded  # a user's mistake: one line and its exit status (cli_errors.py)
def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not FLAGS.config:
        raise app.UsageError("--config=FILE.py is required")
    config = config_cli.load(FLAGS.config, _OVERRIDES, kind="run")
    if FLAGS.show_config:
        config_cli.show(config)
        return
    if not FLAGS.workdir:
        raise app.UsageError("--workdir is required")
    import jax

    from stackft_jax.runtime import (  # after the flags: a mistake answers before the heavy imports
        distributed,
        logs,
    )

    if FLAGS.distributed or FLAGS.coordinator_address:
        try:
            distributed.initialize(
                coordinator_address=FLAGS.coordinator_address,
                num_processes=FLAGS.num_processes,
                process_id=FLAGS.process_id,
            )
        except ValueError as error:  # an incomplete coordinator setting
            raise cli_errors.UsageError(str(error)) from None
    logs.setup()

    from stackft_jax.config import spec
    from stackft_jax.runtime import compilation_cache
    from stackft_jax.training import train  # jax, flax, orbax: only once the config is valid

    # Every check, once, before any work: values out of range or choice, task x head x stop rule,
    # missing files; named in one line, no traceback.
    run_spec = spec.resolve(config)
    compilation_cache.enable(run_spec.compilation_cache_dir)  # before anything compiles
    logging.info("JAX process %d/%d, devices: %s", jax.process_index(), jax.process_count(), jax.devices())
    results = train.run(run_spec, FLAGS.workdir, allow_config_change=FLAGS.allow_config_change)
    if jax.process_index() == 0:
        final = " ".join(
            f"{split}.{k}={v:.4f}" for split, vals in results["final"].items() for k, v in vals.items()
        )
        print(f"final: {final}  ({FLAGS.workdir}/results.json)")


if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)
