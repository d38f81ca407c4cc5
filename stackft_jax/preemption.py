"""When a run must stop early and save: SIGTERM (TPU preemption, `kill`, a scheduler) and test kills.

One process: a SIGTERM handler sets a flag that the step loop reads after each step. Several processes:
they must all save the same step, so the decision comes from JAX's preemption service
(`multihost_utils.reached_preemption_sync_point`), which turns a SIGTERM on any host into one agreed step
on every host.
"""

import os
import signal

import jax
from jax.experimental import multihost_utils

# Test hook: "PHASE:STEP" makes the process SIGKILL itself right after that step, to prove that a run
# killed at any moment resumes to the same result.
KILL_AT_ENV = "STACKFT_JAX_KILL_AT"


class Preempted(SystemExit):
    """Raised after SIGTERM once a checkpoint is safely written; rerunning the command resumes."""


# One flag per process: set by SIGTERM, read by every phase's loop. A fresh flag per phase would miss a
# SIGTERM that arrives in a later phase (the handler installed first keeps setting the first flag).
_SIGTERM = {"set": False}


def _on_sigterm(signum, frame) -> None:
    _SIGTERM["set"] = True


def install_sigterm_flag() -> dict[str, bool]:
    """The process's SIGTERM flag, with its handler installed unless someone else's handler is. With
    several processes JAX's preemption service owns SIGTERM and the flag stays unset."""
    installable = (signal.SIG_DFL, None, _on_sigterm)
    if jax.process_count() == 1 and signal.getsignal(signal.SIGTERM) in installable:
        try:
            signal.signal(signal.SIGTERM, _on_sigterm)
        except ValueError:  # not the main thread (e.g. some notebook runners): keep the default
            pass
    return _SIGTERM


def should_stop(global_step: int) -> bool:
    """Whether to save and exit after `global_step` (counted across phases, so it only grows within a
    process, as the preemption service requires). Multi-process: every process calls this after every
    step and all get the same answer at the same step."""
    if jax.process_count() > 1:
        return multihost_utils.reached_preemption_sync_point(global_step)
    return _SIGTERM["set"]


def acknowledge() -> None:
    """Handled: a rerun in this process (a notebook) starts clean."""
    _SIGTERM["set"] = False


def kill_requested(phase: str, step: int) -> bool:
    return os.environ.get(KILL_AT_ENV, "") == f"{phase}:{step}"
