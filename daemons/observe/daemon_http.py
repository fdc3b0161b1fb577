"""The HTTP server a daemon runs beside its RPC loop when ``metrics_port`` is not 0: its
Prometheus registry, and the app that serves it (every daemon's answers ``/metrics`` and
``/health``; the master's adds Mooncake's inspection endpoints, daemons.observe.master_http)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from daemons.asgi.server import HttpServer

CLOSE_GRACE = 1.0  # seconds a scrape in flight may take to finish when the daemon stops
START_TIMEOUT = 10.0


def metrics_app(registry: CollectorRegistry, role: str) -> Starlette:
    """Starlette, not FastAPI: nothing here needs request models, and every daemon pays the import
    at start (FastAPI's is a quarter of a second here, Starlette's 10 ms)."""
    def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "role": role})

    return Starlette(routes=[Route("/metrics", metrics_endpoint(registry)), Route("/health", health)])


def metrics_endpoint(registry: CollectorRegistry):
    """``GET /metrics``: the registry in Prometheus's text format. A plain function: Starlette
    runs it on its thread pool, so a collector taking a lock never blocks the event loop."""
    def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
    return metrics


def serve(app: Starlette, host: str, port: int, role: str) -> HttpServer:
    return HttpServer(app, host, port, CLOSE_GRACE, purpose=f"{role}'s metrics server",
                      advice="choose another metrics_port, or 0 to turn it off").start(START_TIMEOUT)
