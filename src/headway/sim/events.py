"""The simulator's event queue, in SimPy's shape: `schedule`, `peek`, `pop`, with typed events.

At one instant, ends come first (their GPUs free up and the predictor learns them), then arrivals, then
the policy's wake-ups; the scheduling pass runs after all of them. Arrivals come from the submit-sorted
jobs through a cursor, not the heap, so a million-job trace never sits in the heap at once. A wake-up
time asked for many times (a starvation deadline asked at every pass) is one heap entry with a count.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

END, ARRIVAL, WAKE = 0, 1, 2  # same-instant order


@dataclass(frozen=True, slots=True)
class Arrival:
    key: int


@dataclass(frozen=True, slots=True)
class End:
    """The end of job `key`'s run number `epoch` (a preempted run's end is stale: its epoch moved on);
    `probe`: the end of a fail-fast probe's slot (the run is stopped there unless it ended first)."""

    key: int
    epoch: int
    probe: bool = False


@dataclass(frozen=True, slots=True)
class WakeUp:
    """A pass the policy asked for (`Decision.wake_at`); `asks`: how many times this time was asked."""

    asks: int


Event = Arrival | End | WakeUp


class EventQueue:
    def __init__(self, submit: Sequence[float]) -> None:
        """`submit`: every job's arrival time, sorted; job k arrives at submit[k]."""
        self._submit = submit
        self._next = 0  # the next job to arrive
        self._heap: list[tuple[float, int, int, End | None]] = []  # (time, order, seq, end or None: wake)
        self._wakes: dict[float, int] = {}  # wake-up time -> times asked
        self._seq = 0
        self.popped = 0  # events popped, a wake-up counting once per ask

    def schedule(self, t: float, event: End | WakeUp) -> None:
        """Schedule an end or a wake-up (arrivals are known from the start)."""
        if isinstance(event, End):
            self._seq += 1
            heapq.heappush(self._heap, (t, END, self._seq, event))
            return
        c = self._wakes.get(t)
        if c is None:
            self._wakes[t] = event.asks
            self._seq += 1
            heapq.heappush(self._heap, (t, WAKE, self._seq, None))
        else:
            self._wakes[t] = c + event.asks

    def peek(self) -> float:
        """The time of the next event (inf: none left)."""
        t_heap = self._heap[0][0] if self._heap else math.inf
        t_arr = self._submit[self._next] if self._next < len(self._submit) else math.inf
        return min(t_heap, t_arr)

    def pop(self) -> tuple[float, Event]:
        """The next event, in (time, ends-arrivals-wake-ups, scheduling) order."""
        heap = self._heap
        n = self._next
        if n < len(self._submit) and (not heap or _before(self._submit[n], heap[0])):
            self._next = n + 1
            self.popped += 1
            return self._submit[n], Arrival(n)
        t, _, _, end = heapq.heappop(heap)
        if end is not None:
            self.popped += 1
            return t, end
        asks = self._wakes.pop(t)
        self.popped += asks
        return t, WakeUp(asks)

    def pop_at(self, now: float) -> Event | None:
        """The next event if it is at `now` (None: the instant is over)."""
        return self.pop()[1] if self.peek() == now else None

    def __len__(self) -> int:
        return len(self._heap) + len(self._submit) - self._next


def _before(t_arrival: float, top: tuple[float, int, int, End | None]) -> bool:
    """Whether an arrival at t_arrival comes before the heap's top event."""
    return t_arrival < top[0] or (t_arrival == top[0] and top[1] != END)
