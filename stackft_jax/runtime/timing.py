"""Where a run's wall time goes: named phases of the run, and JAX's compilation, in WORKDIR/timings.json.

`RunTimer.phase(name)` times a block exclusively: time spent in a phase nested inside it, or compiling,
is not counted twice. Compilation is what JAX reports through `jax.monitoring` time spans: tracing to a
jaxpr, lowering to MLIR and the XLA compilation (or its load from the persistent compilation cache),
whichever block it happened in (a jitted step compiles on its first call). Spans nested in each other
(a jit traced inside another's trace) are counted once. benchmarks/time_to_result.py reads the file.
"""

import contextlib
import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax

COMPILE_EVENTS = frozenset(
    {
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    }
)
COMPILATION = "compilation"
FILE_NAME = "timings.json"


class RunTimer:
    """Seconds per phase of one process's run; a context manager that listens to JAX while open."""

    def __init__(self) -> None:
        self.started_unix = time.time()
        self._started = time.perf_counter()
        self.seconds: dict[str, float] = defaultdict(float)
        self._stack: list[str] = []
        self._compile_spans: list[tuple[float, float]] = []
        self._lock = threading.Lock()

    def __enter__(self) -> "RunTimer":
        jax.monitoring.register_event_time_span_listener(self._on_span)
        return self

    def __exit__(self, *exc_info) -> None:
        jax.monitoring.unregister_event_time_span_listener(self._on_span)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Adds the block's wall time to `name`, less what nested phases and compilation took."""
        with self._lock:
            parent = self._stack[-1] if self._stack else None
            self._stack.append(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            with self._lock:
                self._stack.pop()
                self.seconds[name] += elapsed
                if parent is not None:
                    self.seconds[parent] -= elapsed

    def _on_span(self, event: str, start: float, end: float, **kwargs: Any) -> None:
        if event not in COMPILE_EVENTS:
            return
        with self._lock:
            new = (end - start) - sum(
                max(0.0, min(end, e) - max(start, s)) for s, e in self._compile_spans if e > start
            )
            self._compile_spans.append((start, end))
            if new <= 0:
                return
            self.seconds[COMPILATION] += new
            if self._stack:
                self.seconds[self._stack[-1]] -= new

    def record(self) -> dict[str, Any]:
        """`total_s` since the timer started; `seconds` per phase, `other` being what no phase covered."""
        total = time.perf_counter() - self._started
        seconds = {name: round(value, 3) for name, value in sorted(self.seconds.items())}
        seconds["other"] = round(total - sum(self.seconds.values()), 3)
        return {"started_unix": self.started_unix, "total_s": round(total, 3), "seconds": seconds}

    def write(self, workdir: str | Path) -> Path:
        path = Path(workdir) / FILE_NAME
        path.write_text(json.dumps(self.record(), indent=2) + "\n")
        return path
