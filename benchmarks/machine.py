"""What every benchmark records about where it ran, and how it writes its JSON."""

import json
import os
import platform
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages: other processes on the same cores distort timings."""
    return [round(x, 2) for x in os.getloadavg()]


def machine_info() -> dict:
    import jax

    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_available": len(os.sched_getaffinity(0)),
        "load_average_1_5_15": load_average(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jax_devices": [str(d) for d in jax.devices()],
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def write_json(path: str | Path, payload: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    print(f"wrote {path}")
    return path


def finish(benchmark: str, args: Any, machine: dict, results: dict, table: str, **extra: Any) -> dict:
    """Prints the table, records the load at the end and writes `args.out`: what the table-printing
    benchmarks share. Returns the payload (keys: benchmark, machine, args, `extra`, results,
    table_markdown)."""
    print(table)
    machine["load_average_1_5_15_end"] = load_average()
    payload = {
        "benchmark": benchmark,
        "machine": machine,
        "args": vars(args),
        **extra,
        "results": results,
        "table_markdown": table,
    }
    write_json(args.out, payload)
    return payload
