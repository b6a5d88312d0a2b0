"""A dense set of job keys with per-key columns kept alongside, for the simulator's pending and running jobs.

Add and swap-remove are O(1) and move plain items; a snapshot reads contiguous slices of the columns
instead of gathering from million-row arrays. The float and integer columns (and the keys) are `array`s
seen by numpy through `shared`: the event loop reads and writes single items through the `array`
(plain floats and ints, several times cheaper than numpy scalars), vector code reads the numpy view.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from headway.policy.snapshot import I64


def shared(a: np.ndarray) -> tuple[array[Any], np.ndarray]:
    """`a` (float64, int64 or bool) as an `array` and a numpy view of the same memory."""
    code = "d" if a.dtype == np.float64 else "b" if a.dtype == np.bool_ else "q"
    buf = array(code, a.tobytes())
    return buf, np.frombuffer(buf, dtype=a.dtype)


def read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view (the owner keeps writing the original)."""
    v = a.view()
    v.setflags(write=False)
    return v


class JobSet:
    """Job keys with columns copied from per-job sources at `add` (see the module docstring)."""

    def __init__(
        self, size: int, sources: dict[str, np.ndarray], items: dict[str, Sequence[Any]] | None = None
    ) -> None:
        """`items`: the same values as some sources, as `array`s or lists sharing their memory or
        contents, read by `add` (a plain item is cheaper to read than a numpy scalar)."""
        size = max(size, 1)
        self.key_a, self.keys = shared(np.zeros(size, dtype=np.int64))
        self.pos = array("q", [-1]) * size
        self.n = 0
        self.sources = sources
        self.cols: dict[str, np.ndarray] = {}
        got = items or {}
        self._pairs: list[tuple[Any, Any]] = []  # (the column as written, its source as read)
        for name, src in sources.items():
            buf: Any
            if src.dtype == np.float64 or src.dtype == np.int64:
                buf, self.cols[name] = shared(np.zeros(size, dtype=src.dtype))
            else:
                buf = self.cols[name] = np.empty(size, dtype=src.dtype)
            self._pairs.append((buf, got.get(name, src)))
        # Read-only views of the whole buffers, made once: their slices are read-only too.
        self.ro = {name: read_only(buf) for name, buf in self.cols.items()}
        self.ro_keys = read_only(self.keys)

    def __contains__(self, key: int) -> bool:
        return self.pos[key] >= 0

    def add(self, key: int) -> int:
        i = self.n
        self.key_a[i] = key
        self.pos[key] = i
        for buf, src in self._pairs:
            buf[i] = src[key]
        self.n = i + 1
        return i

    def remove(self, key: int) -> int:
        """Remove `key`; returns the key moved into its slot (or -1)."""
        i = self.pos[key]
        last = self.n - 1
        moved = -1
        if i != last:
            moved = self.key_a[last]
            self.key_a[i] = moved
            self.pos[moved] = i
            for buf, _ in self._pairs:
                buf[i] = buf[last]
        self.pos[key] = -1
        self.n = last
        return moved

    def refresh(self, names: tuple[str, ...]) -> None:
        """Re-read columns from their sources (after a re-prediction)."""
        k = self.keys[: self.n]
        for name in names:
            self.cols[name][: self.n] = self.sources[name][k]

    def view(self) -> I64:
        return self.keys[: self.n]

    def check(self) -> None:
        """Invariants (tests): positions and keys agree, and every column equals its source."""
        k = self.keys[: self.n]
        assert len(set(k.tolist())) == self.n
        assert all(self.pos[x] == i for i, x in enumerate(k.tolist()))
        assert sum(1 for p in self.pos if p >= 0) == self.n
        for name, col in self.cols.items():
            src = self.sources[name][k]
            same = (col[: self.n] == src) | (_isnan(col[: self.n]) & _isnan(src))
            assert bool(np.all(same)), name


def _isnan(a: np.ndarray) -> np.ndarray:
    return np.isnan(a) if a.dtype == np.float64 else np.zeros(len(a), dtype=bool)
