"""The dashboard's controls: take a savepoint, stop the job with a savepoint, cancel it.

``POST /api/controls/savepoint``, ``/stop`` and ``/cancel`` behind the dashboard's token
(dashboard.py), each logged by the driver with who asked. The page asks for a confirmation
before it posts; the API answers with the savepoint's location (or why there is none) once
it is written, or that the cancel was asked for.

Invariants: a control only asks (executors/requests.py): the job master acts on it between
its own steps, as it does for ``abs-engine savepoint`` and signals, so nothing here races
the job. A GET changes nothing (405); a cross-site form cannot post, because the token's
cookie is SameSite=Strict and a request must also say ``Content-Type: application/json``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

WAIT = 300.0  #: seconds a savepoint request waits for its savepoint at most


class Controls:
    """What the dashboard's controls reach: the job's savepoint requests and its log."""

    def __init__(self, requests: Any, log: Callable[[str], None]):
        self.requests, self.log = requests, log


def routes(controls: Controls | None, headers: dict[str, str]) -> list[Route]:
    async def act(request: Request) -> Response:
        op = request.path_params["op"]
        if op not in ("savepoint", "stop", "cancel"):
            return JSONResponse({"error": f"no control {op[:40]!r}: savepoint, stop or cancel"}, status_code=404,
                                headers=headers)
        if controls is None:
            return JSONResponse({"error": "this dashboard has no controls (a report, or a job run without them)"},
                                status_code=404, headers=headers)
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return JSONResponse({"error": "a control is a POST of application/json (the dashboard's buttons send "
                                          "one)"}, status_code=415, headers=headers)
        who = request.client.host if request.client is not None else "?"
        if op == "cancel":
            controls.log(f"cancel asked from the dashboard (client {who}): stopping at once, no savepoint")
            if not controls.requests.cancel(f"the dashboard's cancel (client {who})"):
                return JSONResponse({"error": "the job has ended already"}, status_code=409, headers=headers)
            return JSONResponse({"cancelled": True}, headers=headers)
        stop = op == "stop"
        controls.log(f"{'stop with a savepoint' if stop else 'a savepoint'} asked from the dashboard (client {who})")
        future = controls.requests.submit(stop)
        try:
            location = await asyncio.wait_for(asyncio.wrap_future(future), WAIT)
        except asyncio.TimeoutError:
            return JSONResponse({"error": f"no savepoint within {WAIT:g} s (the job may be restarting); it is still "
                                          "asked for"}, status_code=504, headers=headers)
        except Exception as e:  # noqa: BLE001 - the reason there is none, said to the page
            return JSONResponse({"error": str(e)}, status_code=409, headers=headers)
        controls.log(f"savepoint for the dashboard: {location}")
        return JSONResponse({"savepoint": location, "stopping": stop}, headers=headers)

    return [Route("/api/controls/{op:str}", act, methods=["POST"])]
