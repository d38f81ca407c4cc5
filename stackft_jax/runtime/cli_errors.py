"""One error boundary per command: a user's mistake ends in one line and a documented exit status.

Where a mistake is found, it is raised as a typed error whose message names the config key or the
file:line and what to do; each command's entry point wraps its work in `guarded` once, which prints that
message as `error: ...` and exits with its status. Anything else is a bug in stackft_jax: its traceback
is printed, with a line saying so.

Exit statuses (README, Troubleshooting):
    0    done
    1    data or model: a data file, model folder or checkpoint the run cannot use; a config file that
         does not load (its syntax, an exception in it or in its get_config); a non-finite loss;
         a full disk; a read-only folder; a run stopped by SIGTERM (saved: rerun the same command to resume)
    2    usage or config: a flag, config key or grid; a workdir bound to another config or data, or in
         use; an output folder the command did not create
    70   a bug in stackft_jax (the traceback is printed)
    130  Ctrl-C (saved where a checkpoint could be written: rerun the same command to resume)
"""

import errno
import functools
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

EXIT_DATA = 1
EXIT_USAGE = 2
EXIT_BUG = 70  # sysexits.h EX_SOFTWARE
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C

RESUME_HINT = "rerun the same command to resume from the last checkpoint"


class UserError(Exception):
    """A mistake the user fixes; the message says where (config key, file:line) and what to do."""

    exit_code = EXIT_DATA


class UsageError(UserError, ValueError):
    """A flag, config or workdir that cannot be used as given (exit 2)."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """A config problem the user fixes on the command line; the command prints it as one line, exit 2."""


class ConfigFileError(UserError, ValueError):
    """A config file Python cannot run as one: its syntax, an exception or a missing import in it or in
    its get_config, a get_config that returns no ConfigDict, a file that is no config (exit 1, like a data
    file the run cannot use); the message names the file and line."""

    exit_code = EXIT_DATA


class DataError(UserError, ValueError):
    """A data file, model folder or checkpoint that cannot be used (exit 1)."""

    exit_code = EXIT_DATA


def refuse_to_replace(flag: str, path: str | Path, *, overwrite: bool) -> None:
    """A command's output `--flag=path` must not hold anything already (a non-empty file, a folder with
    entries) unless `overwrite`: nothing a user saved is lost to a repeated command."""
    target = Path(path)
    occupied = (target.is_file() and target.stat().st_size > 0) or (target.is_dir() and any(target.iterdir()))
    if occupied and not overwrite:
        raise UsageError(f"--{flag}={path} exists and is not empty: pass --overwrite to replace it")


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing with a mistyped or malformed flag as one `error:` line and exit 2 (absl's
    own parser exits 1, the status of a data error)."""
    from absl import flags

    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        print(f"error: {error} (--help lists the flags)", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def exit_code_of(error: BaseException) -> int | None:
    """The exit status of a user's mistake, or None for a bug."""
    from absl import app

    if isinstance(error, UserError):
        return error.exit_code
    if isinstance(error, app.UsageError):  # a missing or unexpected flag
        return EXIT_USAGE
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    # Stops whose message is complete: a lost file, a non-finite loss (loop.py names step and checkpoint).
    if isinstance(error, FileNotFoundError | FloatingPointError):
        return EXIT_DATA
    if _disk_full(error) is not None:
        return EXIT_DATA
    if isinstance(error, PermissionError) or (isinstance(error, OSError) and error.errno == errno.EROFS):
        return EXIT_DATA  # a read-only folder or file the command was pointed at
    return None


_NO_SPACE = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))  # "No space left on device", ...


def _disk_full(error: BaseException) -> str | None:
    """The file a full disk refused, "" when unnamed; None when `error` is no full disk. Python raises
    OSError(ENOSPC); orbax's tensorstore writes raise ValueError("RESOURCE_EXHAUSTED: ... Failed
    writing: "FILE" ... No space left on device")."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return str(error.filename or "")
        if any(text in str(error) for text in _NO_SPACE):
            written = re.search(r'Failed writing: "([^"]+)"', str(error))
            return written[1] if written else ""
        error = error.__cause__ or error.__context__
    return None


def disk_full(error: BaseException) -> bool:
    """Whether `error` (or what caused it) is a full disk."""
    return _disk_full(error) is not None


def message_of(error: BaseException) -> str:
    from absl import app

    if isinstance(error, app.UsageError):
        return f"{error} (--help lists the flags)"
    if isinstance(error, KeyboardInterrupt):
        return f"interrupted (Ctrl-C); {RESUME_HINT}"
    full = _disk_full(error)
    if full is not None:
        where = f" writing {full}" if full else ""
        return f"the disk is full{where}; free space, then {RESUME_HINT}"
    if isinstance(error, FileNotFoundError) and error.filename:  # raised by the OS, not by a check
        return f"no such file or folder: {error.filename}"
    if isinstance(error, OSError) and exit_code_of(error) == EXIT_DATA and error.filename:
        return f"{error.filename}: {error.strerror} (check its permissions, or choose another path)"
    return str(error)


T = TypeVar("T")


def _flush_logs() -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()


def guarded(main: Callable[..., T]) -> Callable[..., T]:
    """`main` with the boundary around it: a user's mistake prints `error: <message>` (one line per
    line of the message, no traceback) and exits with its status; a bug prints its traceback, says it
    is one, and exits 70. SystemExit (absl's usage errors, preemption) passes through."""

    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return main(*args, **kwargs)
        except SystemExit as stop:
            # A run stopped on a signal after saving: its message, and the status the signal means.
            if isinstance(stop.code, str) and hasattr(stop, "exit_code"):
                _flush_logs()
                print(stop.code, file=sys.stderr)
                sys.exit(stop.exit_code)
            raise
        except BrokenPipeError:
            # The reader of our output went away (`... --status | head`): nothing to report. Point
            # stdout at /dev/null so that the interpreter's last flush does not fail again.
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):  # stdout is no file (a notebook, a test's capture)
                pass
            sys.exit(EXIT_DATA)
        except BaseException as error:  # noqa: BLE001 - the boundary: classified below
            _flush_logs()  # what was logged before the message comes before it
            code = exit_code_of(error)
            if code is None:
                traceback.print_exc()
                print(
                    f"error: a bug in stackft_jax ({type(error).__name__}: {error}); please report it "
                    "with the traceback above and the command line",
                    file=sys.stderr,
                )
                sys.exit(EXIT_BUG)
            print(f"error: {message_of(error)}", file=sys.stderr)
            sys.exit(code)

    return wrapper
