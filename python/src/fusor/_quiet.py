"""The requests of a serving process, counted where a fusor-worker on the same machine reads them.

A worker started with ``--quiet-file PATH`` times kernels between requests: it waits until none runs, and
takes a slice of samples again when one started meanwhile (a sample taken beside a request measures the
request's load, and a tune on a serving machine would end unconfirmed). The file holds two native 64-bit
counters: the requests running now, and the requests started so far.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import threading
from pathlib import Path
from types import TracebackType
from typing import Iterator, Optional, Type, Union

_LAYOUT = struct.Struct("=QQ")


class Requests:
    """The counters in `path` (created, 16 bytes), kept by ``with requests:`` around each request."""

    def __init__(self, path: Union[str, os.PathLike]):
        self.path = Path(path)
        with open(self.path, "wb") as f:
            f.write(bytes(_LAYOUT.size))
        self._file = open(self.path, "r+b")
        self._map = mmap.mmap(self._file.fileno(), _LAYOUT.size)
        self._lock = threading.Lock()
        self._running = self._started = 0
        self._mine = threading.local()  # .depth: the requests this thread is in

    def __enter__(self) -> "Requests":
        self._mine.depth = getattr(self._mine, "depth", 0) + 1
        self._count(+1)
        return self

    def __exit__(self, kind: Optional[Type[BaseException]], value: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self._mine.depth -= 1
        self._count(-1)

    def _count(self, change: int) -> None:
        with self._lock:
            self._running += change
            self._started += max(0, change)
            _LAYOUT.pack_into(self._map, 0, self._running, self._started)

    @contextlib.contextmanager
    def aside(self) -> Iterator[None]:
        """Within this thread's request, a stretch that waits for the worker (a tune asked for ahead): not
        counted as running, or the worker would hold its jobs until the request ends; its end counts as a
        request starting. Outside a request, nothing changes."""
        if not getattr(self._mine, "depth", 0):
            yield
            return
        self._count(-1)
        try:
            yield
        finally:
            self._count(+1)
