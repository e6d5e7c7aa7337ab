"""The failure manager beside the coordinator: what a failed attempt means for the job.

Pure decisions, no I/O: given a WorkerFailure and how many attempts ran, the job either
restarts (global failover from the newest valid checkpoint) or fails, with the reason the
user reads. The rules, in order:
- a failure its task marks fatal (state that cannot be encoded, an output that changed
  under a sink, a loop that overflows) fails at once: retrying cannot help;
- the same record failing the same operator again after a restart (a poison record), or
  the same operator stuck again, fails at once;
- otherwise the restart strategy retries, ``restart_attempts`` times.
A task that could not read back its checkpoint marks that checkpoint unusable, so the next
attempt falls back to an older one instead of failing the same way.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..messages import FailureCause
from .failures import WorkerFailure, error_line


class Decision(enum.Enum):
    RESTART = "restart"
    FAIL = "fail"


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    why: str = ""  #: FAIL: why retrying cannot help, for the JobFailed message


@dataclass
class FailureManager:
    restart_attempts: int
    #: (operator, record digest or "stuck") of failures seen: the same again is a poison record.
    seen: set[tuple[str | None, str]] = field(default_factory=set)
    #: Checkpoints a worker failed to read back: the next attempt skips them (with the reason).
    unusable: dict[int, str] = field(default_factory=dict)

    def on_failure(self, f: WorkerFailure, attempt: int, restored: int | None) -> Verdict:
        """Attempt ``attempt`` (0 first), restored from checkpoint ``restored``, failed with ``f``."""
        if f.cause is FailureCause.RESTORE and restored is not None:
            self.unusable[restored] = error_line(f.traceback) or str(f)
        # A record, or a stuck operator: the same again after a restart cannot pass.
        again = f.digest or ("stuck" if f.cause is FailureCause.STUCK else "")
        repeat = bool(again) and (f.operator, again) in self.seen
        if again:
            self.seen.add((f.operator, again))
        if repeat and f.cause is FailureCause.STUCK:
            return Verdict(Decision.FAIL, "got stuck again in the same operator after a restart, so retrying "
                                          "cannot help (raise task_timeout if the call is only slow)")
        if repeat:
            return Verdict(Decision.FAIL, "failed again on the same record after a restart (a poison record: "
                                          "retrying cannot help; fix the function, or pass on_error='skip' to "
                                          "that operator)")
        if f.fatal:
            return Verdict(Decision.FAIL, "cannot be retried")
        if attempt >= self.restart_attempts:
            return Verdict(Decision.FAIL, f"failed {attempt + 1} time(s), restart attempts exhausted")
        return Verdict(Decision.RESTART)
