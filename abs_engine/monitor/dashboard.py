"""The live dashboard: a small ASGI app (Starlette) served by uvicorn on a thread of the
driver while the job runs (``run(dashboard=PORT)``, ``--dashboard PORT``).

- ``/``: the page (static/index.html; its script polls the API every second);
- ``/api/job``, ``/api/checkpoints``, ``/api/checkpoints/<id>``: JSON (monitor/docs.py, Flink's
  REST field names where Flink has one), of one pipeline: ``?pipeline=<name>`` (default: the
  first; a job of one pipeline has one view);
- ``/api/pipelines``: every pipeline's state and counts, for the page's pipeline tabs;
- ``/metrics``: Prometheus text exposition (monitor/metrics.py), every pipeline's.

It is read-only: nothing it serves changes the job, and it reads the tracker under the
tracker's lock. It binds to loopback by default and then accepts only loopback Host headers
(a web page elsewhere cannot read it through DNS rebinding). Every request must carry the
job's token (``JobConfig.dashboard_token``, else a random one): ``Authorization: Bearer``
(scripts, Prometheus), the cookie a ``?token=`` link sets (the browser), or ``?token=``
itself. The printed address carries it, the Jupyter way: opening it sets the cookie and
redirects to the same page without the token. The listening socket is bound before the job
starts, so a taken port fails at once, and connections made before uvicorn's loop runs wait
in the backlog (no start-up race).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import socket
import threading
from types import TracebackType
from typing import Mapping
from urllib.parse import parse_qsl, quote, urlencode

import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request, cookie_parser
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from .controls import Controls
from .controls import routes as control_routes
from .docs import pipeline as pipeline_doc
from .metrics import JobMetrics
from .tracker import JobTracker

STATIC = os.path.join(os.path.dirname(__file__), "static")
#: The page loads only its own files; the API is same-origin.
_HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
            "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                                       "frame-ancestors 'none'",
            "Referrer-Policy": "no-referrer"}
#: Paths that answer scripts: a ``?token=`` there authenticates the request and is not redirected.
_API_PREFIXES = ("/api/", "/metrics")
_UNAUTHORIZED = ("This dashboard needs its token: open the address the job printed when it started "
                 "(it ends in ?token=...), or send 'Authorization: Bearer <token>'.\n")


class DashboardError(OSError):
    """The dashboard's port cannot be bound (in use, or not an address of this machine)."""


def cookie_name(port: int) -> str:
    """The token's cookie. Browsers share cookies across the ports of one host, so the name
    carries the port: two jobs' dashboards open side by side do not overwrite each other's."""
    return f"abs_engine_token_{port}"


class TokenMiddleware:
    """Lets through only requests that carry ``token`` (pure ASGI, inside TrustedHost).

    A request is authenticated when any of its bearer header, cookie or ``?token=`` equals
    the token (constant-time comparison of the UTF-8 bytes, so no input raises). A valid
    ``?token=`` on a GET/HEAD of a page (not /api/, not /metrics) answers 303 to the same
    path and query without it, setting the cookie: the token leaves the address bar, the
    history and any Referer. Anything else unauthenticated is a 401 that never echoes what
    was sent."""

    def __init__(self, app: ASGIApp, token: str, cookie: str):
        self.app = app
        self.token = token.encode()
        self.cookie = cookie

    def _valid(self, candidate: str | None) -> bool:
        return candidate is not None and hmac.compare_digest(candidate.encode("utf-8", "replace"), self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        scheme, _, credentials = headers.get("authorization", "").partition(" ")
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        in_query = [v for k, v in query if k == "token"]
        from_query = bool(in_query) and self._valid(in_query[-1])
        if not (from_query or (scheme.lower() == "bearer" and self._valid(credentials.strip()))
                or self._valid(cookie_parser(headers.get("cookie", "")).get(self.cookie))):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await PlainTextResponse(_UNAUTHORIZED, status_code=401, headers={
                **_HEADERS, "WWW-Authenticate": 'Bearer realm="abs-engine dashboard"'})(scope, receive, send)
            return
        path: str = scope["path"]
        if (from_query and scope["type"] == "http" and scope["method"] in ("GET", "HEAD")
                and not path.startswith(_API_PREFIXES)):
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            # path-absolute with one leading slash: never a protocol-relative "//host" redirect
            target = "/" + quote(path, safe="/:@!$&'()*+,;=-._~").lstrip("/") + ("?" + rest if rest else "")
            redirect = Response(status_code=303, headers={**_HEADERS, "Location": target})
            redirect.set_cookie(self.cookie, self.token.decode(), path="/", httponly=True, samesite="strict")
            await redirect(scope, receive, send)
            return
        await self.app(scope, receive, send)


def make_app(views: Mapping[str, JobTracker], metrics: JobMetrics, allowed_hosts: list[str] | None, token: str,
             cookie: str, controls: Controls | None = None) -> Starlette:
    """``views``: the job's pipelines' trackers by name, in pipeline order (one: the job's)."""
    first = next(iter(views.values()))

    def pick(request: Request) -> JobTracker | Response:
        name = request.query_params.get("pipeline")
        if name is None:
            return first
        tracker = views.get(name)
        if tracker is None:
            return JSONResponse({"error": f"no pipeline {name[:60]!r}: this job's are {list(views)}"},
                                status_code=404, headers=_HEADERS)
        return tracker

    async def index(request: Request) -> Response:
        return FileResponse(os.path.join(STATIC, "index.html"), headers=_HEADERS)

    async def pipelines(request: Request) -> Response:
        return JSONResponse({"pipelines": [pipeline_doc(name, tr) for name, tr in views.items()]}, headers=_HEADERS)

    async def job(request: Request) -> Response:
        tracker = pick(request)
        return tracker if isinstance(tracker, Response) else JSONResponse(tracker.job_doc(), headers=_HEADERS)

    async def checkpoints(request: Request) -> Response:
        tracker = pick(request)
        return tracker if isinstance(tracker, Response) else JSONResponse(tracker.checkpoints_doc(), headers=_HEADERS)

    async def checkpoint(request: Request) -> Response:
        tracker = pick(request)
        if isinstance(tracker, Response):
            return tracker
        raw = request.path_params["cid"]
        doc = tracker.checkpoint_doc(int(raw)) if raw.isdigit() and len(raw) < 19 else None
        if doc is None:
            return JSONResponse({"error": f"checkpoint {raw[:40]!r} is not known: not taken yet, or older than the "
                                          "history the dashboard keeps"}, status_code=404, headers=_HEADERS)
        return JSONResponse(doc, headers=_HEADERS)

    async def prometheus(request: Request) -> Response:
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8",
                        headers={"Cache-Control": "no-store"})

    # the Host check first: a rebinding page is refused before anything about the token is said
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)] if allowed_hosts else []
    middleware.append(Middleware(TokenMiddleware, token=token, cookie=cookie))
    return Starlette(routes=[
        Route("/", index), Route("/api/pipelines", pipelines), Route("/api/job", job),
        Route("/api/checkpoints", checkpoints),
        Route("/api/checkpoints/{cid}", checkpoint), Route("/metrics", prometheus),
        *control_routes(controls, _HEADERS),
        Mount("/static", StaticFiles(directory=STATIC)),
    ], middleware=middleware)


class Dashboard:
    """Serves ``tracker`` on ``host:port`` from a daemon thread, as a context manager: a
    job's tracker, or its pipelines' by name (executors/pipelined.py), one view each.

    ``token`` (None: a random one) is what every request must carry; ``url`` carries it.
    ``controls``: what the savepoint, stop and cancel buttons reach (monitor/controls.py),
    the whole job's."""

    def __init__(self, tracker: JobTracker | Mapping[str, JobTracker], host: str, port: int,
                 token: str | None = None, controls: Controls | None = None):
        views = dict(tracker) if isinstance(tracker, Mapping) else {tracker.plan.job: tracker}
        if not views:
            raise ValueError("a dashboard needs a job's tracker")
        try:
            self.sock = socket.create_server((host, port), family=_family(host), backlog=128)
        except OSError as e:
            raise DashboardError(e.errno, f"cannot serve the dashboard on {host}:{port} ({e.strerror}): pass another "
                                          "port, or 0 for any free one") from None
        bound = self.sock.getsockname()
        shown = f"[{host}]" if ":" in host else host
        self.token = token if token is not None else secrets.token_urlsafe(24)
        self.url = f"http://{shown}:{bound[1]}/?token={quote(self.token, safe='')}"
        loopback = _is_loopback(host)
        allowed = ["localhost", "127.0.0.1", "[::1]", "::1"] if loopback else None
        try:
            self.metrics = JobMetrics(views)
            app = make_app(views, self.metrics, allowed, self.token, cookie_name(bound[1]), controls)
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
