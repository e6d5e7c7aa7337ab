"""CheckpointStorage: metadata commit point, verification, fallback, pruning."""

from __future__ import annotations

import hashlib
import os

import pytest

from abs_engine import codec
from abs_engine.checkpoint.storage import (
    FORMAT_VERSION,
    MAGIC,
    METADATA,
    CheckpointStorage,
    FileEntry,
    Metadata,
)
from abs_engine.errors import CheckpointError, CheckpointErrorReason

FP = "fingerprint-1"


def write_state(storage: CheckpointStorage, cid: int, task: str, operators: dict[str, object]) -> FileEntry:
    """Write a task state file exactly as runtime/task.py::_snapshot + SnapshotWriter do."""
    blob = codec.pack({
        "task": task,
        "checkpoint_id": cid,
        "operators": {name: codec.pack(state) for name, state in operators.items()},
    })
    d = storage.dir_of(cid)
    os.makedirs(d, exist_ok=True)
    fname = f"{task}.state"
    with open(os.path.join(d, fname), "wb") as f:
        f.write(blob)
    return FileEntry(fname, len(blob), hashlib.sha256(blob).hexdigest())


def make_checkpoint(
    storage: CheckpointStorage,
    cid: int,
    states: dict[str, dict[str, object]] | None = None,
    fingerprint: str = FP,
    final: bool = False,
) -> Metadata:
    if states is None:
        states = {
            "read#0": {"read": cid * 100, "split": None},
            "count#0": {"count": {"a": cid, "b": 2 * cid}},
        }
    tasks = {t: write_state(storage, cid, t, ops) for t, ops in states.items()}
    meta = Metadata(
        checkpoint_id=cid,
        job="job",
        fingerprint=fingerprint,
        created=1_700_000_000.0 + cid,
        final=final,
        tasks=tasks,
        alignment_ms={t: 0.5 * i for i, t in enumerate(tasks)},
        duration_ms=12.5,
    )
    storage.write_metadata(meta)
    return meta


def state_path(storage: CheckpointStorage, cid: int, task: str) -> str:
    return os.path.join(storage.dir_of(cid), f"{task}.state")


def meta_path(storage: CheckpointStorage, cid: int) -> str:
    return os.path.join(storage.dir_of(cid), METADATA)


def flip_bit(path: str, byte: int, bit: int = 0) -> None:
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[byte] ^= 1 << bit
    with open(path, "wb") as f:
        f.write(bytes(data))


def truncate(path: str, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


@pytest.fixture
def storage(tmp_path) -> CheckpointStorage:
    return CheckpointStorage(str(tmp_path / "ck"), retain=10)


# ---- happy path -------------------------------------------------------------------------


def test_retain_must_be_positive(tmp_path):
    with pytest.raises(ValueError):
        CheckpointStorage(str(tmp_path), retain=0)


def test_empty_or_missing_root_has_no_checkpoints(tmp_path):
    s = CheckpointStorage(str(tmp_path / "does-not-exist"))
    assert s.ids_on_disk() == []
    assert s.completed_ids() == []
    assert s.latest_valid() == (None, [])


def test_dir_layout_and_ids(storage):
    assert storage.dir_of(42) == os.path.join(storage.root, "chk-000042")
    make_checkpoint(storage, 3)
    make_checkpoint(storage, 1)
    os.makedirs(storage.dir_of(2))  # in progress: no metadata
    os.makedirs(os.path.join(storage.root, "chk-12"))  # not a checkpoint directory name
    os.makedirs(os.path.join(storage.root, "other"))
    assert storage.ids_on_disk() == [1, 2, 3]
    assert storage.completed_ids() == [1, 3]


def test_write_then_verify_roundtrips_metadata(storage):
    meta = make_checkpoint(storage, 7, final=True)
    assert storage.load_metadata(7) == meta
    assert storage.verify(7) == meta
    assert storage.verify(7).final is True
    assert not os.path.exists(meta_path(storage, 7) + ".tmp")


def test_metadata_file_is_msgpack_with_magic_and_checksum(storage):
    make_checkpoint(storage, 1)
    with open(meta_path(storage, 1), "rb") as f:
        doc = codec.unpack(f.read())
    assert doc["magic"] == MAGIC
    assert doc["version"] == FORMAT_VERSION
    assert hashlib.sha256(doc["body"]).hexdigest() == doc["sha256"]
    assert codec.unpack(doc["body"])["checkpoint_id"] == 1


def test_read_state_decodes_every_operator(storage):
    make_checkpoint(storage, 4, states={
        "read#0": {"read": 1234, "split": None},
        "count#1": {"count": {"x": 3, 7: (1, 2)}},
    })
    assert storage.read_state(4, "read#0") == {"read": 1234, "split": None}
    # Arrays in state decode as lists (state is mutable), whatever the operator snapshotted.
    assert storage.read_state(4, "count#1") == {"count": {"x": 3, 7: [1, 2]}}


def test_latest_valid_returns_newest(storage):
    for cid in (1, 2, 3):
        make_checkpoint(storage, cid)
    meta, skipped = storage.latest_valid()
    assert meta is not None and meta.checkpoint_id == 3
    assert skipped == []
    meta, skipped = storage.latest_valid(fingerprint=FP)
    assert meta is not None and meta.checkpoint_id == 3


def test_describe(storage):
    meta = make_checkpoint(storage, 5, final=True)
    d = storage.describe(5)
    assert d["checkpoint_id"] == 5
    assert d["final"] is True
    assert d["tasks"] == 2
    assert d["bytes"] == sum(e.size for e in meta.tasks.values())
    assert d["path"] == storage.dir_of(5)


# ---- corruption of state files ----------------------------------------------------------


def _corrupt_truncate(path: str) -> None:
    truncate(path, os.path.getsize(path) - 1)


def _corrupt_flip(path: str) -> None:
    flip_bit(path, os.path.getsize(path) // 2, 3)


def _corrupt_append(path: str) -> None:
    with open(path, "ab") as f:
        f.write(b"\x00")


def _corrupt_empty(path: str) -> None:
    truncate(path, 0)


@pytest.mark.parametrize("corrupt, reason", [
    (_corrupt_truncate, CheckpointErrorReason.CHECKSUM_MISMATCH),
    (_corrupt_flip, CheckpointErrorReason.CHECKSUM_MISMATCH),
    (_corrupt_append, CheckpointErrorReason.TOO_LARGE),  # longer than recorded: refused before reading it all
    (_corrupt_empty, CheckpointErrorReason.CHECKSUM_MISMATCH),
])
def test_damaged_state_file_fails_checksum(storage, corrupt, reason):
    make_checkpoint(storage, 1)
    corrupt(state_path(storage, 1, "count#0"))
    with pytest.raises(CheckpointError) as ei:
        storage.verify(1)
    assert ei.value.reason is reason
    assert "checksum" in str(ei.value)
    assert ei.value.checkpoint_id == 1
    assert "count#0" in str(ei.value)
    with pytest.raises(CheckpointError) as ei:
        storage.read_state(1, "read#0")  # even an intact task: the checkpoint as a whole is unusable
    assert ei.value.reason is reason


def test_every_single_bit_flip_in_a_state_file_is_detected(storage):
    make_checkpoint(storage, 1, states={"t#0": {"op": {"k": 1}}})
    path = state_path(storage, 1, "t#0")
    with open(path, "rb") as f:
        original = f.read()
    for i in range(len(original) * 8):
        damaged = bytearray(original)
        damaged[i // 8] ^= 1 << (i % 8)
        with open(path, "wb") as f:
            f.write(damaged)
        with pytest.raises(CheckpointError) as ei:
            storage.verify(1)
        assert ei.value.reason is CheckpointErrorReason.CHECKSUM_MISMATCH
    with open(path, "wb") as f:
        f.write(original)
    assert storage.verify(1).checkpoint_id == 1


def test_missing_state_file(storage):
    make_checkpoint(storage, 1)
    os.remove(state_path(storage, 1, "read#0"))
    with pytest.raises(CheckpointError) as ei:
        storage.verify(1)
    assert ei.value.reason is CheckpointErrorReason.MISSING_FILE
    assert ei.value.checkpoint_id == 1
    assert "read#0" in str(ei.value)


# ---- corruption of metadata -------------------------------------------------------------


def test_missing_metadata(storage):
    make_checkpoint(storage, 1)
    os.remove(meta_path(storage, 1))
    with pytest.raises(CheckpointError) as ei:
        storage.load_metadata(1)
    assert ei.value.reason is CheckpointErrorReason.MISSING_METADATA
    with pytest.raises(CheckpointError) as ei:
        storage.verify(1)
    assert ei.value.reason is CheckpointErrorReason.MISSING_METADATA
    assert storage.completed_ids() == []


def test_verify_nonexistent_checkpoint(storage):
    with pytest.raises(CheckpointError) as ei:
        storage.verify(99)
    assert ei.value.reason is CheckpointErrorReason.MISSING_METADATA
    assert ei.value.checkpoint_id == 99


@pytest.mark.parametrize("keep", [0, 1, 10, -1])
def test_truncated_metadata_is_corrupt(storage, keep):
    make_checkpoint(storage, 1)
    path = meta_path(storage, 1)
    truncate(path, keep if keep >= 0 else os.path.getsize(path) - 1)
    with pytest.raises(CheckpointError) as ei:
        storage.verify(1)
    assert ei.value.reason is CheckpointErrorReason.CORRUPT_METADATA
    assert ei.value.checkpoint_id == 1


def test_bit_flip_in_metadata_body_is_corrupt(storage):
    make_checkpoint(storage, 1)
    path = meta_path(storage, 1)
    with open(path, "rb") as f:
        raw = f.read()
    doc = codec.unpack(raw)
    # Flip a bit inside the body (the checkpoint id/job/fingerprint region).
    at = raw.index(doc["body"]) + len(doc["body"]) // 2
    flip_bit(path, at, 0)
    with pytest.raises(CheckpointError) as ei:
        storage.verify(1)
    assert ei.value.reason is CheckpointErrorReason.CORRUPT_METADATA


def test_bit_flip_in_metadata_magic_is_corrupt(storage):
    make_checkpoint(storage, 1)
    path = meta_path(storage, 1)
    with open(path, "rb") as f:
        raw = f.read()
    flip_bit(path, raw.index(MAGIC.encode()) + 2, 1)
    with pytest.raises(CheckpointError) as ei:
        storage.load_metadata(1)
    assert ei.value.reason is CheckpointErrorReason.CORRUPT_METADATA


def test_no_single_bit_flip_in_metadata_yields_different_metadata(storage):
    """Every flip is either detected (CORRUPT_METADATA) or leaves the decoded metadata
    unchanged; never does a damaged file load as *other* metadata."""
    meta = make_checkpoint(storage, 1, states={"t#0": {"op": 1}})
    path = meta_path(storage, 1)
    with open(path, "rb") as f:
        original = f.read()
    detected = 0
    for i in range(len(original) * 8):
        damaged = bytearray(original)
        damaged[i // 8] ^= 1 << (i % 8)
        with open(path, "wb") as f:
            f.write(damaged)
        try:
            got = storage.load_metadata(1)
        except CheckpointError as e:
            assert e.reason is CheckpointErrorReason.CORRUPT_METADATA
            detected += 1
        else:
            assert got == meta, (i // 8, i % 8)
    assert detected > len(original) * 8 * 0.9
    with open(path, "wb") as f:
        f.write(original)
    assert storage.verify(1) == meta


def test_metadata_of_unknown_format_version_is_rejected(storage):
    make_checkpoint(storage, 1)
    path = meta_path(storage, 1)
    with open(path, "rb") as f:
        doc = codec.unpack(f.read())
    doc = dict(doc)
    doc["version"] = FORMAT_VERSION + 1
    with open(path, "wb") as f:
        f.write(codec.pack(doc))
    with pytest.raises(CheckpointError) as ei:
        storage.load_metadata(1)
    assert ei.value.reason is CheckpointErrorReason.CORRUPT_METADATA


def test_metadata_that_is_not_a_map_is_corrupt(storage):
    make_checkpoint(storage, 1)
    with open(meta_path(storage, 1), "wb") as f:
        f.write(codec.pack([1, 2, 3]))
    with pytest.raises(CheckpointError) as ei:
        storage.load_metadata(1)
    assert ei.value.reason is CheckpointErrorReason.CORRUPT_METADATA


def test_only_tmp_metadata_is_not_a_checkpoint(storage):
    """A crash between writing _metadata.tmp and the rename: the checkpoint does not exist."""
    make_checkpoint(storage, 1)
    make_checkpoint(storage, 2)
    os.replace(meta_path(storage, 2), meta_path(storage, 2) + ".tmp")
    assert storage.ids_on_disk() == [1, 2]
    assert storage.completed_ids() == [1]
    meta, skipped = storage.latest_valid()
    assert meta is not None and meta.checkpoint_id == 1
    assert skipped == []  # not even a skipped candidate: it never existed
    with pytest.raises(CheckpointError) as ei:
        storage.verify(2)
    assert ei.value.reason is CheckpointErrorReason.MISSING_METADATA


# ---- fallback -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda s: _corrupt_truncate(state_path(s, 3, "count#0")), CheckpointErrorReason.CHECKSUM_MISMATCH),
        (lambda s: _corrupt_flip(state_path(s, 3, "read#0")), CheckpointErrorReason.CHECKSUM_MISMATCH),
        (lambda s: os.remove(state_path(s, 3, "count#0")), CheckpointErrorReason.MISSING_FILE),
        (lambda s: _corrupt_truncate(meta_path(s, 3)), CheckpointErrorReason.CORRUPT_METADATA),
        (lambda s: flip_bit(meta_path(s, 3), os.path.getsize(meta_path(s, 3)) - 70, 2),
         CheckpointErrorReason.CORRUPT_METADATA),
    ],
    ids=["truncated-state", "flipped-state", "missing-state", "truncated-meta", "flipped-meta"],
)
def test_latest_valid_falls_back_and_reports_skipped(storage, damage, reason):
    for cid in (1, 2, 3):
        make_checkpoint(storage, cid)
    damage(storage)
    meta, skipped = storage.latest_valid(fingerprint=FP)
    assert meta is not None and meta.checkpoint_id == 2
    assert [(e.checkpoint_id, e.reason) for e in skipped] == [(3, reason)]
    assert storage.read_state(2, "read#0") == {"read": 200, "split": None}


def test_latest_valid_missing_metadata_is_not_a_candidate(storage):
    for cid in (1, 2):
        make_checkpoint(storage, cid)
    os.remove(meta_path(storage, 2))
    meta, skipped = storage.latest_valid()
    assert meta is not None and meta.checkpoint_id == 1
    assert skipped == []


def test_latest_valid_skips_several_and_can_find_none(storage):
    for cid in (1, 2, 3):
        make_checkpoint(storage, cid)
    _corrupt_flip(state_path(storage, 3, "read#0"))
    _corrupt_truncate(meta_path(storage, 2))
    meta, skipped = storage.latest_valid()
    assert meta is not None and meta.checkpoint_id == 1
    assert [(e.checkpoint_id, e.reason) for e in skipped] == [
        (3, CheckpointErrorReason.CHECKSUM_MISMATCH),
        (2, CheckpointErrorReason.CORRUPT_METADATA),
    ]
    os.remove(state_path(storage, 1, "count#0"))
    meta, skipped = storage.latest_valid()
    assert meta is None
    assert [e.checkpoint_id for e in skipped] == [3, 2, 1]
    assert skipped[-1].reason is CheckpointErrorReason.MISSING_FILE


def test_plan_mismatch(storage):
    make_checkpoint(storage, 1, fingerprint="old-shape")
    with pytest.raises(CheckpointError) as ei:
        storage.latest_valid(fingerprint="new-shape")
    assert ei.value.reason is CheckpointErrorReason.PLAN_MISMATCH
    assert ei.value.checkpoint_id == 1
    # Without a fingerprint (e.g. the CLI) the checkpoint is usable.
    meta, _ = storage.latest_valid()
    assert meta is not None and meta.fingerprint == "old-shape"


def test_plan_mismatch_is_checked_on_the_newest_valid_one(storage):
    make_checkpoint(storage, 1, fingerprint=FP)
    make_checkpoint(storage, 2, fingerprint="other")
    with pytest.raises(CheckpointError) as ei:
        storage.latest_valid(fingerprint=FP)
    assert ei.value.reason is CheckpointErrorReason.PLAN_MISMATCH
    assert ei.value.checkpoint_id == 2
    # An invalid newest one is skipped first; the older valid one matches.
    os.remove(state_path(storage, 2, "read#0"))
    meta, skipped = storage.latest_valid(fingerprint=FP)
    assert meta is not None and meta.checkpoint_id == 1
    assert [e.reason for e in skipped] == [CheckpointErrorReason.MISSING_FILE]


# ---- pruning --------------------------------------------------------------------------------


def test_prune_keeps_newest_retain(tmp_path):
    s = CheckpointStorage(str(tmp_path), retain=2)
    for cid in (1, 2, 3, 4):
        make_checkpoint(s, cid)
    removed = s.prune()
    assert sorted(removed) == [1, 2]
    assert s.ids_on_disk() == [3, 4]
    assert not os.path.exists(s.dir_of(1))
    assert s.verify(3).checkpoint_id == 3 and s.verify(4).checkpoint_id == 4
    assert s.prune() == []  # idempotent


def test_prune_removes_orphans_older_than_newest_completed_only(tmp_path):
    s = CheckpointStorage(str(tmp_path), retain=3)
    make_checkpoint(s, 1)
    os.makedirs(s.dir_of(2))  # aborted: state files only
    write_state(s, 2, "read#0", {"read": 1})
    make_checkpoint(s, 3)
    os.makedirs(s.dir_of(4))  # in progress: must survive
    write_state(s, 4, "read#0", {"read": 1})
    os.makedirs(s.dir_of(5))
    with open(meta_path(s, 5) + ".tmp", "wb") as f:  # crash before rename, newer than newest
        f.write(b"partial")
    removed = s.prune()
    assert removed == [2]
    assert s.ids_on_disk() == [1, 3, 4, 5]
    assert os.path.exists(state_path(s, 4, "read#0"))


def test_prune_retain_one_and_orphans(tmp_path):
    s = CheckpointStorage(str(tmp_path), retain=1)
    make_checkpoint(s, 1)
    os.makedirs(s.dir_of(2))
    make_checkpoint(s, 3)
    os.makedirs(s.dir_of(4))
    assert sorted(s.prune()) == [1, 2]
    assert s.ids_on_disk() == [3, 4]
    assert s.completed_ids() == [3]


def test_prune_without_completed_checkpoints_keeps_everything_newer(tmp_path):
    s = CheckpointStorage(str(tmp_path), retain=1)
    os.makedirs(s.dir_of(1))
    os.makedirs(s.dir_of(2))
    assert s.prune() == []
    assert s.ids_on_disk() == [1, 2]


def test_remove_orphans_after(tmp_path):
    s = CheckpointStorage(str(tmp_path), retain=5)
    make_checkpoint(s, 1)
    os.makedirs(s.dir_of(2))  # older than the restored one: left alone
    make_checkpoint(s, 3)
    os.makedirs(s.dir_of(4))
    write_state(s, 4, "read#0", {"read": 9})
    make_checkpoint(s, 5)  # has metadata: kept even though newer
    os.makedirs(s.dir_of(6))
    with open(meta_path(s, 6) + ".tmp", "wb") as f:
        f.write(b"x")
    removed = s.remove_orphans_after(3)
    assert removed == [4, 6]
    assert s.ids_on_disk() == [1, 2, 3, 5]


def test_state_file_that_passes_its_checksum_but_is_not_msgpack_is_corrupt_state(storage):
    """A bug in whoever wrote the file (not a disk error): typed error, not a msgpack crash."""
    import hashlib

    from abs_engine.checkpoint.storage import FileEntry

    d = storage.dir_of(1)
    os.makedirs(d, exist_ok=True)
    blob = b"\xc1 not msgpack"
    with open(os.path.join(d, "t#0.state"), "wb") as f:
        f.write(blob)
    storage.write_metadata(Metadata(1, "job", FP, 0.0, False,
                                    {"t#0": FileEntry("t#0.state", len(blob), hashlib.sha256(blob).hexdigest())},
                                    {"t#0": 0.0}, 1.0))
    with pytest.raises(CheckpointError) as ei:
        storage.read_state(1, "t#0")
    assert ei.value.reason is CheckpointErrorReason.CORRUPT_STATE
