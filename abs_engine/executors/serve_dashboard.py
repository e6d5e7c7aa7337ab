"""Serving a job's dashboard while it runs (``dashboard=PORT``): one page for the job, with
a view per pipeline when it has several (executors/pipelined.py), and its controls.

Invariant: the controls only ask (``requests``: ``submit(stop)`` and ``cancel(why)``, as
executors/requests.py's), and every control is announced on stderr whatever ``progress``
says: what someone did to the job is never silent.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator, Mapping

from ..monitor.tracker import JobTracker
from .config import JobConfig


@contextlib.contextmanager
def serve_dashboard(views: JobTracker | Mapping[str, JobTracker], config: JobConfig, requests: Any,
                    prefix: str) -> Iterator[str]:
    """Serve ``views`` (a tracker, or the pipelines' by name) as ``config`` says while the
    block runs; yields the dashboard's address ("": none asked for)."""
    if config.dashboard is None:
        yield ""
        return
    from ..monitor.controls import Controls
    from ..monitor.dashboard import Dashboard

    def announce(msg: str) -> None:
        print(f"[{prefix}] {msg}", file=sys.stderr, flush=True)

    with Dashboard(views, config.dashboard_host, config.dashboard, token=config.dashboard_token,
                   controls=Controls(requests, announce)) as board:
        announce(f"dashboard: {board.url}")
        yield board.url
