"""The simulator's event queue: one instant's events in the order the engine relies on."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from headway.sim.events import Arrival, End, EventQueue, WakeUp


def test_ends_come_before_arrivals_and_arrivals_before_wake_ups_at_one_instant() -> None:
    q = EventQueue([5.0, 5.0])
    q.schedule(5.0, WakeUp(1))
    q.schedule(5.0, End(9, 0))
    got = [q.pop() for _ in range(4)]
    assert [type(e) for _, e in got] == [End, Arrival, Arrival, WakeUp]
    assert [e.key for _, e in got[1:3] if isinstance(e, Arrival)] == [0, 1]
    assert q.peek() == math.inf and len(q) == 0


def test_a_wake_up_asked_many_times_is_one_event_that_counts_every_ask() -> None:
    q = EventQueue([])
    for _ in range(3):
        q.schedule(7.0, WakeUp(1))
    t, ev = q.pop()
    assert (t, ev) == (7.0, WakeUp(3)) and q.popped == 3 and len(q) == 0


def test_ends_at_one_time_pop_in_the_order_they_were_scheduled() -> None:
    q = EventQueue([])
    for k in (4, 2, 8):
        q.schedule(1.0, End(k, 0))
    assert [q.pop()[1] for _ in range(3)] == [End(4, 0), End(2, 0), End(8, 0)]


@given(
    st.lists(st.floats(0, 100, allow_nan=False), max_size=20).map(sorted),
    st.lists(st.tuples(st.floats(0, 100, allow_nan=False), st.booleans()), max_size=20),
)
def test_events_pop_in_time_order_and_none_is_lost(
    submit: list[float], later: list[tuple[float, bool]]
) -> None:
    q = EventQueue(submit)
    for i, (t, is_end) in enumerate(later):
        q.schedule(t, End(i, 0) if is_end else WakeUp(1))
    order = {End: 0, Arrival: 1, WakeUp: 2}
    seen: list[tuple[float, int]] = []
    while q.peek() < math.inf:
        t = q.peek()
        got_t, ev = q.pop()
        assert got_t == t
        seen.append((t, order[type(ev)]))
    assert seen == sorted(seen)
    assert q.popped == len(submit) + len(later)


@given(
    st.lists(st.integers(0, 5).map(float), max_size=12).map(sorted),
    st.lists(st.tuples(st.integers(0, 5).map(float), st.booleans()), max_size=12),
)
def test_pop_at_gives_the_instants_events_in_the_order_pop_does(
    submit: list[float], later: list[tuple[float, bool]]
) -> None:
    a, b = EventQueue(submit), EventQueue(submit)
    for q in (a, b):
        for i, (t, is_end) in enumerate(later):
            q.schedule(t, End(i, 0) if is_end else WakeUp(1))
    while (now := a.peek()) < math.inf:
        got = []
        while (ev := a.pop_at(now)) is not None:
            got.append(ev)
        want = []
        while b.peek() == now:
            want.append(b.pop()[1])
        assert got == want
    assert b.peek() == math.inf
