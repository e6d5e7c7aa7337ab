"""The live dashboard: a small ASGI app (Starlette) served by uvicorn on a thread of the
driver while the job runs (``run(dashboard=PORT)``, ``--dashboard PORT``).

- ``/``: the page (static/index.html; its script polls the API every second);
- ``/api/job``, ``/api/checkpoints``, ``/api/checkpoints/<id>``: JSON (monitor/docs.py, Flink's
  REST field names where Flink has one);
- ``/metrics``: Prometheus text exposition (monitor/metrics.py).

It is read-only: nothing it serves changes the job, and it reads the tracker under the
tracker's lock. It binds to loopback by default and then accepts only loopback Host headers
(a web page elsewhere cannot read it through DNS rebinding). It has no authentication: a
host other than loopback is the user's explicit choice (see the README). The listening
socket is bound before the job starts, so a taken port fails at once, and connections made
before uvicorn's loop runs wait in the backlog (no start-up race).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from types import TracebackType

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .metrics import JobMetrics
from .tracker import JobTracker

STATIC = os.path.join(os.path.dirname(__file__), "static")
#: The page loads only its own files; the API is same-origin.
_HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
            "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                                       "frame-ancestors 'none'"}


class DashboardError(OSError):
    """The dashboard's port cannot be bound (in use, or not an address of this machine)."""


def make_app(tracker: JobTracker, metrics: JobMetrics, allowed_hosts: list[str] | None) -> Starlette:
    async def index(request: Request) -> Response:
        return FileResponse(os.path.join(STATIC, "index.html"), headers=_HEADERS)

    async def job(request: Request) -> Response:
        return JSONResponse(tracker.job_doc(), headers=_HEADERS)

    async def checkpoints(request: Request) -> Response:
        return JSONResponse(tracker.checkpoints_doc(), headers=_HEADERS)

    async def checkpoint(request: Request) -> Response:
        raw = request.path_params["cid"]
        doc = tracker.checkpoint_doc(int(raw)) if raw.isdigit() and len(raw) < 19 else None
        if doc is None:
            return JSONResponse({"error": f"checkpoint {raw[:40]!r} is not known: not taken yet, or older than the "
                                          "history the dashboard keeps"}, status_code=404, headers=_HEADERS)
        return JSONResponse(doc, headers=_HEADERS)

    async def prometheus(request: Request) -> Response:
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8",
                        headers={"Cache-Control": "no-store"})

    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)] if allowed_hosts else []
    return Starlette(routes=[
        Route("/", index), Route("/api/job", job), Route("/api/checkpoints", checkpoints),
        Route("/api/checkpoints/{cid}", checkpoint), Route("/metrics", prometheus),
        Mount("/static", StaticFiles(directory=STATIC)),
    ], middleware=middleware)


class Dashboard:
    """Serves ``tracker`` on ``host:port`` from a daemon thread, as a context manager."""

    def __init__(self, tracker: JobTracker, host: str, port: int):
        try:
            self.sock = socket.create_server((host, port), family=_family(host), backlog=128)
        except OSError as e:
            raise DashboardError(e.errno, f"cannot serve the dashboard on {host}:{port} ({e.strerror}): pass another "
                                          "port, or 0 for any free one") from None
        bound = self.sock.getsockname()
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{bound[1]}/"
        loopback = _is_loopback(host)
        allowed = ["localhost", "127.0.0.1", "[::1]", "::1"] if loopback else None
        try:
            self.metrics = JobMetrics(tracker)
            app = make_app(tracker, self.metrics, allowed)
            self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                                        log_config=None))
        except BaseException:
            self.sock.close()
            raise
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="dashboard", daemon=True)

    def __enter__(self) -> "Dashboard":
        self.thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10.0)
        self.sock.close()


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
