"""The store as the web service sees it: read-only, opened for each computation and closed at once, and
every result cached until the store's files change.

A page asks for a figure; the cache answers at once with the last result, and when the store changed
since, one background thread recomputes it (stale-while-revalidate), so no request waits for a 1M-job
audit after the first. `age_s` says how old the answer is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from headway.store import JobStore

T = TypeVar("T")


def store_version(path: Path) -> tuple[int, int, int, int]:
    """Changes whenever a writer committed: the file's and its WAL's mtime and size."""
    out: list[int] = []
    for p in (path, path.with_name(path.name + ".wal")):
        try:
            st = p.stat()
            out += [st.st_mtime_ns, st.st_size]
        except FileNotFoundError:
            out += [0, 0]
    return (out[0], out[1], out[2], out[3])


@dataclass(slots=True)
class _Entry:
    value: Any
    version: tuple[int, int, int, int]
    computed_at: float
    refreshing: bool = False


class StoreView:
    """Cached read-only computations over one store file."""

    def __init__(self, path: Path, *, wait_s: float = 10.0) -> None:
        self.path = path
        self.wait_s = wait_s  # a writer holds the file: wait this long for it (the daemon's flush is short)
        self._cache: dict[Hashable, _Entry] = {}
        self._lock = threading.Lock()
        self.opened_at: float | None = None  # last time the store was read
        self.errors = 0

    def _compute(self, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        with JobStore(self.path, read_only=True, wait=self.wait_s, on_wait=lambda _m: None) as store:
            value = fn(store.con)
        self.opened_at = time.time()
        return value

    def get(self, key: Hashable, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> tuple[T, float]:
        """`fn(con)`'s value and its age in seconds; computed now only when never computed before."""
        version = store_version(self.path)
        with self._lock:
            entry = self._cache.get(key)
            stale = entry is not None and entry.version != version and not entry.refreshing
            if stale:
                assert entry is not None
                entry.refreshing = True
        if entry is None:
            value = self._compute(fn)
            with self._lock:
                self._cache[key] = _Entry(value, version, time.time())
                if len(self._cache) > 512:  # user pages, decision pages: keep the newest
                    for k in list(self._cache)[: len(self._cache) - 512]:
                        del self._cache[k]
            return value, 0.0
        if stale:
            threading.Thread(target=self._refresh, args=(key, fn, version), daemon=True).start()
        return entry.value, time.time() - entry.computed_at

    def _refresh(self, key: Hashable, fn: Callable[[duckdb.DuckDBPyConnection], Any], version: Any) -> None:
        try:
            value = self._compute(fn)
        except Exception:  # a writer holding it longer: keep the old value, try on the next request
            self.errors += 1
            with self._lock:
                if (entry := self._cache.get(key)) is not None:
                    entry.refreshing = False
            return
        with self._lock:
            self._cache[key] = _Entry(value, version, time.time())

    def age_s(self) -> float | None:
        """Seconds since the store was last written (its files' mtime)."""
        v = store_version(self.path)
        newest = max(v[0], v[2])
        return None if newest == 0 else max(time.time() - newest / 1e9, 0.0)
