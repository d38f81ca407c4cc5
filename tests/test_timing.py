"""RunTimer: exclusive phase times, compilation taken out of the phase it happened in, and a record
whose parts add up to its total."""

import json

import jax
import jax.numpy as jnp
import pytest

from stackft_jax.runtime import timing


class _Clock:
    """time.perf_counter for timing.py that moves only when the test says: the phases' seconds are then
    exact whatever else the machine is doing (real sleeps overshoot on a loaded machine)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(timing, "time", fake)
    return fake


def test_nested_phases_are_counted_once(clock):
    with timing.RunTimer() as timer:
        with timer.phase("outer"):
            clock.sleep(0.2)
            with timer.phase("inner"):
                clock.sleep(0.3)
    assert timer.seconds["inner"] == pytest.approx(0.3)
    assert timer.seconds["outer"] == pytest.approx(0.2)


def test_compilation_is_taken_out_of_the_phase_that_compiled(clock, tmp_path):
    with timing.RunTimer() as timer:
        with timer.phase("train_steps"):
            clock.sleep(0.5)  # of which JAX reports 0.4 s compiling
            jax.monitoring.record_event_time_span("/jax/core/compile/backend_compile_duration", 3.0, 3.4)
    assert timer.seconds[timing.COMPILATION] == pytest.approx(0.4)
    assert timer.seconds["train_steps"] == pytest.approx(0.1)
    record = json.loads(timer.write(tmp_path).read_text())
    parts = record["seconds"]
    assert set(parts) == {"train_steps", timing.COMPILATION, "other"}
    assert sum(parts.values()) == pytest.approx(record["total_s"], abs=0.01)


def test_a_real_compilation_is_heard():
    # A program no other test compiles (the shape is odd on purpose), so it is traced and compiled here.
    x = jnp.ones((3, 7, 11))
    with timing.RunTimer() as timer:
        with timer.phase("train_steps"):
            jax.block_until_ready(jax.jit(lambda a: jnp.tanh(a) @ a.transpose(0, 2, 1))(x))
    assert timer.seconds[timing.COMPILATION] > 0


def test_spans_inside_other_spans_are_counted_once():
    with timing.RunTimer() as timer:
        jax.monitoring.record_event_time_span("/jax/core/compile/jaxpr_trace_duration", 10.0, 14.0)
        jax.monitoring.record_event_time_span("/jax/core/compile/jaxpr_trace_duration", 11.0, 12.0)
        jax.monitoring.record_event_time_span("/jax/core/compile/backend_compile_duration", 13.0, 15.0)
        jax.monitoring.record_event_time_span("/jax/some/other_event", 0.0, 100.0)
    assert timer.seconds[timing.COMPILATION] == pytest.approx(5.0)
    # Closed: later spans are not heard.
    jax.monitoring.record_event_time_span("/jax/core/compile/backend_compile_duration", 20.0, 30.0)
    assert timer.seconds[timing.COMPILATION] == pytest.approx(5.0)
