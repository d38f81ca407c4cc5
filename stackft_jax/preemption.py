"""When a run must stop early and save: SIGTERM (TPU preemption, `kill`, a scheduler), Ctrl-C and test kills.

One process: a SIGTERM handler sets a flag that the step loop reads after each step, and train.py once
more after each phase's boundary checkpoint (a signal during the phase's last evaluation or end
measurements comes after the loop's last look). Ctrl-C (SIGINT) sets the same flag while phases train
and save their boundaries (`sigint_saves`), so it saves like SIGTERM; a second Ctrl-C, or one before the
first phase or during final scoring, interrupts at once (cli_errors.py: exit 130, resume from the last
checkpoint).
Several processes: they must all save the same step, so the decision comes from JAX's preemption service
(`multihost_utils.reached_preemption_sync_point`), which turns a SIGTERM on any host into one agreed step
on every host.
"""

import contextlib
import os
import signal
from collections.abc import Iterator

import jax
from jax.experimental import multihost_utils

# Test hook: "PHASE:STEP" makes the process SIGKILL itself right after that step, to prove that a run
# killed at any moment resumes to the same result; "PHASE:STEP:SIGINT" (or SIGTERM) sends itself that
# signal instead, so a drill of Ctrl-C or preemption hits a chosen step however loaded the machine is.
KILL_AT_ENV = "STACKFT_JAX_KILL_AT"


class Preempted(SystemExit):
    """Raised after SIGTERM or Ctrl-C once a checkpoint is safely written; rerunning the command resumes.
    `exit_code`: the status the command exits with (1 after SIGTERM, 130 after Ctrl-C)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


# One flag per process: set by SIGTERM (or Ctrl-C in the step loop), read by every phase's loop. A fresh
# flag per phase would miss a SIGTERM that arrives in a later phase (the handler installed first keeps
# setting the first flag). "by": the signal that set it, for the message.
_SIGTERM = {"set": False, "by": "SIGTERM"}


def _on_sigterm(signum, frame) -> None:
    _SIGTERM["set"] = True
    _SIGTERM["by"] = "SIGTERM"


def _on_sigint(signum, frame) -> None:
    if _SIGTERM["set"]:  # a second Ctrl-C: stop now, from the last checkpoint
        raise KeyboardInterrupt
    _SIGTERM["set"] = True
    _SIGTERM["by"] = "Ctrl-C"
    print("\nCtrl-C: saving a checkpoint after this step (Ctrl-C again to stop at once)", flush=True)


def stopped_by() -> str:
    """The signal that set the flag: "SIGTERM" or "Ctrl-C"."""
    return _SIGTERM["by"]


@contextlib.contextmanager
def sigint_saves() -> Iterator[None]:
    """Within the block (train.py's phases), Ctrl-C sets the stop flag instead of raising
    KeyboardInterrupt at once; one process only, and only over Python's own SIGINT handler."""
    installable = jax.process_count() == 1 and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if installable:
        try:
            signal.signal(signal.SIGINT, _on_sigint)
        except ValueError:  # not the main thread
            installable = False
    try:
        yield
    finally:
        if installable:
            signal.signal(signal.SIGINT, signal.default_int_handler)


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


def stop_requested() -> bool:
    """Whether this one process was asked to stop (the flag); outside the step loop, where several
    processes could not agree on a step, always False for them."""
    return jax.process_count() == 1 and _SIGTERM["set"]


def acknowledge() -> None:
    """Handled: a rerun in this process (a notebook) starts clean."""
    _SIGTERM["set"] = False


def stopped(where: str) -> Preempted:
    """The stop after the flag's signal, once a checkpoint is saved at `where` ("phase2 step 7")."""
    by = stopped_by()
    acknowledge()
    return Preempted(
        f"{by}: checkpoint saved at {where}; rerun the same command to resume",
        exit_code=130 if by == "Ctrl-C" else 1,
    )


def signal_requested(phase: str, step: int) -> signal.Signals | None:
    """The signal KILL_AT_ENV asks for right after `step` of `phase` (None: none)."""
    where, _, name = os.environ.get(KILL_AT_ENV, "").partition(":SIG")
    if where != f"{phase}:{step}":
        return None
    return signal.Signals[f"SIG{name}"] if name else signal.SIGKILL
