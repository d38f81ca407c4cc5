"""Reading text data files line by line, with errors that name the file and line."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stackft_jax.runtime.cli_errors import DataError


def decoded_lines(path: Path) -> Iterator[str]:
    """The file's lines as text (line endings kept), decoded one by one so that bad bytes are reported
    at their line; the first line drops a UTF-8 BOM (GLUE's MRPC files start with one)."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{path}:{number}: not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1}); "
                    "convert the file to UTF-8"
                ) from None


def json_object(line: str, where: str) -> dict[str, Any] | None:
    """The JSON object a line holds, or None for a line that does not start with `{` (plain text);
    a line that starts with `{` but is not one JSON object is an error at `where`."""
    if not line.lstrip().startswith("{"):
        return None
    try:
        value = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: not a JSON object ({e.msg} at column {e.colno})") from None
    if not isinstance(value, dict):
        raise DataError(f"{where}: not a JSON object")
    return value


def first_line(path: Path) -> str | None:
    """The file's first non-blank line (None: no such line); a missing file or bad bytes are errors."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    return next((line for line in decoded_lines(path) if line.strip()), None)
