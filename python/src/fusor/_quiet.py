"""The requests of a serving process, counted where a fusor-worker on the same machine reads them.

A worker started with ``--quiet-file PATH`` times kernels between requests: it waits until none runs, and
takes a slice of samples again when one started meanwhile (a sample taken beside a request measures the
request's load, and a tune on a serving machine would end unconfirmed). The file holds two native 64-bit
counters: the requests running now, and the requests started so far.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from pathlib import Path
from types import TracebackType
from typing import Optional, Type, Union

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

    def __enter__(self) -> "Requests":
        with self._lock:
            self._running += 1
            self._started += 1
            _LAYOUT.pack_into(self._map, 0, self._running, self._started)
        return self

    def __exit__(self, kind: Optional[Type[BaseException]], value: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        with self._lock:
            self._running -= 1
            _LAYOUT.pack_into(self._map, 0, self._running, self._started)

    @property
    def running(self) -> int:
        return self._running

    def close(self) -> None:
        self._map.close()
        self._file.close()
