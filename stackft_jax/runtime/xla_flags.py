"""XLA:CPU flags that measured faster for BERT steps; applied before JAX creates its backends.

`--xla_cpu_experimental_ynn_fusion_type=` (empty) sends XLA:CPU's dots to its Eigen runtime instead of
YNNPACK fusions: on the 2-core Xeon of benchmarks/RESULTS.md the MiniLM eval step went from 1.25 s to
0.91 s and the full training step did not change. The flag is experimental and XLA aborts the process
on a flag it does not know, so it is added only for the jaxlib releases it was measured with, and
never over a value the user set. It only affects the CPU backend: TPU and GPU runs are unchanged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping

logger = logging.getLogger(__name__)

CPU_FLAGS = ("--xla_cpu_experimental_ynn_fusion_type=",)
# jaxlib (major, minor) releases whose XLA knows every flag in CPU_FLAGS (checked: 0.10.2).
KNOWN_RELEASES = ((0, 10),)
OPT_OUT = "STACKFT_JAX_NO_XLA_DEFAULTS"


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def apply_cpu_defaults(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Appends CPU_FLAGS to XLA_FLAGS (those the user has not set); returns what was added.

    Call before the first JAX computation (device listing included): XLA reads XLA_FLAGS once, when
    the first backend starts. Set STACKFT_JAX_NO_XLA_DEFAULTS=1 to leave XLA_FLAGS alone.
    """
    environ = os.environ if environ is None else environ
    if environ.get(OPT_OUT):
        return []
    import jaxlib

    if _release(jaxlib.__version__) not in KNOWN_RELEASES:
        logger.debug("jaxlib %s: XLA CPU defaults not applied (not measured)", jaxlib.__version__)
        return []
    current = environ.get("XLA_FLAGS", "")
    added = [flag for flag in CPU_FLAGS if flag.split("=")[0] not in current]
    if added:
        environ["XLA_FLAGS"] = " ".join([current, *added]).strip()
    return added
