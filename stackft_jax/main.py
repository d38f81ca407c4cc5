"""Command line: `python -m stackft_jax.main --config=configs/quora.py --workdir=runs/qqp`.

Rerunning the same command with the same --workdir resumes from its checkpoints.
"""

import logging
import os
import sys

from absl import app, flags
from ml_collections import config_flags

# Config files import `configs.common`; make the checkout they live in importable.
sys.path.insert(0, os.getcwd())

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config", None, "Experiment config file[:preset,key=value,...].", lock_config=True
)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and results.")
flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() (multi-host TPU pods).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from stackft_jax import xla_flags

    xla_flags.apply_cpu_defaults()  # before JAX starts a backend
    import jax

    if FLAGS.distributed:
        jax.distributed.initialize()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("absl").setLevel(logging.WARNING)

    from stackft_jax import train

    logging.info(
        "JAX process %d/%d, devices: %s", jax.process_index(), jax.process_count(), jax.devices()
    )
    results = train.run(FLAGS.config, FLAGS.workdir)
    if jax.process_index() == 0:
        final = " ".join(
            f"{split}.{k}={v:.4f}"
            for split, vals in results["final"].items()
            for k, v in vals.items()
        )
        print(f"final: {final}  ({FLAGS.workdir}/results.json)")


if __name__ == "__main__":
    app.run(main)
