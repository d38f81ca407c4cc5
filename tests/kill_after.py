"""The main command, sent a signal right after one step: SIGKILL, a test's stand-in for a host that dies
at any moment (its checkpoint of that step, if one is due, written first); or SIGINT / SIGTERM, a
Ctrl-C or a preemption at a chosen step however loaded the machine is. Installed by the tests, so the
library's step loop checks for no test hook:

    python tests/kill_after.py PHASE:STEP[:SIGINT|:SIGTERM] --config=... --workdir=...
"""

import functools
import os
import runpy
import signal
import sys
from pathlib import Path

sys.path.remove(str(Path(__file__).resolve().parent))  # tests/ is this script's folder, not a package root

from stackft_jax.training import loop, train  # noqa: E402


class KillAfter(loop.LoopObserver):
    def __init__(self, where: str):
        phase, step, *name = where.split(":")
        self.phase, self.step = phase, int(step)
        self.signal = signal.Signals[name[0]] if name else signal.SIGKILL

    def step_ended(self, phase: str, step: int) -> None:
        if (phase, step) == (self.phase, self.step):
            os.kill(os.getpid(), self.signal)


if __name__ == "__main__":
    # A shell without job control starts background commands with SIGINT ignored, and Python then keeps
    # it ignored: a suite launched with `&` would see this run ignore its own Ctrl-C and finish. A
    # terminal's Ctrl-C reaches a foreground process, whose SIGINT handler is Python's own.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    train.run = functools.partial(train.run, observer=KillAfter(sys.argv.pop(1)))
    runpy.run_module("stackft_jax.main", run_name="__main__", alter_sys=True)
