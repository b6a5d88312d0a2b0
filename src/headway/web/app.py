"""The FastAPI app: HTML pages rendered on the server (Jinja2, autoescaped: job and user names are
anyone's to choose), the same data as JSON under /api/, /metrics, and /healthz."""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import stat
from collections.abc import Awaitable, Callable
from functools import cache
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from headway.store import StoreError
from headway.web import charts, data
from headway.web.config import ServeConfig
from headway.web.queue import LocalQueue, QueueView, slurm_view
from headway.web.storeview import StoreView

MAX_SIMULATION_BYTES = 64 * 1024 * 1024
COOKIE = "headway_token"
# Scripts only from this server (plotly.js and the page script); plotly sets inline styles.
CSP = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:"


@cache
def _plotly_js() -> bytes:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode()


def _env() -> Environment:
    env = Environment(
        loader=PackageLoader("headway.web", "templates"), autoescape=select_autoescape(["html"])
    )
    from headway.web import fmt

    env.filters.update(fmt.FILTERS)
    return env


def create_app(cfg: ServeConfig) -> FastAPI:
    app = FastAPI(
        title="headway",
        description="Where the GPU-hours went, the live queue and why, and headway's decisions.",
        version="1",
        docs_url=None,  # FastAPI's docs pages load their scripts from a CDN; the schema is /openapi.json
        redoc_url=None,
    )
    store = StoreView(cfg.db)
    env = _env()
    local = LocalQueue(cfg.state_dir) if cfg.state_dir is not None else None
    static = Path(__file__).with_name("static")

    def cached(key: Any, fn: Callable[[Any], Any]) -> Any:
        try:
            value, _age = store.get(key, fn)
        except StoreError as e:
            raise HTTPException(503, str(e)) from None
        return value

    def summary(top: int = 10) -> dict[str, Any]:
        out: dict[str, Any] = cached(("summary", top), lambda con: data.summary(con, cfg, top))
        return out

    def queue_view() -> QueueView | None:
        if local is not None:
            return local.view()
        if cfg.slurm:
            return slurm_view(cached("slurm-latest", lambda con: data.latest_slurm(con, cfg)))
        return None

    def page(template: str, **ctx: Any) -> HTMLResponse:
        html = env.get_template(template).render(
            cfg=cfg, has_queue=local is not None or cfg.slurm, now=dt.datetime.now(dt.UTC), **ctx
        )
        return HTMLResponse(html)

    @app.middleware("http")
    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if cfg.token is not None and request.url.path != "/healthz":
            given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            given = given or request.cookies.get(COOKIE, "") or request.query_params.get("token", "")
            if not secrets.compare_digest(given.encode(), cfg.token.encode()):
                return PlainTextResponse(
                    "a token is needed: Authorization: Bearer TOKEN, or ?token=TOKEN", 401
                )
            if request.query_params.get("token"):  # once: keep it in a cookie, out of the address bar
                resp: Response = RedirectResponse(request.url.remove_query_params("token"), 303)
                resp.set_cookie(COOKIE, cfg.token, httponly=True, samesite="strict")
                return resp
        resp = await call_next(request)
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Content-Security-Policy"] = CSP
        resp.headers["Referrer-Policy"] = "no-referrer"
        return resp

    @app.get("/healthz", response_class=PlainTextResponse)
    def healthz() -> PlainTextResponse:
        try:
            store.get("healthz", lambda con: True)
        except StoreError as e:
            return PlainTextResponse(f"store not open: {e}", 503)
        return PlainTextResponse("ok")

    @app.get("/static/plotly.min.js")
    def plotly_js() -> Response:
        return Response(
            _plotly_js(), media_type="text/javascript", headers={"Cache-Control": "max-age=86400"}
        )

    @app.get("/static/headway.js")
    def headway_js() -> Response:
        return Response((static / "headway.js").read_bytes(), media_type="text/javascript")

    @app.get("/static/headway.css")
    def headway_css() -> Response:
        return Response((static / "headway.css").read_bytes(), media_type="text/css")

    # ---- JSON ----

    @app.get("/api/summary")
    def api_summary(top: int = Query(10, ge=1, le=1000)) -> dict[str, Any]:
        """The audit of the whole store: the same object as `headway audit --json --top N`."""
        return summary(top)

    def _compare(at: str | None, days: float | None) -> dict[str, Any]:
        when = None
        if at:
            try:
                when = dt.datetime.fromisoformat(at)
            except ValueError:
                raise HTTPException(422, f"at: not a date: {at!r} (use 2026-01-31)") from None
            when = when if when.tzinfo else when.replace(tzinfo=dt.UTC)
        out: dict[str, Any] = cached(("compare", at, days), lambda con: data.compare(con, cfg, when, days))
        return out

    @app.get("/api/compare")
    def api_compare(at: str | None = None, days: float | None = Query(None, gt=0, le=3650)) -> dict[str, Any]:
        """Before and after a date (default: the first day headway's ranking was applied)."""
        return _compare(at, days)

    @app.get("/api/queue")
    def api_queue() -> dict[str, Any]:
        """The live queue: pending jobs in rank order with their reason, and the running jobs."""
        q = queue_view()
        if q is None:
            raise HTTPException(404, "no live queue: start `headway serve` with --state-dir DIR or --slurm")
        return q.to_json()

    @app.get("/api/users")
    def api_users(top: int = Query(100, ge=1, le=10000)) -> dict[str, Any]:
        """Users and job names by wasted GPU-hours, repeat-failure runs and over-asked time limits."""
        r = summary(top)
        return {
            "users": r["top"]["user"],
            "names": r["top"]["name"],
            "repeat_failures": r["repeat_failures"],
            "over_asking": r["timeouts"]["over_asking"],
        }

    @app.get("/api/users/{user}")
    def api_user(user: str) -> dict[str, Any]:
        got: dict[str, Any] | None = cached(("user", user), lambda con: data.user_page(con, cfg, user))
        if got is None:
            raise HTTPException(404, f"no jobs of user {user!r} in the store")
        return got

    @app.get("/api/decisions")
    def api_decisions(
        limit: int = Query(100, ge=1, le=1000), before: int | None = Query(None, ge=1)
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = cached(
            ("decisions", limit, before), lambda con: data.decisions(con, cfg, limit, before)
        )
        return out

    @app.get("/api/decisions/{decision_id}")
    def api_decision(decision_id: int) -> dict[str, Any]:
        got: dict[str, Any] | None = cached(
            ("decision", decision_id), lambda con: data.decision(con, decision_id)
        )
        if got is None:
            raise HTTPException(404, f"no decision {decision_id}")
        return got

    @app.get("/api/jobs/{source}/{job_id}")
    def api_job(source: str, job_id: str) -> dict[str, Any]:
        got: dict[str, Any] | None = cached(
            ("job", source, job_id), lambda con: data.job_page(con, source, job_id)
        )
        if got is None:
            raise HTTPException(404, f"no job {job_id} of source {source!r} in the store or the decision log")
        return got

    def _simulations() -> list[str]:
        if cfg.simulations is None:
            return []
        try:
            return sorted(
                n for n in os.listdir(cfg.simulations) if n.endswith(".json") and not n.startswith(".")
            )
        except OSError:
            return []

    def _simulation(name: str) -> dict[str, Any]:
        if cfg.simulations is None or name not in _simulations():
            raise HTTPException(404, f"no simulation {name!r}")
        path = cfg.simulations / name
        try:  # never follow a link another user planted, never read a FIFO or a huge file
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            raise HTTPException(404, f"{name}: cannot open ({e.strerror})") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SIMULATION_BYTES:
                raise HTTPException(422, f"{name}: not a regular file of at most 64 MiB")
            raw = f.read(MAX_SIMULATION_BYTES + 1)
        return _parse_simulation(name, raw)

    @app.get("/api/simulations")
    def api_simulations() -> list[str]:
        """The `headway simulate --json` outputs in the folder given to --simulations."""
        return _simulations()

    @app.get("/api/simulations/{name}")
    def api_simulation(name: str) -> dict[str, Any]:
        return charts.simulation_table(_simulation(name))

    @app.post("/api/simulations/render")
    async def api_render(request: Request) -> dict[str, Any]:
        """Send the JSON that `headway simulate --json` wrote; get its comparison table and charts."""
        raw = await request.body()
        if len(raw) > MAX_SIMULATION_BYTES:
            raise HTTPException(413, "over 64 MiB")
        d = _parse_simulation("the upload", raw)
        return {**charts.simulation_table(d), "charts": charts.to_json(charts.simulation_figures(d))}

    @app.get("/metrics")
    def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        from headway.web.metrics import HeadwayCollector

        reg = CollectorRegistry(auto_describe=False)

        def safe_queue() -> QueueView | None:
            try:
                return queue_view()
            except HTTPException:
                return None

        reg.register(
            HeadwayCollector(
                summary=lambda: summary(100 if cfg.metrics_per_user else 10),
                queue=safe_queue,
                passes=lambda: cached("pass-stats", data.pass_stats),
                store_age=store.age_s,
                per_user=cfg.metrics_per_user,
            )
        )
        return Response(generate_latest(reg), media_type=CONTENT_TYPE_LATEST)

    # ---- pages ----

    @app.get("/", response_class=HTMLResponse)
    def overview() -> HTMLResponse:
        r = summary(10)
        return page("overview.html", r=r, charts=charts.to_json(charts.overview_figures(r)))

    @app.get("/compare", response_class=HTMLResponse)
    def compare_page(at: str | None = None, days: float | None = Query(None, gt=0, le=3650)) -> HTMLResponse:
        c = _compare(at, days)
        return page("compare.html", c=c, charts=charts.to_json(charts.compare_figures(c)))

    @app.get("/queue", response_class=HTMLResponse)
    def queue_page() -> HTMLResponse:
        q = queue_view()
        figs = charts.to_json(charts.queue_figures(q)) if q is not None and q.ok else {}
        return page("queue.html", q=q, charts=figs)

    @app.get("/users", response_class=HTMLResponse)
    def users_page() -> HTMLResponse:
        r = summary(100)
        return page("users.html", r=r, charts=charts.to_json(charts.users_figures(r)))

    @app.get("/users/{user}", response_class=HTMLResponse)
    def user_page(user: str) -> HTMLResponse:
        u = api_user(user)
        return page("user.html", u=u, r=u["report"], charts=charts.to_json(charts.user_figures(u["report"])))

    @app.get("/decisions", response_class=HTMLResponse)
    def decisions_page(before: int | None = Query(None, ge=1)) -> HTMLResponse:
        rows = api_decisions(100, before)
        return page("decisions.html", rows=rows, before=before)

    @app.get("/decisions/{decision_id}", response_class=HTMLResponse)
    def decision_page(decision_id: int) -> HTMLResponse:
        return page("decision.html", d=api_decision(decision_id))

    @app.get("/jobs/{source}/{job_id}", response_class=HTMLResponse)
    def job_page(source: str, job_id: str) -> HTMLResponse:
        return page("job.html", j=api_job(source, job_id))

    @app.get("/simulations", response_class=HTMLResponse)
    def simulations_page() -> HTMLResponse:
        return page("simulations.html", names=_simulations())

    @app.get("/simulations/{name}", response_class=HTMLResponse)
    def simulation_page(name: str) -> HTMLResponse:
        d = _simulation(name)
        return page(
            "simulation.html",
            name=name,
            t=charts.simulation_table(d),
            charts=charts.to_json(charts.simulation_figures(d)),
        )

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        if request.url.path.startswith("/api/") or request.url.path == "/metrics":
            return JSONResponse({"detail": exc.detail}, exc.status_code)
        return HTMLResponse(
            env.get_template("error.html").render(
                cfg=cfg, has_queue=local is not None or cfg.slurm, status=exc.status_code, detail=exc.detail
            ),
            exc.status_code,
        )

    return app


def _parse_simulation(name: str, raw: bytes) -> dict[str, Any]:
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise HTTPException(422, f"{name}: not JSON (give what `headway simulate --json` wrote)") from None
    if not isinstance(d, dict) or not isinstance(d.get("policies"), dict):
        raise HTTPException(422, f"{name}: no `policies` object: not the output of `headway simulate --json`")
    return d
