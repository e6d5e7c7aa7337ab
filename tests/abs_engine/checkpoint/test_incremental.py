"""Incremental checkpoints: the delta format, chains in metadata, verification and
fallback through shared files, retention that never deletes a referenced file, and the
bytes a checkpoint writes after touching k keys."""

from __future__ import annotations

import collections
import hashlib
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from abs_engine import codec, messages
from abs_engine.checkpoint.coordinator import CheckpointCoordinator
from abs_engine.checkpoint.incremental import ChainRef, apply, delta
from abs_engine.checkpoint.remote import open_storage
from abs_engine.checkpoint.savepoint import write_savepoint
from abs_engine.checkpoint.metadata import FileRef, Metadata
from abs_engine.checkpoint.safe_io import FORMAT_VERSION, METADATA, write_state_file
from abs_engine.checkpoint.storage import CheckpointStorage
from abs_engine.errors import CheckpointError, CheckpointErrorReason
from abs_engine.checkpoint import snapshot_file
from abs_engine.runtime import snapshot_encoding
from abs_engine.runtime.increments import PAUSE, Increments
from operators.keyed import Count, CountFinal

R = CheckpointErrorReason


# ---- the delta format -------------------------------------------------------------------------


def roundtrip(obj):
    return codec.unpack_state(codec.pack(obj))


def test_a_delta_holds_the_changed_keys_and_applies_exactly():
    old = {"a": 1, "b": 2, (1, "x"): [3], "gone": 4}
    new = {"a": 1, "b": 5, (1, "x"): [3, 4], "c": 6}
    d = delta(new, {"b", (1, "x"), "c", "gone"})
    assert d == {"upserts": {"b": 5, (1, "x"): [3, 4], "c": 6}, "deletes": {"gone": None}}
    # through msgpack, as a restore sees both (tuple keys decode alike in state and delta)
    assert apply(roundtrip(old), roundtrip(d)) == roundtrip(new)


def test_a_malformed_delta_is_refused():
    with pytest.raises(ValueError):
        apply({}, {"upserts": {}})
    with pytest.raises(ValueError):
        apply([1, 2], {"upserts": {}, "deletes": {}})


# ---- files as tasks write them ------------------------------------------------------------------


class SimTask:
    """One task as runtime/task.py runs it, without processes: a Count operator, the real
    Increments, the real encoder and state-file writer. ``model`` keeps a copy of the
    state at each snapshot: the oracle a restore must reproduce."""

    def __init__(self, name: str, root: str, op_type: type = Count):
        self.name, self.root = name, root
        self.op = op_type()
        self.inc = Increments([("count", self.op)], True)
        self.model: dict[int, dict[object, int]] = {}

    def process(self, keys: list[object]) -> None:
        self.op.process(keys)

    def snapshot(self, cid: int) -> messages.Ack:
        states = {"count": self.op.snapshot(cid)}
        self.model[cid] = dict(self.op.state)
        base, deltas, entries = self.inc.prepare(cid, states)
        enc = snapshot_encoding.start(states, "inline", entries)
        blob = snapshot_file.encode(self.name, cid, enc.result(), {}, False, base, deltas)
        name = f"{self.name}.state"
        write_state_file(self.root, cid, name, blob)
        return messages.Ack(cid, self.name, name, len(blob), hashlib.sha256(blob).hexdigest(), 0.0, 0, False,
                            base=base, known=self.inc.known)


@pytest.mark.parametrize("op_type", [Count, CountFinal])  # values recorded; keys recorded, values looked up
def test_after_touching_k_keys_a_checkpoint_writes_o_k_bytes(tmp_path, op_type):
    root = str(tmp_path / "ck")
    os.makedirs(root)
    task = SimTask("count#0", root, op_type)
    n = 100_000
    task.process([f"key-{i}" for i in range(n)])
    full = task.snapshot(1)
    assert full.base is None and full.size > 10 * n  # the whole state
    task.inc.completed(1)
    sizes = {}
    for cid, k in enumerate([1, 10, 100, 1000, 10_000], start=2):
        task.process([f"key-{i}" for i in random.Random(k).sample(range(n), k)])
        ack = task.snapshot(cid)
        assert ack.base == cid - 1
        task.inc.completed(cid)
        sizes[k] = ack.size
    # Linear in k (about 17 bytes a key here), with a small constant: never the state's size.
    for k, size in sizes.items():
        assert size <= 200 + 30 * k, (k, size)
    assert sizes[10_000] > 10 * sizes[100] > 100 * 0 + sizes[1]
    assert sizes[10_000] < full.size / 5


def test_a_delta_is_relative_to_the_newest_completed_base_even_when_completions_lag(tmp_path):
    root = str(tmp_path / "ck")
    os.makedirs(root)
    task = SimTask("t", root)
    task.process(list(range(5000)))
    assert task.snapshot(1).base is None
    task.inc.completed(1)
    task.process([1, 2])
    assert task.snapshot(2).base == 1
    task.process([3])
    ack3 = task.snapshot(3)  # 2 is not complete yet: still on 1, holding 1, 2 and 3
    assert ack3.base == 1 and ack3.known == 1
    task.inc.completed(3)  # 3 completes first (2 was subsumed)
    task.process([4])
    assert task.snapshot(4).base == 3


def test_a_full_file_after_max_chain_deltas_and_when_too_much_of_the_state_changed(tmp_path):
    root = str(tmp_path / "ck")
    os.makedirs(root)
    task = SimTask("t", root)
    task.inc.max_chain = 3
    task.process(list(range(4000)))
    bases = []
    for cid in range(1, 8):
        task.process([cid])
        bases.append(task.snapshot(cid).base)
        task.inc.completed(cid)
    assert bases == [None, 1, 2, 3, None, 5, 6]
    task.inc.completed(7)
    task.process(list(range(2500)))  # more than half of the state: written whole...
    assert task.snapshot(8).base is None
    task.inc.completed(8)
    assert task.op.changed is None  # ...and tracking pauses: it did not pay
    for cid in range(9, 9 + PAUSE):
        task.process([cid])
        assert task.snapshot(cid).base is None
        task.inc.completed(cid)
    assert task.op.changed is not None  # tracking again from snapshot 8 + PAUSE on
    task.process([1])
    assert task.snapshot(9 + PAUSE).base == 8 + PAUSE


# ---- metadata, verification, fallback -----------------------------------------------------------


def complete(storage: CheckpointStorage, coord: CheckpointCoordinator, acks: list[messages.Ack]) -> Metadata:
    meta = None
    for a in acks:
        _, meta = coord.on_ack(a)
    assert meta is not None
    return meta


def coordinator(storage: CheckpointStorage, tasks: list[str], **kw) -> CheckpointCoordinator:
    clock = [0.0]
    c = CheckpointCoordinator("job", "fp", tasks, list(tasks), storage, interval=1.0, timeout=5.0,
                              clock=lambda: clock[0], **kw)
    c.clock_cell = clock  # type: ignore[attr-defined]
    c.start()
    return c


def trigger(coord: CheckpointCoordinator) -> int:
    coord.clock_cell[0] += 1.0  # type: ignore[attr-defined]
    out = coord.poll()
    ids = {m.checkpoint_id for _, m in out if isinstance(m, messages.Trigger)}
    assert len(ids) == 1, out
    return ids.pop()


def run_chain(tmp_path, n: int, retain: int = 3):
    storage = CheckpointStorage(str(tmp_path / "ck"), retain=retain)
    os.makedirs(storage.root)
    tasks = [SimTask(f"count#{i}", storage.root) for i in range(2)]
    coord = coordinator(storage, [t.name for t in tasks])
    for t in tasks:
        t.process([(t.name, i) for i in range(3000)])
    metas = []
    for step in range(n):
        cid = trigger(coord)
        for t in tasks:
            t.process([(t.name, step)])
        metas.append(complete(storage, coord, [t.snapshot(cid) for t in tasks]))
        for t in tasks:
            t.inc.completed(cid)
    return storage, tasks, metas


def test_chains_are_recorded_and_a_restore_resolves_them(tmp_path):
    storage, tasks, metas = run_chain(tmp_path, 4)
    last = metas[-1]
    assert [r.checkpoint_id for r in last.chains["count#0"]] == [1, 2, 3]
    with open(os.path.join(storage.dir_of(4), METADATA), "rb") as f:
        assert codec.unpack(f.read())["version"] == FORMAT_VERSION  # older engines refuse it
    got, _ = storage.latest_valid("fp")
    assert got is not None and got.chains == last.chains
    for t in tasks:
        assert storage.read_state(4, t.name)["count"] == t.model[4]
    # Checkpoint 1 is beyond retention (3): no longer a checkpoint, but its files stay.
    assert storage.completed_ids() == [2, 3, 4]
    assert sorted(os.listdir(storage.dir_of(1))) == ["count#0.state", "count#1.state"]


def test_a_corrupt_shared_file_fails_verification_and_recovery_falls_back(tmp_path):
    storage, tasks, metas = run_chain(tmp_path, 5, retain=10)
    # Files of checkpoint 2 are in the chains of 3, 4 and 5; flip one byte of one of them.
    path = os.path.join(storage.dir_of(2), "count#1.state")
    with open(path, "r+b") as f:
        f.seek(20)
        b = f.read(1)
        f.seek(20)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(CheckpointError) as info:
        storage.verify(5)
    assert info.value.reason is R.CHECKSUM_MISMATCH and "count#1.state" in str(info.value)
    meta, skipped = storage.latest_valid("fp")
    assert meta is not None and meta.checkpoint_id == 1  # the full one, before the damage
    assert [e.checkpoint_id for e in skipped] == [5, 4, 3, 2]
    assert storage.read_state(1, "count#1")["count"] == tasks[1].model[1]


def test_a_missing_shared_file_fails_verification(tmp_path):
    storage, _, _ = run_chain(tmp_path, 3, retain=10)
    os.unlink(os.path.join(storage.dir_of(1), "count#0.state"))
    with pytest.raises(CheckpointError) as info:
        storage.verify(3)
    assert info.value.reason is R.MISSING_FILE


def test_a_chain_that_leaves_the_directory_is_refused(tmp_path):
    storage, _, metas = run_chain(tmp_path, 2, retain=10)
    ref = metas[-1].chains["count#0"][0]
    bad = Metadata(**{**metas[-1].__dict__, "chains": {"count#0": [ChainRef(ref.checkpoint_id, "../../etc/passwd",
                                                                           ref.size, ref.sha256)]}})
    storage.store.put_metadata(2, __import__("abs_engine.checkpoint.storage", fromlist=["x"]).encode_metadata(bad))
    with pytest.raises(CheckpointError) as info:
        storage.load_metadata(2)
    assert info.value.reason is R.UNSAFE_PATH


def test_a_delta_file_named_as_full_in_metadata_is_refused(tmp_path):
    """Metadata without the chain a delta file needs cannot restore it as if it were whole."""
    storage, _, metas = run_chain(tmp_path, 2, retain=10)
    stripped = Metadata(**{**metas[-1].__dict__, "chains": {}})
    from abs_engine.checkpoint.metadata import encode_metadata

    storage.store.put_metadata(2, encode_metadata(stripped))
    with pytest.raises(CheckpointError) as info:
        storage.verify(2)
    assert info.value.reason is R.CORRUPT_STATE


def test_a_savepoint_of_an_incremental_checkpoint_is_self_contained(tmp_path):
    storage, tasks, metas = run_chain(tmp_path, 4)
    where = write_savepoint(storage, metas[-1], str(tmp_path / "sp"))
    import shutil

    shutil.rmtree(storage.root)  # the checkpoints are gone: the savepoint stands alone
    sp = open_storage(where)
    meta, skipped = sp.latest_valid("fp")
    assert meta is not None and meta.checkpoint_id == 4 and not skipped
    for t in tasks:
        assert sp.read_state(4, t.name)["count"] == t.model[4]


# ---- retention never deletes a referenced file --------------------------------------------------


# Weighted so that checkpoints complete, get told late, and chains grow past retention.
ACTIONS = ["process"] * 2 + ["trigger"] * 2 + ["snapshot"] * 4 + ["ack"] * 4 + ["notify"] * 3 + ["abort", "savepoint"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_retention_never_deletes_a_file_a_checkpoint_savepoint_or_task_needs(tmp_path_factory, data):
    """Random interleavings of processing, triggers, acknowledgements, completions told late,
    aborts and savepoints, with random retention: after every step every retained
    checkpoint and savepoint restores exactly the state its tasks had, and every file a task
    may still build a delta on is on disk."""
    tmp = tmp_path_factory.mktemp("prop")
    retain = data.draw(st.integers(1, 3), label="retain")
    storage = CheckpointStorage(str(tmp / "ck"), retain=retain)
    os.makedirs(storage.root)
    op_type = data.draw(st.sampled_from([Count, CountFinal]), label="operator")
    tasks = {f"t#{i}": SimTask(f"t#{i}", storage.root, op_type) for i in range(2)}
    for t in tasks.values():
        t.inc.max_chain = data.draw(st.integers(1, 4), label="max_chain")
        t.process(list(range(2000)))
    coord = coordinator(storage, list(tasks), max_in_flight=2)
    acks: dict[str, collections.deque[messages.Ack]] = {t: collections.deque() for t in tasks}
    notes: dict[str, collections.deque[int]] = {t: collections.deque() for t in tasks}
    pending: dict[int, set[str]] = {}  # triggered, not yet snapshotted by these tasks
    savepoints: list[tuple[str, int]] = []
    for _ in range(data.draw(st.integers(20, 120), label="steps")):
        action = data.draw(st.sampled_from(ACTIONS))
        busy = {"snapshot": [t for t in tasks if any(t in ts for ts in pending.values())],
                "ack": [t for t in tasks if acks[t]], "notify": [t for t in tasks if notes[t]]}.get(action, list(tasks))
        if not busy:
            continue
        name = data.draw(st.sampled_from(sorted(busy)))
        if action == "process":
            tasks[name].process(data.draw(st.lists(st.integers(0, 2500), max_size=50)))
        elif action == "trigger":
            coord.clock_cell[0] += 1.0  # type: ignore[attr-defined]
            for t, m in coord.poll():
                if isinstance(m, messages.Trigger):
                    pending.setdefault(m.checkpoint_id, set()).add(t)
        elif action == "snapshot":
            todo = sorted(c for c, ts in pending.items() if name in ts)
            if todo:
                pending[todo[0]].discard(name)
                acks[name].append(tasks[name].snapshot(todo[0]))
        elif action == "ack" and acks[name]:
            _, meta = coord.on_ack(acks[name].popleft())
            if meta is not None:
                for t, m in coord.notifications(meta):
                    notes[t].append(m.checkpoint_id)
        elif action == "notify" and notes[name]:
            tasks[name].inc.completed(notes[name].popleft())
        elif action == "abort":
            coord.clock_cell[0] += 10.0  # type: ignore[attr-defined]
            coord.poll()
        elif action == "savepoint" and coord.stats.completed:
            meta = coord.stats.completed[-1]
            if storage.store.has_metadata(meta.checkpoint_id) and meta.checkpoint_id not in {c for _, c in savepoints}:
                savepoints.append((write_savepoint(storage, meta, str(tmp / "sp")), meta.checkpoint_id))
        check_invariants(storage, coord, tasks, notes, savepoints)


def check_invariants(storage, coord, tasks, notes, savepoints) -> None:
    for cid in storage.completed_ids():
        meta = storage.verify(cid)  # every file of every chain: present, intact
        for t, sim in tasks.items():
            assert storage.read_state(cid, t, meta)["count"] == sim.model[cid]
    for where, cid in savepoints:
        sp = open_storage(where)
        for t, sim in tasks.items():
            assert sp.read_state(cid, t)["count"] == sim.model[cid]
    for t, sim in tasks.items():
        # What the task may build on now, or once the completions on their way reach it.
        for cid in [sim.inc.known, *notes[t]]:
            if cid in sim.inc.written:
                assert cid in coord.buildable, f"{t} may build on {cid}, which the coordinator forgot"
                meta = coord.buildable[cid]
                for ref in [*meta.chains.get(t, []), ChainRef(cid, meta.tasks[t].file, meta.tasks[t].size,
                                                              meta.tasks[t].sha256)]:
                    path = os.path.join(storage.dir_of(ref.checkpoint_id), ref.file)
                    assert os.path.exists(path), f"{t} may build on {cid}, but {path} is gone"
