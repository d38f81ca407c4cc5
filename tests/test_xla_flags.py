"""XLA:CPU defaults: added once, never over the user's own value, only for measured jaxlib releases."""

import jaxlib

from stackft_jax.runtime import xla_flags


def _this_release():
    return xla_flags._release(jaxlib.__version__)


def test_appends_to_existing_flags(monkeypatch):
    monkeypatch.setattr(xla_flags, "KNOWN_RELEASES", (_this_release(),))
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    assert xla_flags.apply_cpu_defaults(env) == list(xla_flags.CPU_FLAGS)
    assert env["XLA_FLAGS"].split() == ["--xla_force_host_platform_device_count=8", *xla_flags.CPU_FLAGS]
    assert xla_flags.apply_cpu_defaults(env) == []  # idempotent


def test_user_value_wins(monkeypatch):
    monkeypatch.setattr(xla_flags, "KNOWN_RELEASES", (_this_release(),))
    env = {"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type=dot"}
    assert xla_flags.apply_cpu_defaults(env) == []
    assert env["XLA_FLAGS"] == "--xla_cpu_experimental_ynn_fusion_type=dot"


def test_unmeasured_release_and_opt_out_leave_flags_alone(monkeypatch):
    monkeypatch.setattr(xla_flags, "KNOWN_RELEASES", ((0, 1),))
    env = {}
    assert xla_flags.apply_cpu_defaults(env) == [] and env == {}
    monkeypatch.setattr(xla_flags, "KNOWN_RELEASES", (_this_release(),))
    env = {xla_flags.OPT_OUT: "1"}
    assert xla_flags.apply_cpu_defaults(env) == [] and "XLA_FLAGS" not in env
