"""Batches made ready on a background thread while the device runs the current steps: the loop's and
evaluation's feed, so the device never waits for the host to assemble, look up features for or transfer
the next batch.

The items come in the order the wrapped iterator yields them (a pure function of seed, phase and step),
so prefetching changes no result; only how far ahead the host works (`depth` items).
"""

import queue
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

_ITEM, _END, _ERROR = "item", "end", "error"


class Prefetch(Generic[T]):
    """Iterates `items`, computed up to `depth` ahead on a daemon thread; an error there is raised here,
    at the item it would have been. `close()` stops the thread (also when the loop stops early)."""

    def __init__(self, items: Iterator[T], depth: int = 2):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, args=(items,), name="prefetch", daemon=True)
        self._thread.start()

    def _put(self, entry: tuple) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self, items: Iterator[T]) -> None:
        try:
            for item in items:
                if not self._put((_ITEM, item)):
                    return
            self._put((_END, None))
        except BaseException as error:  # handed to the consumer, raised where it reads
            self._put((_ERROR, error))

    def __iter__(self) -> "Prefetch[T]":
        return self

    def __next__(self) -> T:
        kind, value = self._queue.get()
        if kind == _ERROR:
            raise value
        if kind == _END:
            raise StopIteration
        return value

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self) -> "Prefetch[T]":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
