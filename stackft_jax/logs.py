"""What a command prints besides its results: our INFO lines, third-party warnings, no third-party chatter.

absl, orbax and asyncio log at INFO or on every retried read; a user needs our own progress lines and
real warnings. `setup()` is called once by each command's entry point, after flags are parsed.
"""

import logging

# Loggers whose INFO lines are internals (absl's own, orbax's per-save lines).
_QUIET_TO_WARNING = ("absl", "orbax", "jax._src.distributed", "jax._src.compilation_cache")


def setup() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for name in _QUIET_TO_WARNING:
        logging.getLogger(name).setLevel(logging.WARNING)
