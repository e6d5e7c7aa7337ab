"""PendingCheckpoint: acknowledgement outcomes are values, never exceptions."""

from __future__ import annotations

from abs_engine.checkpoint.pending import AckOutcome, PendingCheckpoint, TaskSnapshot


def snap(n: int = 0) -> TaskSnapshot:
    return TaskSnapshot(file=f"t{n}.state", size=n, sha256="0" * 64, alignment_ms=float(n))


def pending(*tasks: str, final: bool = False) -> PendingCheckpoint:
    return PendingCheckpoint(checkpoint_id=5, started=10.0, tasks=frozenset(tasks), final=final)


def test_success_until_complete():
    p = pending("a#0", "b#0", "c#0")
    assert not p.complete
    assert p.missing == {"a#0", "b#0", "c#0"}
    assert p.acknowledge("b#0", snap(1)) is AckOutcome.SUCCESS
    assert p.missing == {"a#0", "c#0"}
    assert not p.complete
    assert p.acknowledge("a#0", snap(2)) is AckOutcome.SUCCESS
    assert not p.complete
    assert p.acknowledge("c#0", snap(3)) is AckOutcome.SUCCESS
    assert p.complete
    assert p.missing == set()
    assert p.acks == {"b#0": snap(1), "a#0": snap(2), "c#0": snap(3)}


def test_duplicate_keeps_first_snapshot():
    p = pending("a#0", "b#0")
    assert p.acknowledge("a#0", snap(1)) is AckOutcome.SUCCESS
    assert p.acknowledge("a#0", snap(9)) is AckOutcome.DUPLICATE
    assert p.acks == {"a#0": snap(1)}
    assert not p.complete
    assert p.missing == {"b#0"}


def test_unknown_task_is_not_recorded():
    p = pending("a#0")
    assert p.acknowledge("zz#3", snap(1)) is AckOutcome.UNKNOWN
    assert p.acks == {}
    assert not p.complete
    assert p.acknowledge("a#0", snap(1)) is AckOutcome.SUCCESS
    assert p.complete
    # a stray after completion is still UNKNOWN, and does not change completeness
    assert p.acknowledge("zz#3", snap(1)) is AckOutcome.UNKNOWN
    assert p.complete


def test_discarded_rejects_everything_and_is_never_complete():
    p = pending("a#0", "b#0")
    assert p.acknowledge("a#0", snap(1)) is AckOutcome.SUCCESS
    p.discard()
    assert p.discarded
    assert p.acknowledge("b#0", snap(2)) is AckOutcome.DISCARDED
    assert p.acknowledge("a#0", snap(1)) is AckOutcome.DISCARDED  # would be DUPLICATE otherwise
    assert p.acknowledge("zz#0", snap(1)) is AckOutcome.DISCARDED  # would be UNKNOWN otherwise
    assert "b#0" not in p.acks
    assert not p.complete


def test_discard_after_all_acks_makes_incomplete():
    p = pending("a#0")
    p.acknowledge("a#0", snap(1))
    assert p.complete
    p.discard()
    assert not p.complete


def test_defaults():
    p = pending("a#0")
    assert p.final is False
    assert p.discarded is False
    assert p.triggered_directly == set()
    assert pending("a#0", final=True).final is True
    # every instance gets its own containers
    q = pending("a#0")
    p.acknowledge("a#0", snap(1))
    p.triggered_directly.add("a#0")
    assert q.acks == {} and q.triggered_directly == set()
