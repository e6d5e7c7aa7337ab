"""Why an attempt failed (WorkerFailure): what the master classifies (retry, poison record,
fatal) and what the user, the log and the dashboard are told.
"""

from __future__ import annotations

import time

from ..messages import Failed, FailureCause


def error_line(traceback: str | None) -> str:
    """The exception line of a traceback ("ValueError: bad input"), shortened."""
    lines = [ln for ln in (traceback or "").strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    last = lines[-1].strip()
    return last if len(last) <= 300 else last[:300] + "..."


def _error_type(traceback: str | None) -> str:
    """The exception's type from its line ("ValueError" of "ValueError: bad input"), or ""."""
    head = error_line(traceback).split(":", 1)[0].strip()
    return head if head.replace(".", "").replace("_", "").isalnum() else ""


class WorkerFailure(Exception):
    """Why an attempt failed: the task, the operator, what happened and (when an operator
    failed on a record) the record and its digest.

    ``str()`` is the whole story, for the driver's log and the JobFailed the user gets;
    ``public`` leaves out what may hold the job's data (the record, the exception's
    message): it is what the dashboard, the metrics and the stored statistics show, which
    people other than the job's owner may see."""

    def __init__(self, task: str, operator: str | None, detail: str, traceback: str | None = None,
                 fatal: bool = False, record: str = "", digest: str = "", error_type: str = "",
                 cause: FailureCause | None = None):
        text = f"task {task}" + (f", operator {operator!r}" if operator else "") + f": {detail}"
        self.public = text
        error = error_line(traceback)
        if error and cause is not None:
            text += f": {error}"
            kind = error_type or _error_type(traceback)
            self.public += f": {kind}" if kind else ""
        if record:
            text += f"; record: {record}"
        if self.public != text:
            self.public += " (the message and the record are in the driver's log)"
        super().__init__(text)
        self.task = task
        self.operator = operator
        self.traceback = traceback
        self.fatal = fatal
        self.time = time.time()  #: when it was seen (recovery statistics: before the teardown)
        self.record = record
        self.digest = digest
        #: What the task said went wrong (None: it said nothing: it died, or the driver saw it).
        self.cause = cause

    @classmethod
    def of(cls, msg: Failed, detail: str | None = None) -> "WorkerFailure":
        """The failure a task reported."""
        what = detail or DETAIL[msg.cause]
        if msg.cause is FailureCause.UPSTREAM_LOST and msg.peer:
            what += f" ({msg.peer})"
        return cls(msg.task, msg.operator, what, msg.traceback, msg.fatal, msg.record, msg.digest, msg.error_type,
                   msg.cause)


#: What each cause says in a failure's message.
DETAIL = {
    FailureCause.OPERATOR: "raised an exception",
    FailureCause.STUCK: "was stuck",
    FailureCause.LOOP_NOT_QUIET: "sent records round a loop proven drained",
    FailureCause.UPSTREAM_LOST: "lost an input whose producer went away",
    FailureCause.DOWNSTREAM_LOST: "lost a consumer it was sending to",
    FailureCause.RESTORE: "could not restore its checkpoint",
    FailureCause.WRITER: "its snapshot writer failed",
    FailureCause.SETUP: "cannot run",
    FailureCause.RUNTIME: "failed in the engine",
}
