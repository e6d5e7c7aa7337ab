"""Asynchronous snapshots by fork (runtime/snapshot_encoding.py): the forked child encodes
exactly the state at the fork whatever the parent does next, byte for byte what the inline
path writes; it holds no descriptor of the worker's; it dies with its parent; a state that
cannot be encoded fails naming the operator; and a job whose every snapshot forks is exact
under SIGKILLs, with the task thread's and the async share of each snapshot reported."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from abs_engine.errors import SerializationError
from abs_engine.runtime import snapshot_encoding
from abs_engine.runtime.output import OperatorFailure

BIG = 200_000  #: entries: the encoded state is far larger than a pipe's buffer


def _wait_until(cond, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    """Poll ``cond`` until it holds or ``timeout`` passes (observing another process)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return bool(cond())


def test_forked_and_inline_encodings_are_identical():
    states = {"count": {f"w{i}": i for i in range(1000)}, "src": {"offset": 42}}
    inline = snapshot_encoding.start(states, mode="inline")
    forked = snapshot_encoding.start(states, mode="fork")
    assert isinstance(inline, snapshot_encoding.Inline) and isinstance(forked, snapshot_encoding.Forked)
    assert forked.result() == inline.result()


def test_auto_forks_only_large_states_and_only_with_a_core_to_spare(monkeypatch):
    big_state = {"a": dict.fromkeys(range(snapshot_encoding.AUTO_MIN_ENTRIES), 0)}
    monkeypatch.setattr(snapshot_encoding, "_spare_core", lambda: True)
    assert isinstance(snapshot_encoding.start({"a": {1: 2}}, "auto"), snapshot_encoding.Inline)
    big = snapshot_encoding.start(big_state, "auto")
    assert isinstance(big, snapshot_encoding.Forked)
    big.result()
    monkeypatch.setattr(snapshot_encoding, "_spare_core", lambda: False)  # a saturated machine
    assert isinstance(snapshot_encoding.start(big_state, "auto"), snapshot_encoding.Inline)


def test_the_child_encodes_the_state_at_the_fork_whatever_the_parent_does_next():
    state = {i: i for i in range(BIG)}
    expected = snapshot_encoding.start({"op": dict(state)}, mode="inline").result()
    enc = snapshot_encoding.start({"op": state}, mode="fork")
    for i in range(BIG):  # the task goes on processing while the child encodes
        state[i] = -i
    state["new"] = 1
    assert enc.result() == expected


def test_the_child_holds_no_descriptor_of_the_worker():
    r, w = os.pipe()  # stands for a channel or the control link
    enc = snapshot_encoding.start({"op": {i: i for i in range(BIG)}}, mode="fork")
    assert isinstance(enc, snapshot_encoding.Forked)
    try:
        fds = f"/proc/{enc.pid}/fd"
        # The child blocks writing its result (the parent has not read yet), its descriptors closed.
        assert _wait_until(lambda: len(os.listdir(fds)) <= 4), os.listdir(fds)
        assert str(r) not in os.listdir(fds) or r <= 2
    finally:
        enc.result()
        os.close(r)
        os.close(w)


def test_a_state_msgpack_cannot_encode_fails_naming_the_operator():
    enc = snapshot_encoding.start({"good": {1: 1}, "opaque": {"x": object()}}, mode="fork")
    with pytest.raises(OperatorFailure) as info:
        enc.result()
    assert info.value.operator == "opaque" and info.value.fatal
    assert isinstance(info.value.__cause__, SerializationError)
    with pytest.raises(OperatorFailure):
        snapshot_encoding.start({"opaque": {"x": object()}}, mode="inline")


def test_the_child_dies_with_its_parent():
    code = (f"import os, signal; from abs_engine.runtime import snapshot_encoding as s\n"
            f"e = s.start({{'op': {{i: i for i in range({BIG})}}}}, mode='fork')\n"
            "print(e.pid, flush=True); os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    child = int(proc.stdout.split()[0])

    def gone() -> bool:
        try:
            with open(f"/proc/{child}/stat") as f:
                return f.read().split(") ")[1][0] in "ZX"  # a zombie is dead, awaiting its reaper
        except FileNotFoundError:
            return True

    assert _wait_until(gone)


@pytest.mark.slow
def test_wordcount_whose_every_snapshot_forks_is_exact_under_sigkills(medium_corpus, tmp_path):
    from abs_engine.testing import KillOnCheckpoints
    from tests.abs_engine.executors.test_recovery import as_counts, output_lines, wordcount
    from tests.chaos_checks import assert_each_kill_restored
    from tests.conftest import batch_word_count

    out, gate = str(tmp_path / "out.tsv"), str(tmp_path / "gate")
    chaos = KillOnCheckpoints([1, 2, 3], seed=21, open_gate=gate)  # (held half-way until the kills)
    res = wordcount(medium_corpus, out, 2, gate).run(checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"),
                                                     chaos=chaos, restart_delay=0, snapshot_encoding="fork")
    assert as_counts(output_lines(out)) == batch_word_count(medium_corpus)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert all(c.max_sync_ms > 0 and c.max_async_ms > 0 for c in res.checkpoints)
