"""Device mesh and data placement. Data parallel: parameters replicated, batch split on `data`.

The same code runs on one CPU, on virtual CPU devices, on a TPU VM's cores and on a multi-host pod,
where each process holds its contiguous share of the global batch."""

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"


def make_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.asarray(devices), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def data_sharded(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def global_batch_size(per_device_batch_size: int, mesh: Mesh) -> int:
    return per_device_batch_size * mesh.size


def put_batch(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """This process's rows of the global batch -> global arrays sharded over `data`."""
    # The whole dict in one call: on one process JAX makes it one device_put of every array, about 40%
    # less host time than a call per array, which the prefetch thread pays every step (RESULTS.md §14).
    return jax.make_array_from_process_local_data(data_sharded(mesh), local_batch)


def local_copy(leaf) -> np.ndarray:
    """A replicated array's copy on this process (also on multi-host meshes, where the global array is
    not addressable), or a host array as it is."""
    return np.asarray(leaf.addressable_data(0) if isinstance(leaf, jax.Array) else leaf)


def to_host(tree):
    """Fully replicated or sharded global arrays -> numpy on every process."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)
