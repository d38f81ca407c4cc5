"""The persistent compilation cache: where it lives, and that a second seed compiles nothing new."""

from pathlib import Path

import pytest

from stackft_jax.runtime import compilation_cache


def test_a_folder_in_the_config_key_wins_and_none_turns_the_cache_off(monkeypatch, tmp_path):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "from_env"))
    assert compilation_cache.resolve_dir(str(tmp_path / "mine")) == tmp_path / "mine"
    assert compilation_cache.resolve_dir("auto") == tmp_path / "from_env"
    assert compilation_cache.resolve_dir("none") is None
    assert compilation_cache.resolve_dir("") is None
    assert compilation_cache.resolve_dir("~/jax") == Path.home() / "jax"


def test_the_default_folder_is_under_the_stackft_jax_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("STACKFT_JAX_CACHE", str(tmp_path))
    assert compilation_cache.resolve_dir("auto") == tmp_path / "jax_compilation_cache"


def _entries(directory: Path) -> set[str]:
    return {p.name for p in directory.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_a_second_seed_of_the_same_config_compiles_nothing_new(run_cli, tmp_path):
    cache = tmp_path / "jax_cache"
    first = run_cli(tmp_path / "seed0", f"--config.compilation_cache_dir={cache}", "--config.seed=0")
    assert first.returncode == 0, first.stdout + first.stderr
    after_first = _entries(cache)
    # Every program of the run (train steps, eval buckets, optimizer init, ...) was written.
    assert len(after_first) >= 10, sorted(after_first)
    second = run_cli(tmp_path / "seed1", f"--config.compilation_cache_dir={cache}", "--config.seed=1")
    assert second.returncode == 0, second.stdout + second.stderr
    assert _entries(cache) - after_first == set()


@pytest.mark.slow
def test_none_writes_no_cache(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax_cache"))
    proc = run_cli(tmp_path / "run", "--config.compilation_cache_dir=none", "--config.phase2.num_steps=0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (tmp_path / "jax_cache").exists()
