"""The failure manager (executors/failover.py), decision by decision: retry until the
restart attempts run out; a fatal failure, a poison record or an operator stuck twice fail
at once, naming why; a checkpoint that could not be restored is marked unusable."""

from __future__ import annotations

from abs_engine.executors.failover import Decision, FailureManager
from abs_engine.executors.failures import WorkerFailure
from abs_engine.messages import FailureCause


def failure(cause: FailureCause | None = FailureCause.OPERATOR, operator: str | None = "parse", digest: str = "",
            fatal: bool = False) -> WorkerFailure:
    return WorkerFailure("parse#0", operator, "raised an exception", "Traceback\nValueError: bad", fatal,
                         record="'x'" if digest else "", digest=digest, cause=cause)


def test_retries_until_the_restart_attempts_run_out() -> None:
    fm = FailureManager(restart_attempts=2)
    assert fm.on_failure(failure(), 0, None).decision is Decision.RESTART
    assert fm.on_failure(failure(), 1, None).decision is Decision.RESTART
    v = fm.on_failure(failure(), 2, None)
    assert v.decision is Decision.FAIL and "failed 3 time(s), restart attempts exhausted" in v.why


def test_a_worker_that_died_is_retried_like_any_other() -> None:
    assert FailureManager(1).on_failure(failure(cause=None, operator=None), 0, 5).decision is Decision.RESTART


def test_a_fatal_failure_fails_at_once() -> None:
    v = FailureManager(10).on_failure(failure(fatal=True), 0, None)
    assert v.decision is Decision.FAIL and v.why == "cannot be retried"


def test_the_same_record_failing_again_is_a_poison_record() -> None:
    fm = FailureManager(10)
    assert fm.on_failure(failure(digest="d1"), 0, None).decision is Decision.RESTART
    assert fm.on_failure(failure(digest="d2"), 1, None).decision is Decision.RESTART  # another record
    assert fm.on_failure(failure(operator="other", digest="d1"), 2, None).decision is Decision.RESTART
    v = fm.on_failure(failure(digest="d1"), 3, None)
    assert v.decision is Decision.FAIL and "poison record" in v.why and "on_error='skip'" in v.why


def test_an_operator_stuck_twice_fails() -> None:
    fm = FailureManager(10)
    assert fm.on_failure(failure(cause=FailureCause.STUCK), 0, None).decision is Decision.RESTART
    v = fm.on_failure(failure(cause=FailureCause.STUCK), 1, None)
    assert v.decision is Decision.FAIL and "stuck again" in v.why and "task_timeout" in v.why


def test_a_checkpoint_that_could_not_be_restored_is_marked_unusable() -> None:
    fm = FailureManager(10)
    assert fm.on_failure(failure(cause=FailureCause.RESTORE, operator=None), 0, 7).decision is Decision.RESTART
    assert fm.unusable == {7: "ValueError: bad"}
    fm.on_failure(failure(cause=FailureCause.RESTORE, operator=None), 1, None)  # restored nothing: nothing marked
    assert set(fm.unusable) == {7}
