"""What a run leaves for people: metrics.jsonl, TensorBoard events, results.json, predictions/.

Only process 0 writes. metrics.jsonl holds one JSON object per evaluation; on resume, records newer
than the restored checkpoint are dropped first, so an interrupted run's file ends identical to an
uninterrupted one's."""

import json
import logging
import math
import os
import struct
from pathlib import Path
from typing import Any

import jax

from stackft_jax.runtime import records
from stackft_jax.training import prediction_files

log = logging.getLogger(__name__)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def json_safe(value: Any) -> Any:
    """NaN and inf (an undefined metric) become null: JSON has no NaN."""
    if isinstance(value, float):
        return _finite_or_none(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def train_scalars(workdir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """The `train/...` scalars a run logged to TensorBoard (loss, gradient and update norms by part, ...)
    as {name: [(global step, value), ...]}, read from WORKDIR/tensorboard's event files (TFRecords of
    Event protos); a resumed run's repeated steps keep their last value."""
    from tensorboardX.proto import event_pb2

    scalars: dict[str, dict[int, float]] = {}
    for events in sorted((Path(workdir) / "tensorboard").glob("events.out.tfevents.*")):
        data = events.read_bytes()
        offset = 0
        while offset + 12 <= len(data):  # length (8 bytes), its CRC (4), the record, its CRC (4)
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            record = data[offset + 12 : offset + 12 + length]
            offset += 12 + length + 4
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                if value.tag.startswith("train/"):
                    scalars.setdefault(value.tag.removeprefix("train/"), {})[event.step] = value.simple_value
    return {name: sorted(by_step.items()) for name, by_step in scalars.items()}


class RunReport:
    def __init__(self, workdir: str | Path):
        self.workdir = Path(workdir)
        self.enabled = jax.process_index() == 0
        self.metrics_path = self.workdir / "metrics.jsonl"
        self._tb = None
        # Damage is refused before any work; a last line cut by a kill goes before anything is appended.
        if self.enabled and self.metrics_path.exists():
            written, cut = records.read_jsonl(self.metrics_path, records.FIX_METRICS)
            if cut:
                log.warning("%s: its last line was cut mid-write (a killed run); left out", self.metrics_path)
                self._write_records(written)

    @property
    def tensorboard(self):
        if self._tb is None and self.enabled:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.workdir / "tensorboard"))
        return self._tb

    def records(self) -> list[dict[str, Any]]:
        """The evaluations metrics.jsonl holds; damage is one line naming the file and line
        (records.py), a last line cut by a kill mid-write is left out."""
        if not self.metrics_path.exists():
            return []
        return records.read_jsonl(self.metrics_path, records.FIX_METRICS)[0]

    def _write_records(self, kept: list[dict[str, Any]]) -> None:
        tmp = self.metrics_path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        os.replace(tmp, self.metrics_path)

    def keep_records(self, keep) -> None:
        """Rewrites metrics.jsonl with only the records for which `keep(record)` is true, in training
        order (a phase run again after its boundary checkpoint was lost appends after later phases)."""
        if not self.enabled or not self.metrics_path.exists():
            return
        self._write_records(sorted((r for r in self.records() if keep(r)), key=lambda r: r["global_step"]))

    def sort_records(self) -> None:
        self.keep_records(lambda record: True)

    def eval(self, *, phase: str, step: int, global_step: int, split: str, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        record = {
            "phase": phase,
            "step": step,
            "global_step": global_step,
            "split": split,
            **{k: _finite_or_none(v) for k, v in metrics.items()},
        }
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        for name, value in metrics.items():
            self.tensorboard.add_scalar(f"{split}/{name}", value, global_step)

    def train(self, *, global_step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        for name, value in metrics.items():
            self.tensorboard.add_scalar(f"train/{name}", value, global_step)

    def results(self, results: dict[str, Any]) -> None:
        """Writes results.json; a final loss that is not finite is no result (FloatingPointError, exit
        1): nothing then reads the run as finished (predict, export, ensembles, a grid's report)."""
        for split, scores in results.get("final", {}).items():
            loss = scores.get("loss")
            if loss is not None and not math.isfinite(loss):
                raise FloatingPointError(
                    f"{self.workdir}: the final {split} loss is {loss}: the scored parameters give "
                    "non-finite outputs (a diverged run, or parameters damaged on disk), so results.json "
                    "is not written; rerun in a new --workdir (with a lower learning rate if it diverged)"
                )
        if not self.enabled:
            return
        tmp = self.workdir / "results.json.tmp"
        tmp.write_text(json.dumps(json_safe(results), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.workdir / "results.json")

    def predictions(self, split: str, records: list[dict[str, Any]]) -> None:
        """WORKDIR/predictions/<split>.jsonl (predictions.py)."""
        if self.enabled:
            prediction_files.write(prediction_files.path(self.workdir, split), records)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
