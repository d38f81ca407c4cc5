"""Frozen-backbone features, computed once per split and read back for every batch.

In a phase whose backbone is frozen and runs without dropout (`phase1.backbone_dropout=False`), the
backbone maps an example to the same outputs at every step. With `phase1.feature_cache=True`,
`loop.run_phase` runs it once over the train and dev splits and then trains (and evaluates) the head
on the stored outputs, so a step costs the head alone. Batches keep the example order of
`batching.train_batches` and their length bucket; the head's dropout keys are those of the
recomputing run (a deterministic backbone draws none), so the result matches recomputing up to float
rounding (the backbone saw other padding lengths when the cache was built).

Stored per example, at its real length only (memory grows with real tokens, not padding):
  hidden_states.bin  [tokens, layers, hidden]: the last layer, or with `model.scalar_mix` the
                     embedding output and every layer (what the scalar mix mixes); example i is rows
                     offsets[i]:offsets[i + 1], examples concatenated in dataset order
  pooled.bin         [examples, hidden]: the pooler output
  meta.json          shapes, dtype and the fingerprint: a hash of everything that decides the stored
                     bits (backbone weights, architecture and compute dtype, the tokenized split,
                     all_layers, storage dtype, and the batch shapes and devices the backbone ran on),
                     never of the seed or the head: with pretrained weights, every seed and head of a
                     grid reads the same features

Where: raw `np.memmap` files in WORKDIR/feature_cache/<phase>/<split>/, or with
`feature_cache_dir` in <feature_cache_dir>/<fingerprint>/ (content-addressed: any number of
runs, phases and processes share one folder safely), in `phase1.feature_cache_dtype`
(float32, or bfloat16 for half the bytes). Files rather than host arrays because all-layer caches
outgrow memory (17.5k QQP pairs x ~35 tokens x 7 layers x 384 x 4 bytes is ~6.6 GB); the OS keeps in
its page cache what fits, so a cache that fits costs no more than an in-memory one, and a resumed run
reopens the files instead of recomputing them. A cache is written to a temporary folder and renamed
when complete, so no reader sees it half-written; when another process renamed the same cache there
first (grid shards starting together), its copy is kept and ours discarded. One whose fingerprint
differs (other weights or data) is rebuilt, never read.
"""

import dataclasses
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
from flax import nnx

from stackft_jax.data import batching
from stackft_jax.models.adaptation import lora
from stackft_jax.runtime import sharding
from stackft_jax.training import checkpointing, steps

log = logging.getLogger(__name__)

DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
# Bump when the stored arrays change meaning, so old caches are rebuilt.
_VERSION = 2

Batch = dict[str, np.ndarray]


@dataclasses.dataclass
class FeatureCache:
    """One split's stored backbone outputs (read-only memmaps)."""

    hidden_states: np.ndarray  # [total real tokens, layers, hidden]
    pooled: np.ndarray  # [examples, hidden]
    offsets: np.ndarray  # [examples + 1] int64
    built: bool = False  # this process ran the backbone to write it (else it opened an existing one)

    @property
    def nbytes(self) -> int:
        return self.hidden_states.nbytes + self.pooled.nbytes

    def attach(self, batch: Batch) -> Batch:
        """Replaces the batch's `index` (each row's example) by those examples' features, padded with
        zeros to the batch's length bucket: `hidden_states` [batch, length, layers, hidden], `pooled`."""
        batch = dict(batch)
        rows = batch.pop("index")
        seq_len = batch["input_ids"].shape[1]
        hidden = np.zeros((len(rows), seq_len, *self.hidden_states.shape[1:]), self.hidden_states.dtype)
        for j, i in enumerate(rows):
            start, stop = self.offsets[i], self.offsets[i + 1]
            hidden[j, : stop - start] = self.hidden_states[start:stop]
        batch["hidden_states"] = hidden
        batch["pooled"] = np.asarray(self.pooled[rows])
        return batch


def open_or_build(
    directory: str | Path,
    ds: batching.Dataset,
    params: Any,
    *,
    graphdef: nnx.GraphDef,
    mesh: jax.sharding.Mesh,
    all_layers: bool,
    dtype: str,
    global_batch_size: int,
    buckets: tuple[int, ...],
    shared: bool = False,
) -> FeatureCache:
    """The cache in `directory` when it was built from these backbone weights and this split; else
    runs the backbone over `ds` (deterministic, in eval batches) and writes it there first. With
    `shared`, `directory` holds the caches of any runs, one folder per fingerprint."""
    if dtype not in DTYPES:
        raise ValueError(f"feature cache dtype {dtype!r}: choose one of {sorted(DTYPES)}")
    directory = Path(directory)
    started = time.time()
    fingerprint = _fingerprint(
        params,
        ds,
        graphdef=graphdef,
        all_layers=all_layers,
        dtype=dtype,
        batch_shapes=f"{global_batch_size}x{buckets} on {mesh.size} {mesh.devices.flat[0].platform}",
    )
    if shared:
        directory = directory / fingerprint
    meta = _read_meta(directory)
    action = "opened"
    if _any_process(meta is None or meta["fingerprint"] != fingerprint):
        features_fn = jax.jit(
            functools.partial(
                steps.features_step, graphdef=graphdef, all_layers=all_layers, dtype=DTYPES[dtype]
            ),
            in_shardings=(sharding.replicated(mesh), sharding.data_sharded(mesh)),
            out_shardings=sharding.data_sharded(mesh),
        )
        _build(
            directory,
            ds,
            params,
            fingerprint=fingerprint,
            features_fn=features_fn,
            mesh=mesh,
            global_batch_size=global_batch_size,
            buckets=buckets,
            dtype=DTYPES[dtype],
        )
        meta, action = _read_meta(directory), "built"
    cache = dataclasses.replace(_open(directory, meta, ds), built=action == "built")
    log.info(
        "feature cache %s: %d examples, %s tokens x layers x hidden, %.2f GiB %s, %s in %.1f s",
        directory,
        batching.num_rows(ds),
        cache.hidden_states.shape,
        cache.nbytes / 2**30,
        dtype,
        action,
        time.time() - started,
    )
    return cache


def _any_process(flag: bool) -> bool:
    """True when `flag` is true on any process. Every process runs the backbone's batches together,
    so all must build when one lacks the cache (a shared folder can gain it between their checks);
    those that had it keep theirs when publishing."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.array(flag))))


def _fingerprint(
    params: Any,
    ds: batching.Dataset,
    *,
    graphdef: nnx.GraphDef,
    all_layers: bool,
    dtype: str,
    batch_shapes: str,
) -> str:
    backbone = nnx.merge(graphdef, params).backbone
    # Dropout rates do not matter (the backbone runs deterministically); padded batch shapes and
    # devices change only float rounding, but a shared cache must match a per-run one bit for bit.
    architecture = dataclasses.replace(
        backbone.config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    h = hashlib.sha256(
        f"v{_VERSION}|all_layers={all_layers}|{dtype}|{architecture}|compute "
        f"{np.dtype(backbone.dtype).name}|{batch_shapes}".encode()
    )
    # A LoRA pair whose B is still zero adds exact zeros: left out, lp_lora's head phase shares one cache
    # across seeds (whose A differ) and with stack-and-finetune's phase 1.
    checkpointing.hash_leaves(h, params["backbone"], skip=lora.inert_leaves(params["backbone"]))
    # What the backbone reads; `segment_ids` (which text a token is from) only reaches the head, and
    # batches read it from the dataset, not from the cache.
    for array in (ds["input_ids"], ds["token_type_ids"], ds["lengths"]):
        h.update(f"{array.dtype}|{array.shape}".encode())
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:24]


def _read_meta(directory: Path) -> dict | None:
    path = directory / "meta.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _offsets(ds: batching.Dataset) -> np.ndarray:
    offsets = np.zeros(batching.num_rows(ds) + 1, np.int64)
    np.cumsum(ds["lengths"], out=offsets[1:])
    return offsets


def _open(directory: Path, meta: dict, ds: batching.Dataset) -> FeatureCache:
    dtype = DTYPES[meta["dtype"]]
    return FeatureCache(
        hidden_states=np.memmap(
            directory / "hidden_states.bin", dtype, "r", shape=tuple(meta["hidden_states_shape"])
        ),
        pooled=np.memmap(directory / "pooled.bin", dtype, "r", shape=tuple(meta["pooled_shape"])),
        offsets=_offsets(ds),
    )


def _build(
    directory: Path,
    ds: batching.Dataset,
    params: Any,
    *,
    fingerprint: str,
    features_fn,
    mesh: jax.sharding.Mesh,
    global_batch_size: int,
    buckets: tuple[int, ...],
    dtype: np.dtype,
) -> None:
    offsets = _offsets(ds)
    num_rows = batching.num_rows(ds)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f"{directory.name}.tmp"))
    try:
        hidden, pooled = None, None
        for batch in batching.eval_batches(ds, global_batch_size=global_batch_size, buckets=buckets):
            index = batch.pop("index")
            local = batching.process_slice(batch, jax.process_index(), jax.process_count())
            out = sharding.to_host(features_fn(params, sharding.put_batch(local, mesh)))
            states, pooled_out = np.asarray(out["hidden_states"]), np.asarray(out["pooled"])
            if hidden is None:  # shapes are known from the first batch
                shape = (int(offsets[-1]), *states.shape[2:])
                _check_disk_space(tmp, (np.prod(shape) + num_rows * shape[-1]) * dtype.itemsize)
                hidden = np.memmap(tmp / "hidden_states.bin", dtype, "w+", shape=shape)
                pooled = np.memmap(tmp / "pooled.bin", dtype, "w+", shape=(num_rows, shape[-1]))
            for row, i in enumerate(index):
                if i >= 0:  # -1: a padding row of the last batch
                    hidden[offsets[i] : offsets[i + 1]] = states[row, : offsets[i + 1] - offsets[i]]
            real = index >= 0
            pooled[index[real]] = pooled_out[real]
        if hidden is None:
            raise ValueError(f"feature cache {directory}: the split has no examples")
        hidden.flush()
        pooled.flush()
        meta = {
            "fingerprint": fingerprint,
            "dtype": next(name for name, d in DTYPES.items() if d == dtype),
            "hidden_states_shape": list(hidden.shape),
            "pooled_shape": list(pooled.shape),
        }
        del hidden, pooled
        (tmp / "meta.json").write_text(json.dumps(meta) + "\n")
        if directory.exists() and (_read_meta(directory) or {}).get("fingerprint") != fingerprint:
            shutil.rmtree(directory)  # a stale cache (other weights or data)
        _publish(tmp, directory, fingerprint)
    finally:  # renamed: nothing left; beaten by another process, or failed: discard ours
        shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, directory: Path, fingerprint: str) -> None:
    """Renames the complete cache `tmp` to `directory` in one step. Another process may have built
    the same cache meanwhile and renamed its copy there first (renaming onto a non-empty folder
    fails): theirs is kept, and the caller discards ours."""
    try:
        os.rename(tmp, directory)
    except OSError:
        if (_read_meta(directory) or {}).get("fingerprint") != fingerprint:
            raise
        log.info("feature cache %s: another process built it first, opening theirs", directory)


def _check_disk_space(directory: Path, nbytes: int) -> None:
    free = shutil.disk_usage(directory).free
    if nbytes > free:
        raise OSError(
            f"the feature cache needs {nbytes / 2**30:.1f} GiB in {directory}, {free / 2**30:.1f} GiB "
            "are free: set phase1.feature_cache_dtype='bfloat16', model.scalar_mix=False (one layer "
            "instead of all), or phase1.feature_cache=False"
        )
