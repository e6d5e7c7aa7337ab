"""What signals ask of a running job, from the signal handlers to the driver's loop.

SIGTERM or Ctrl-C asks for a savepoint and a clean stop (its sinks committed); a second
one stops at once (KeyboardInterrupt). SIGUSR2 asks for a savepoint and goes on (``abs-engine
savepoint`` sends it). The handlers only set flags: the attempt's driver
(attempt_driver.py) reads them, and sets ``stop_requested`` itself for ``abs-engine
savepoint --stop``, so a signal after that stops at once too. The flags outlive an attempt:
a stop asked for before a failover is carried out by the next attempt.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Callable, Iterator


class Signals:
    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.stop_requested = False  #: stop with a savepoint (a signal, or ``savepoint --stop``)
        self.savepoint_requested = False  #: a savepoint, and go on (SIGUSR2)

    @contextlib.contextmanager
    def handled(self, enabled: bool) -> Iterator[None]:
        """While the job runs, these signals are handled as above (``enabled``, and only on
        the main thread: Python delivers signals there alone); the handlers before are
        put back after."""
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: Any) -> None:
            if self.stop_requested:
                raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping without a savepoint")
            self.stop_requested = True
            self.log(f"{signal.Signals(signum).name}: taking a savepoint, then stopping "
                     "(send it again to stop at once)")

        def on_savepoint(signum: int, frame: Any) -> None:
            self.savepoint_requested = True

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        previous[signal.SIGUSR2] = signal.signal(signal.SIGUSR2, on_savepoint)
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
