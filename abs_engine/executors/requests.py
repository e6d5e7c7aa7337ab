"""Savepoints asked for while the job runs (``abs-engine savepoint DIR [--stop]``), from
the control endpoint's threads to the driver's loop and back.

A request is a future the endpoint waits on. The driver's loop ``take``s the requests not
yet handed to the current attempt (a request handed to an attempt that then failed is
handed again to the next one: a failover does not lose it), and ``taken`` resolves every
request handed so far with the savepoint's location. ``close`` fails what is still open
when the job ends. Invariant: every future is resolved exactly once.
"""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass, field


@dataclass
class _Request:
    stop: bool
    future: "concurrent.futures.Future[str]" = field(default_factory=concurrent.futures.Future)
    handed_to: int = -1  #: the attempt that was asked to take it (-1: none yet)


class SavepointRequests:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: list[_Request] = []
        self._closed = ""
        #: Why the job was asked to stop at once, without a savepoint (the dashboard's
        #: cancel); "" while nobody has. Read by the attempt's loop, set from any thread.
        self.cancelled = ""

    def cancel(self, why: str) -> bool:
        """Ask the job to stop at once (its workers killed, its checkpoints kept): False if
        it has ended already."""
        with self._lock:
            if self._closed:
                return False
            self.cancelled = self.cancelled or why
        return True

    def submit(self, stop: bool) -> "concurrent.futures.Future[str]":
        """A request (from any thread): a savepoint, and then a stop if ``stop``."""
        request = _Request(stop)
        with self._lock:
            if self._closed:
                request.future.set_exception(RuntimeError(self._closed))
            else:
                self._open.append(request)
        return request.future

    def take(self, attempt: int) -> list[bool]:
        """The requests attempt ``attempt`` has not been handed yet: their ``stop`` flags."""
        with self._lock:
            new = [r for r in self._open if r.handed_to != attempt]
            for r in new:
                r.handed_to = attempt
        return [r.stop for r in new]

    def taken(self, location: str) -> None:
        """A savepoint was written at ``location``: it answers every request handed out."""
        with self._lock:
            done = [r for r in self._open if r.handed_to >= 0]
            self._open = [r for r in self._open if r.handed_to < 0]
        for r in done:
            r.future.set_result(location)

    def close(self, why: str) -> None:
        """The job ended: the requests still open fail with ``why``, and so do later ones."""
        with self._lock:
            self._closed = why
            left, self._open = self._open, []
        for r in left:
            r.future.set_exception(RuntimeError(why))
