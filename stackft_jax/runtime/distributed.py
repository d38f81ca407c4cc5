"""Multi-process start-up: one JAX process per host (TPU pods, GPU clusters, or several CPU processes).

`jax.distributed.initialize()` finds the cluster by itself on TPU pods, SLURM and Open MPI; elsewhere
the coordinator address, process count and id are given (flags or JAX_* environment variables, see
main.py). CPU processes exchange collectives through gloo, which needs no accelerator network.
"""

import jax


def initialize(
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
    given = {"num_processes": num_processes, "process_id": process_id}
    if coordinator_address and None in given.values():
        missing = [f"--{name}" for name, value in given.items() if value is None]
        raise ValueError(
            f"--coordinator_address={coordinator_address} needs {' and '.join(missing)} as well "
            "(or the environment variables JAX_NUM_PROCESSES / JAX_PROCESS_ID)"
        )
    # Only the CPU backend reads this; without it, CPU processes cannot run cross-process collectives.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id
    )
