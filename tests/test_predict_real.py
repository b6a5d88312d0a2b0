"""The predictor on real public traces (skips without ../shared/traces). Full numbers: docs/predict.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from headway.predict.evaluate import evaluate
from headway.predict.features import build_features
from headway.predict.model import TrainConfig
from headway.traces.base import ReadOptions
from headway.traces.registry import get_reader

pytestmark = pytest.mark.shared
QUICK = TrainConfig(rounds=150, quantile_rounds=80, early_stopping=20)


def _frame(shared_traces: Path, fmt: str, rel: str):  # type: ignore[no-untyped-def]
    path = shared_traces / rel
    if not path.exists():
        pytest.skip(f"{path} not present")
    return build_features(get_reader(fmt).read(path, ReadOptions()).table)


def test_philly_model_beats_the_per_user_success_rate(shared_traces: Path) -> None:
    f = _frame(shared_traces, "philly", "philly-dre/philly_jobs.json")
    r = evaluate(f, 0.3, QUICK)
    assert r["split"]["test_jobs"] == 1773
    assert r["auc"] > r["baseline"]["auc"] + 0.015
    assert r["brier"] < r["baseline"]["brier"]
    assert r["ece"] < r["baseline"]["ece"]


def test_alibaba_model_learns_from_job_shape_without_users(shared_traces: Path) -> None:
    f = _frame(shared_traces, "alibaba", "alibaba-fgd-2023/openb_pod_list_default.csv")
    r = evaluate(f, 0.3, QUICK)
    assert r["split"]["ended_jobs"] < len(f)  # deleted-while-running pods have no label
    assert r["auc"] > 0.75 > r["baseline"]["auc"]
    assert r["brier"] < r["baseline"]["brier"]
