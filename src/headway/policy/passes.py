"""The pass every policy shares: a ranking in, a Decision out (start what fits in rank order, plan the
first reservation, backfill around it). A function, not a method, so that a built install compiles it
(headway._native): mypyc cannot compile the policies' frozen dataclasses with class variables, and this
loop is a replay's busiest Python (153k passes over short queues at 1M jobs).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from headway.policy.placement import gang_size, place, scratch_index
from headway.policy.snapshot import F64, FULL_SHARE, I64, Decision, Reservation, Snapshot, Start

if TYPE_CHECKING:
    from headway.policy.policies import Policy

_UNLIMITED = 1 << 62
HOUR = 3600.0
Z90 = 1.2815515655446004  # the standard normal's 90th percentile
_NO_INTS: I64 = np.empty(0, dtype=np.int64)
_NO_INTS.setflags(write=False)
# Up to this many pending jobs a pass works on plain lists: the same results with fewer numpy calls.
SMALL_QUEUE = 16


def decide_pass(pol: Policy, snap: Snapshot, preemptive: bool) -> Decision:
    """`pol.decide(snap)`; `preemptive`: whether `pol` overrides `Policy.preemptions`."""
    ranking = pol.rank(snap)
    did = f"{pol.name}-{snap.seq}"
    p, view = snap.pending, snap.cluster
    if len(p) == 0:
        return Decision(did, snap.now, ranking=ranking, wake_at=pol.wake_at(snap))
    # The scratch free GPUs: the index copies the cluster's arrays on its first `take`, so a pass
    # that starts only its last job (most simulator passes) copies nothing. Read them from the index.
    index = scratch_index(view)
    gpus, max_nodes = p.gpus, p.max_nodes
    starts: list[Start] = []
    taken: list[tuple[list[tuple[int, int]], int]] = []  # (gpus used, pending pos) in this pass
    reservation: Reservation | None = None
    order = ranking.order
    small = len(p) <= SMALL_QUEUE
    # Plain lists: per-job numpy scalar reads dominate a pass that starts thousands of jobs, and
    # a short queue is cheaper in plain Python than in a dozen numpy calls (same values either way).
    mn_l, gpus_l = max_nodes.tolist(), gpus.tolist()
    if small:
        sizes = [gang_size(g) for g in gpus_l]
        whole_l = [w for w, _ in sizes]
        milli_l = [m for _, m in sizes]
        whole = milli = _NO_INTS  # made from the lists only if the backfill phase needs them
        has_frac = any(milli_l)
    else:
        whole = np.where(gpus >= 1.0, np.ceil(gpus - 1e-9), 0).astype(np.int64)
        milli = np.where((gpus > 0) & (gpus < 1.0), np.maximum(1, np.round(gpus * FULL_SHARE)), 0)
        milli = milli.astype(np.int64)
        whole_l, milli_l = whole.tolist(), milli.tolist()
        has_frac = bool((milli > 0).any())

    any_multi = any(m > 1 for m in mn_l) if small else bool((max_nodes > 1).any())

    def limits() -> tuple[int, int, int]:
        """Largest free node, free total (-1: not needed, no multi-node job), largest free share
        (only looked at with fractional jobs)."""
        fm = index.max_free()
        # A whole free GPU is a full share; only without one is the largest partial share needed.
        sm = FULL_SHARE if fm > 0 else (int(index.share.max(initial=0)) if has_frac else 0)
        return fm, index.total if any_multi else -1, sm

    # Easy mode: which jobs get a reservation when first not to fit (None: every one); the others
    # are skipped. Asked for only when needed, so a queue of one that fits never computes scores.
    rmask: npt.NDArray[np.bool_] | None = None
    fmax, ftot, smax = limits()  # from the live counts until the first take: no pass over nodes
    if small:
        # A short queue tries each job in turn, and keeps the limits from before its first take:
        # upper bounds (free GPUs only shrink in a pass) that skip, with a comparison, placements
        # that cannot succeed (a congested pass starts one job of a dozen); `place` decides the rest.
        order_l = order.tolist()
    else:
        rmask = pol.reserve_mask(ranking) if pol.mode == "easy" else None
        if pol.mode == "greedy" or rmask is not None:
            # Free GPUs only shrink during a pass, so what cannot fit now (and would only be
            # skipped) is dropped in one step.
            fits = np.where(whole > 0, whole <= np.where(max_nodes > 1, ftot, fmax), milli <= smax)
            if rmask is not None:
                fits |= rmask
            order = order[fits[order]]
        order_l = order.tolist()
    i, n = 0, len(order_l)
    strict = False
    how, mode, keys, jids = pol.placement, pol.mode, p.key, p.job_id
    place_sized, take_gpus, max_free = index.place_sized, index.take, index.max_free
    # Phase 1: in rank order, start what fits until the first job that does not (or all, greedy).
    # A start is the pass's unit of work (thousands on a long queue): the loop keeps it to list
    # reads, one index placement and one `take`, with the limits updated in place.
    while i < n:
        pos = order_l[i]
        i += 1
        w, m = whole_l[pos], mn_l[pos]
        if w > 0:
            alloc = place_sized(how, gpus_l[pos], w, 0, m) if w <= (ftot if m > 1 else fmax) else None
        else:
            mi = milli_l[pos]
            alloc = place_sized(how, gpus_l[pos], 0, mi, m) if mi <= smax else None
        if alloc is not None:
            starts.append(Start(int(keys[pos]), str(jids[pos]), alloc))
            if i >= n and not preemptive:
                break  # the last job in the order: nothing reads the scratch GPUs after it
            if small and not preemptive:
                # Nor after a start that no later job can follow: none within the limits (upper
                # bounds, as free GPUs only shrink in a pass) and none that may hold a reservation.
                # The pass ends here without the `take`, which copies the live GPUs' lists.
                if mode == "easy" and rmask is None:
                    rmask = pol.reserve_mask(ranking)
                if not any(
                    (whole_l[q] <= (ftot if mn_l[q] > 1 else fmax) if whole_l[q] > 0 else milli_l[q] <= smax)
                    or (mode == "easy" and (rmask is None or bool(rmask[q])))
                    for q in order_l[i:]
                ):
                    break
            taken.append((take_gpus(alloc), pos))
            if i >= n:
                break
            if not small:  # limits(), inlined: free GPUs only fell on the nodes just taken
                fmax = max_free()
                smax = FULL_SHARE if fmax > 0 else (int(index.share.max(initial=0)) if has_frac else 0)
                if any_multi:
                    ftot = index.total
                if mode == "greedy" and smax <= 0 and not (milli[order[i:]] == 0).any():
                    break
            continue
        if mode == "strict":
            break
        if mode == "greedy":
            continue
        if small and rmask is None:
            rmask = pol.reserve_mask(ranking)
        if rmask is not None and not rmask[pos]:
            continue
        strict = pol.strict_head(ranking, pos)
        reservation, shadow, slack, counted = pol._reserve(
            snap, pos, whole_l[pos], index.free, index.share, taken
        )
        if strict:
            # A starved head: beyond GPUs it can never use, only a job whose *time limit* (a hard
            # bound, never a prediction) ends before its planned start may backfill, so its wait
            # stays bounded by max_wait + the time for GPUs to free + the longest such limit.
            slack = np.where(view.node_gpus >= max(whole_l[pos], 1), 0, _UNLIMITED)
            if int(max_nodes[pos]) > 1:
                slack = np.zeros_like(view.free)
            if not math.isfinite(reservation.start):
                shadow = -math.inf
        elif not math.isfinite(reservation.start):
            slack = np.zeros_like(view.free)
        spare = np.minimum(index.free, slack)
        break
    # Phase 2: backfill behind the reservation (EASY): a job that ends before the reservation's start
    # may use any free GPU; one that would run past it only the GPUs the reservation will not need.
    if reservation is not None and pol.mode == "easy":
        if small:
            whole, milli = np.array(whole_l, dtype=np.int64), np.array(milli_l, dtype=np.int64)
            fmax, ftot, smax = limits()
        est = pol.pending_estimate(snap)
        if strict:
            est = np.where(np.isfinite(p.time_limit), p.time_limit, math.inf)
        tested = 0
        cand = order[i:]
        # Necessary condition (free only shrinks in a pass): filter in one vectorised step.
        spmax, sptot = int(spare.max(initial=0)), int(spare.sum())
        wc, multi = whole[cand], max_nodes[cand] > 1
        before = snap.now + est[cand] <= shadow
        room = np.where(before, np.where(multi, ftot, fmax), np.where(multi, sptot, spmax))
        ok = np.where(wc > 0, wc <= room, milli[cand] <= smax)
        for pos in cand[ok].tolist():
            if tested >= pol.backfill_depth or (fmax == 0 and smax <= 0):  # no free GPU at all
                break
            tested += 1
            ends_before = snap.now + est[pos] <= shadow
            w, m = whole_l[pos], mn_l[pos]
            if w > 0:
                cap_max, cap_tot = (fmax, ftot) if ends_before else (spmax, sptot)
                if w > (cap_tot if m > 1 else cap_max):
                    continue
            elif milli_l[pos] > smax:
                continue
            if ends_before:
                alloc = place_sized(how, gpus_l[pos], w, milli_l[pos], m)
            else:
                sh = index.share
                if w == 0:
                    # A share that runs past the reservation may not land on a GPU the plan counts
                    # on (free by its start) on a node without slack: shown as full to `place`.
                    blocked = counted & (slack <= 0)[:, None]
                    if blocked.any():
                        sh = np.where(blocked, 0, sh)
                alloc = place(pol.placement, spare, sh, view.rack, view.n_racks, gpus_l[pos], m)
            if alloc is None:
                continue
            if alloc.frac_gpu < 0:
                cost = alloc.counts
                if not ends_before and any(c > spare[nd] for nd, c in zip(alloc.nodes, cost, strict=True)):
                    continue
            else:
                # A share of a GPU the plan counts on by the reservation's start (a free one, or a
                # shared one whose sharers end by then) keeps that GPU busy past it: it costs one
                # GPU of its node's slack, once.
                at = (alloc.nodes[0], alloc.frac_gpu)
                cost = (1,) if counted[at] and not ends_before else (0,)
                if cost[0]:
                    counted[at] = False
            used = index.take(alloc)
            for nd, c in zip(alloc.nodes, cost, strict=True):
                if not ends_before:
                    slack[nd] -= c
                spare[nd] = min(int(spare[nd]) - (0 if ends_before else c), int(slack[nd]))
                spare[nd] = min(int(spare[nd]), int(index.free[nd]))
            taken.append((used, pos))
            starts.append(Start(int(p.key[pos]), str(p.job_id[pos]), alloc, backfill=True))
            fmax, ftot, smax = limits()
            spmax, sptot = int(spare.max(initial=0)), int(spare.sum())
    if preemptive:
        started = {s.key for s in starts}
        free, share = index.writable()
        preempt, more = pol.preemptions(snap, ranking, free, share, started)
    else:
        preempt, more = [], []
    starts.extend(more)
    wake = pol.wake_at(snap)
    if preemptive and starts:
        later = pol.wake_after(snap, starts)
        if later is not None and (wake is None or later < wake):
            wake = later
    return Decision(did, snap.now, tuple(starts), tuple(preempt), reservation, wake, ranking)


def _fmin(a: float, b: float) -> float:
    """numpy's fmin: a NaN loses to a number."""
    if a != a:
        return b
    if b != b:
        return a
    return b if b < a else a


def _maximum(a: float, b: float) -> float:
    """numpy's maximum: a NaN wins."""
    if a != a or b != b:
        return a if a != a else b
    return b if b > a else a


def impact_order(
    snap: Snapshot,
    weight: list[float] | float,
    max_wait: list[float] | float,
    hold_after: int,
    mean_runtime: bool,
) -> tuple[I64, I64, F64]:
    """Impact's (order, tier, score) for a short queue on plain floats: the same float operations, in
    the same order, as `Impact.scores` and `Policy.rank` (exact; tests/test_policy_short.py), with numpy
    only for log, exp and exp2 (its own functions, so every bit agrees). A pass over a dozen jobs then
    makes a handful of numpy calls instead of some fifty (most of a congested replay's passes).

    `weight` and `max_wait`: one value for every job (a trace with one class) or one per class."""
    p = snap.pending
    n = len(p)
    ps: list[float] = p.p_success.tolist()
    med: list[float] = p.runtime.tolist()
    if mean_runtime:  # lognormal_mean, element by element
        lg: list[float] = np.log(np.fmax(p.runtime_p90, p.runtime) / p.runtime).tolist()
        sig = [_minimum3(v / Z90) for v in lg]
        ex: list[float] = np.exp(np.array([0.5 * s * s for s in sig])).tolist()
        rt = [med[i] if sig[i] != sig[i] else med[i] * ex[i] for i in range(n)]
    else:
        rt = med
    lim: list[float] = p.time_limit.tolist()
    ttf: list[float] = p.time_to_failure.tolist()
    gpus: list[float] = p.gpus.tolist()
    klass: list[int] = p.klass.tolist()
    total = float(snap.usage.sum())
    if total <= 0:
        fs = [1.0] * n
    else:
        use: list[float] = snap.usage[p.user].tolist()
        share: list[float] = snap.shares[p.user].tolist()
        fs = np.exp2(np.array([-(use[i] / total) / _maximum(share[i], 1e-12) for i in range(n)])).tolist()
    submit: list[float] = p.submit.tolist()
    streak: list[int] = p.fail_streak.tolist()
    keys: list[int] = p.key.tolist()
    now = snap.now
    tier: list[int] = []
    score: list[float] = []
    for i in range(n):
        q = ps[i]
        r = _fmin(rt[i], lim[i])
        f = _fmin(ttf[i], lim[i])
        c = _maximum(gpus[i], 1e-3) * (q * r + (1 - q) * f) / HOUR
        w = weight if isinstance(weight, float) else weight[klass[i]]
        mw = max_wait if isinstance(max_wait, float) else max_wait[klass[i]]
        deadline = submit[i] + mw
        if deadline <= now:
            tier.append(0)
            score.append(-deadline)
        else:
            tier.append(2 if streak[i] >= hold_after else 1)
            score.append(w * q / _maximum(c, 1e-6) * fs[i])
    # np.lexsort((key, submit, -score, tier)): NaN scores last within their tier
    order = sorted(
        range(n),
        key=lambda i: (
            tier[i],
            score[i] != score[i],
            0.0 if score[i] != score[i] else -score[i],
            submit[i],
            keys[i],
        ),
    )
    return np.array(order, dtype=np.int64), np.array(tier, dtype=np.int64), np.array(score, dtype=np.float64)


def _minimum3(v: float) -> float:
    """np.minimum(v, 3.0): a NaN stays NaN."""
    return v if v != v or v < 3.0 else 3.0


def first_deadline(
    now: float, submits: list[float], klasses: list[int], max_wait: list[float] | float
) -> float | None:
    """`Impact._first_deadline`'s loop (compiled with the pass): the earliest submit + max_wait after
    `now`; `max_wait` one value, or one per class."""
    best = math.inf
    found = False
    if isinstance(max_wait, float):
        for s in submits:
            d = s + max_wait
            if d > now and (d < best or not found):
                best, found = d, True
    else:
        for s, k in zip(submits, klasses, strict=True):
            d = s + max_wait[k]
            if d > now and (d < best or not found):
                best, found = d, True
    return float(best) if found else None
