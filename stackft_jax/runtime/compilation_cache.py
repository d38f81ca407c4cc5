"""JAX's persistent compilation cache: every run after the first loads its compiled programs from disk.

Where it lives, first that applies: `config.compilation_cache_dir` when it is a folder ("none" or ""
turns the cache off); when it is "auto" (the default), the JAX_COMPILATION_CACHE_DIR environment
variable, else `$STACKFT_JAX_CACHE/jax_compilation_cache`, else `~/.cache/stackft_jax/jax_compilation_cache`.
Entries are keyed by the program, the compiler and the devices, so runs that differ only in their seed
share them (loop.build_phase_step passes the dropout key as an argument for that reason). The folder
only grows; delete it to reclaim the space.
"""

import logging
import os
from pathlib import Path

import jax

log = logging.getLogger(__name__)

AUTO = "auto"
OFF = ("", "none")


def default_dir() -> Path:
    base = os.environ.get("STACKFT_JAX_CACHE", str(Path.home() / ".cache" / "stackft_jax"))
    return Path(base) / "jax_compilation_cache"


def resolve_dir(setting: str) -> Path | None:
    """The cache folder for `config.compilation_cache_dir`, or None when the cache is off."""
    if setting.strip().lower() in OFF:
        return None
    if setting != AUTO:
        return Path(setting).expanduser()
    from_env = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    return Path(from_env).expanduser() if from_env else default_dir()


def enable(setting: str) -> Path | None:
    """Points JAX's persistent cache at `resolve_dir(setting)`; call before the first compilation.

    JAX by default skips programs that compiled in under a second; a run has dozens of those (the
    optimizer's init, the dropout key, each eval bucket), so every program is cached unless the user
    set JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS.
    """
    directory = resolve_dir(setting)
    if directory is None:
        jax.config.update("jax_enable_compilation_cache", False)
        log.info("persistent compilation cache: off (config.compilation_cache_dir)")
        return None
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    log.info("persistent compilation cache: %s", directory)
    return directory
