"""Reading text data files line by line, with errors that name the file and line."""

from collections.abc import Iterator
from pathlib import Path

from stackft_jax.cli_errors import DataError


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
