"""What a command prints besides its results: our INFO lines, real warnings, no third-party chatter.

`setup()` is called once by each command's entry point (main, experiment), after flags are parsed:
- absl's and orbax's INFO lines are internals: WARNING and above only;
- an unreadable checkpoint (checkpointing.py moves it aside with one warning) leaves orbax's other reads
  of it running: each then fails into a closed event loop, and Python prints the orphan's traceback
  ("Exception ignored in: <coroutine ... _read_array_index_and_device_put>", "RuntimeError: Event loop
  is closed" from call_soon_threadsafe): some 230 tracebacks and 8,000 lines for MiniLM-L6. Exactly
  those are dropped (counted at DEBUG); every other exception prints as before;
- orbax's ERROR log of a failed background write (with its traceback) duplicates the exception it
  raises again in the main thread (a full disk: cli_errors.py's one line): dropped.
"""

import logging
import sys
import types
from pathlib import Path

log = logging.getLogger(__name__)

# Loggers whose INFO lines are internals (absl's own, orbax's per-save lines).
_QUIET_TO_WARNING = ("absl", "orbax", "jax._src.distributed", "jax._src.compilation_cache")


def _orbax_coroutine(obj: object) -> bool:
    return isinstance(obj, types.CoroutineType) and "orbax" in obj.cr_code.co_filename


def _callback_into_closed_loop(exc_type: type, value: BaseException, tb: types.TracebackType | None) -> bool:
    """A tensorstore read finishing after the restore that awaited it was abandoned: its callback
    (`loop.call_soon_threadsafe`) meets the closed loop; nothing is left to receive it."""
    if exc_type is not RuntimeError or str(value) != "Event loop is closed":
        return False
    names = []
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return "call_soon_threadsafe" in names


def _install_orphan_filters() -> None:
    """Both reach Python as unraisable exceptions (the read's coroutine garbage-collected with its
    error; tensorstore's callback, with no object)."""
    previous = sys.unraisablehook

    def unraisablehook(unraisable) -> None:
        if _orbax_coroutine(unraisable.object) or _callback_into_closed_loop(
            unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback
        ):
            log.debug("dropped an abandoned checkpoint read's error: %r", unraisable.exc_value)
            return
        previous(unraisable)

    sys.unraisablehook = unraisablehook


def _not_a_relayed_orbax_error(record: logging.LogRecord) -> bool:
    """Orbax logs a background write's exception, traceback and all, and raises it again in the thread
    that waits for the write, where the command's boundary reports it: the log is a duplicate. So are
    its logs of a full disk under async checkpointing ("Failed to run ... Commit operations", "Save
    Finalize thread ... failed", each with the tensorstore traceback): the boundary's one line says it."""
    from stackft_jax.runtime import cli_errors  # cli_errors imports this module

    if "orbax" not in record.pathname:
        return True
    if "raised an exception" in record.getMessage():
        return False
    error = record.exc_info[1] if record.exc_info else None
    return error is None or not cli_errors.disk_full(error)


def _not_an_item_without_metadata(record: logging.LogRecord) -> bool:
    """Restoring one item of a checkpoint (checkpointing.read_phase_end reads `<phase_end>/params`) makes
    orbax look for checkpoint metadata in the item's folder, where it never is, and warn: the metadata
    is one level up. Dropped when it is there, so a healthy checkpoint restores without a warning."""
    if "orbax" not in record.pathname or not str(record.msg).startswith("Metadata file does not exist"):
        return True
    missing = Path(str(record.args[0])) if record.args else None
    return missing is None or not (missing.parent.parent / missing.name).exists()


def setup() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for name in _QUIET_TO_WARNING:
        logging.getLogger(name).setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_not_a_relayed_orbax_error)
        handler.addFilter(_not_an_item_without_metadata)
    _install_orphan_filters()
