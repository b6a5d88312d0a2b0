"""/metrics in Prometheus' text format: one collector that reads the cached store figures, the live queue
and the decision log's pass statistics at scrape time. Label values are bounded (tiers, classes, outcomes,
adapters) unless `--metrics-per-user` opts in to one series per user."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from headway.web.queue import QueueView


class HeadwayCollector(Collector):
    def __init__(
        self,
        summary: Callable[[], dict[str, Any]],
        queue: Callable[[], QueueView | None],
        passes: Callable[[], list[dict[str, Any]]],
        store_age: Callable[[], float | None],
        per_user: bool = False,
    ) -> None:
        self.summary, self.queue, self.passes, self.store_age = summary, queue, passes, store_age
        self.per_user = per_user

    def collect(self) -> Iterator[Any]:
        yield from self._queue()
        yield from self._store()
        yield from self._passes()

    def _queue(self) -> Iterator[Any]:
        q = self.queue()
        up = GaugeMetricFamily("headway_queue_up", "1 when the live queue answered on this scrape", labels=[])
        up.add_metric([], 1.0 if q is not None and q.ok else 0.0)
        yield up
        if q is None:
            return
        jobs = GaugeMetricFamily(
            "headway_queue_jobs", "Jobs in the live queue", labels=["state", "tier", "priority_class"]
        )
        gpus = GaugeMetricFamily(
            "headway_queue_gpus",
            "GPUs asked by jobs in the live queue",
            labels=["state", "tier", "priority_class"],
        )
        n: Counter[tuple[str, str, str]] = Counter()
        g: dict[tuple[str, str, str], float] = {}
        users: Counter[tuple[str, str]] = Counter()
        for j in [*q.pending, *q.running]:
            key = (j.state.lower(), j.tier or "", j.priority_class or "")
            n[key] += 1
            g[key] = g.get(key, 0.0) + float(j.gpus or 0)
            users[(j.user or "", j.state.lower())] += 1
        for key in sorted(n):
            jobs.add_metric(list(key), n[key])
            gpus.add_metric(list(key), g[key])
        yield jobs
        yield gpus
        if q.gpus_total is not None:
            total = GaugeMetricFamily("headway_gpus", "GPUs the live queue hands out", labels=[])
            total.add_metric([], q.gpus_total)
            yield total
            free = GaugeMetricFamily("headway_gpus_free", "GPUs free now", labels=[])
            free.add_metric([], q.gpus_free or 0)
            yield free
            util = GaugeMetricFamily("headway_gpu_utilisation", "Share of the GPUs busy now", labels=[])
            util.add_metric([], (q.gpus_total - (q.gpus_free or 0)) / q.gpus_total if q.gpus_total else 0.0)
            yield util
        if self.per_user:
            uj = GaugeMetricFamily(
                "headway_user_queue_jobs", "Jobs in the live queue per user", labels=["user", "state"]
            )
            for ukey in sorted(users):
                uj.add_metric(list(ukey), users[ukey])
            yield uj

    def _store(self) -> Iterator[Any]:
        r = self.summary()
        ended = CounterMetricFamily(
            "headway_jobs_ended", "Ended jobs in the store by outcome class", labels=["outcome"]
        )
        hours = CounterMetricFamily(
            "headway_gpu_hours", "GPU-hours in the store by outcome class", labels=["outcome"]
        )
        for outcome, v in sorted(r["by_outcome"].items()):
            ended.add_metric([outcome], float(v["jobs"]))
            hours.add_metric([outcome], float(v["gpu_hours"]))
        yield ended
        yield hours
        wasted = CounterMetricFamily("headway_wasted_gpu_hours", "GPU-hours of waste-class jobs in the store")
        wasted.add_metric([], float(r["wasted_gpu_hours"]))
        yield wasted
        rate = GaugeMetricFamily(
            "headway_completion_rate", "Successful / ended jobs in the store", labels=["by"]
        )
        for by in ("by_count", "by_gpu_hours"):
            v = r["completion_rate"][by]
            if v is not None:
                rate.add_metric([by.removeprefix("by_")], float(v))
        yield rate
        age = self.store_age()
        if age is not None:
            a = GaugeMetricFamily("headway_store_age_seconds", "Seconds since the job store was last written")
            a.add_metric([], age)
            yield a
        if self.per_user:
            uw = GaugeMetricFamily(
                "headway_user_wasted_gpu_hours",
                "Wasted GPU-hours per user (the audit's top users)",
                labels=["user"],
            )
            for row in r["top"]["user"]:
                uw.add_metric([row["key"]], float(row["wasted_gpu_hours"]))
            yield uw

    def _passes(self) -> Iterator[Any]:
        stats = self.passes()
        labels = ["adapter", "source"]
        total = CounterMetricFamily(
            "headway_passes", "Live passes logged (local decide, slurm sync)", labels=labels
        )
        errors = CounterMetricFamily("headway_pass_errors", "Live passes that failed", labels=labels)
        last = GaugeMetricFamily(
            "headway_pass_duration_seconds", "Duration of the last logged pass", labels=labels
        )
        mean = GaugeMetricFamily(
            "headway_pass_duration_mean_seconds", "Mean duration of the logged passes", labels=labels
        )
        when = GaugeMetricFamily(
            "headway_last_pass_timestamp_seconds", "When the last pass ran (epoch)", labels=labels
        )
        for s in stats:
            key = [str(s.get("adapter")), str(s.get("source"))]
            total.add_metric(key, float(s.get("passes") or 0))
            errors.add_metric(key, float(s.get("errors") or 0))
            if s.get("last_duration_s") is not None:
                last.add_metric(key, float(s["last_duration_s"]))
            if s.get("mean_duration_s") is not None:
                mean.add_metric(key, float(s["mean_duration_s"]))
            at = s.get("last_at")
            if at is not None:
                when.add_metric(key, at.timestamp() if hasattr(at, "timestamp") else float(at))
        yield from (total, errors, last, mean, when)
