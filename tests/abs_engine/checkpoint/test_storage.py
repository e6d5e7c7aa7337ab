"""CheckpointStorage: metadata commit point, verification, fallback, pruning."""

from __future__ import annotations

import hashlib
import os

import pytest

from abs_engine import codec
from abs_engine.checkpoint.metadata import FileRef, Metadata
from abs_engine.checkpoint.safe_io import FORMAT_VERSION, MAGIC, METADATA
from abs_engine.checkpoint.storage import CheckpointStorage
from abs_engine.errors import CheckpointError, CheckpointErrorReason

FP = "fingerprint-1"


def write_state(storage: CheckpointStorage, cid: int, task: str, operators: dict[str, object]) -> FileRef:
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
    return FileRef(fname, len(blob), hashlib.sha256(blob).hexdigest())


def make_checkpoint(
    storage: CheckpointStorage,
    cid: int,
    states: dict[str, dict[str, object]] | None = None,
    fingerprint: str = FP,
    final: bool = False,
    job_id: str = "",
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
        job_id=job_id,
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
    assert doc["version"] == 1 < FORMAT_VERSION  # no incremental chains: older engines can read it
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

    from abs_engine.checkpoint.metadata import FileRef

    d = storage.dir_of(1)
    os.makedirs(d, exist_ok=True)
    blob = b"\xc1 not msgpack"
    with open(os.path.join(d, "t#0.state"), "wb") as f:
        f.write(blob)
    storage.write_metadata(Metadata(1, "job", FP, 0.0, False,
                                    {"t#0": FileRef("t#0.state", len(blob), hashlib.sha256(blob).hexdigest())},
                                    {"t#0": 0.0}, 1.0))
    with pytest.raises(CheckpointError) as ei:
        storage.read_state(1, "t#0")
    assert ei.value.reason is CheckpointErrorReason.CORRUPT_STATE


# ---- a distrusted directory: forged names, links, FIFOs, unbounded files ------------------------


def forge_metadata(storage: CheckpointStorage, cid: int, body: dict[str, object]) -> None:
    """Write ``_metadata`` with any body, re-signed: a valid self-checksum, as an attacker
    who can write the directory would (the checksum protects against damage, not forgery)."""
    raw = codec.pack(body)
    doc = codec.pack({"magic": MAGIC, "version": FORMAT_VERSION, "body": raw,
                      "sha256": hashlib.sha256(raw).hexdigest()})
    os.makedirs(storage.dir_of(cid), exist_ok=True)
    path = meta_path(storage, cid)
    if os.path.lexists(path):
        os.remove(path)
    with open(path, "wb") as f:
        f.write(doc)


def secret_file(tmp_path, content: bytes = b"secret outside the checkpoint dir") -> str:
    path = str(tmp_path / "secret")
    with open(path, "wb") as f:
        f.write(codec.pack({"task": "t", "checkpoint_id": 2, "operators": {"op": codec.pack(content)}}))
    return path


def _sized(path: str) -> list[object]:
    with open(path, "rb") as f:
        data = f.read()
    return [len(data), hashlib.sha256(data).hexdigest()]


@pytest.mark.parametrize("name_of", [
    lambda storage, secret: os.path.relpath(secret, storage.dir_of(2)),  # ../../secret
    lambda storage, secret: secret,  # absolute
], ids=["dotdot", "absolute"])
def test_metadata_naming_a_file_outside_the_directory_is_unsafe(storage, tmp_path, name_of):
    make_checkpoint(storage, 1)
    meta = make_checkpoint(storage, 2)
    secret = secret_file(tmp_path)
    body = meta.to_dict()
    body["tasks"] = {"read#0": [name_of(storage, secret), *_sized(secret)]}  # size and sha256 match
    forge_metadata(storage, 2, body)
    with pytest.raises(CheckpointError) as ei:
        storage.verify(2)
    assert ei.value.reason is CheckpointErrorReason.UNSAFE_PATH
    assert ei.value.checkpoint_id == 2
    assert "plain file name" in str(ei.value)
    with pytest.raises(CheckpointError):
        storage.read_state(2, "read#0")
    got, skipped = storage.latest_valid(FP)
    assert got is not None and got.checkpoint_id == 1
    assert [(e.checkpoint_id, e.reason) for e in skipped] == [(2, CheckpointErrorReason.UNSAFE_PATH)]


def test_metadata_naming_etc_passwd_is_unsafe(storage):
    if not os.path.isfile("/etc/passwd"):
        pytest.skip("no /etc/passwd")
    meta = make_checkpoint(storage, 1)
    body = meta.to_dict()
    body["tasks"] = {"read#0": ["/etc/passwd", *_sized("/etc/passwd")]}
    forge_metadata(storage, 1, body)
    with pytest.raises(CheckpointError) as ei:
        storage.verify(1)
    assert ei.value.reason is CheckpointErrorReason.UNSAFE_PATH
    assert storage.latest_valid()[0] is None


@pytest.mark.parametrize("name", [".", "..", ".hidden", "a/b", "a\\b", "nul\x00x", "", "../x", "/etc/passwd"])
def test_every_non_plain_name_is_unsafe(storage, name):
    meta = make_checkpoint(storage, 1)
    body = meta.to_dict()
    entry = body["tasks"]["read#0"]
    body["tasks"]["read#0"] = [name, entry[1], entry[2]]
    forge_metadata(storage, 1, body)
    with pytest.raises(CheckpointError) as ei:
        storage.load_metadata(1)
    assert ei.value.reason is CheckpointErrorReason.UNSAFE_PATH


def test_write_metadata_refuses_unsafe_names(storage):
    with pytest.raises(CheckpointError) as ei:
        storage.write_metadata(Metadata(1, "job", FP, 0.0, False, {"t#0": FileRef("../t", 1, "0" * 64)}, {}, 1.0))
    assert ei.value.reason is CheckpointErrorReason.UNSAFE_PATH
    assert not os.path.exists(storage.dir_of(1))


@pytest.mark.parametrize("mutate, why", [
    (lambda b: b["tasks"].update({"read#0": ["read#0.state", -1, "0" * 64]}), "size"),
    (lambda b: b["tasks"].update({"read#0": ["read#0.state", "10", "0" * 64]}), "size"),
    (lambda b: b["tasks"].update({"read#0": ["read#0.state", True, "0" * 64]}), "size"),
    (lambda b: b["tasks"].update({"read#0": ["read#0.state", 10, "xyz"]}), "sha256"),
    (lambda b: b["tasks"].update({"read#0": ["read#0.state", 10, "A" * 64]}), "sha256"),
    (lambda b: b["tasks"].update({"read#0": ["read#0.state", 10]}), "entry"),
    (lambda b: b["tasks"].update({7: ["read#0.state", 10, "0" * 64]}), "task name"),
    (lambda b: b.update(tasks=[1, 2]), "tasks"),
    (lambda b: b.update(job=5), "job"),
    (lambda b: b.update(final="yes"), "final"),
    (lambda b: b.update(job_id=3), "job_id"),
    (lambda b: b.update(checkpoint_id=2), "checkpoint 2"),  # copied from another checkpoint
], ids=lambda x: x if isinstance(x, str) else "")
def test_metadata_fields_are_type_checked(storage, mutate, why):
    body = make_checkpoint(storage, 1).to_dict()
    mutate(body)
    forge_metadata(storage, 1, body)
    with pytest.raises(CheckpointError) as ei:
        storage.load_metadata(1)
    assert ei.value.reason is CheckpointErrorReason.CORRUPT_METADATA
    assert why in str(ei.value)


@pytest.mark.timeout(10)
def test_state_file_symlinked_to_dev_zero_is_refused_quickly(storage):
    make_checkpoint(storage, 1)
    make_checkpoint(storage, 2)
    path = state_path(storage, 2, "count#0")
    os.remove(path)
    os.symlink("/dev/zero", path)
    with pytest.raises(CheckpointError) as ei:
        storage.verify(2)
    assert ei.value.reason is CheckpointErrorReason.UNSAFE_PATH
    assert "symbolic link" in str(ei.value)
    meta, skipped = storage.latest_valid()
    assert meta is not None and meta.checkpoint_id == 1
    assert [(e.checkpoint_id, e.reason) for e in skipped] == [(2, CheckpointErrorReason.UNSAFE_PATH)]


def test_state_file_symlinked_to_an_identical_file_is_still_refused(storage, tmp_path):
    """Links are never followed, even to content that would pass the checksum."""
    make_checkpoint(storage, 1)
    path = state_path(storage, 1, "read#0")
    copy = str(tmp_path / "copy")
    os.replace(path, copy)
    os.symlink(copy, path)
    with pytest.raises(CheckpointError) as ei:
        storage.verify(1)
    assert ei.value.reason is CheckpointErrorReason.UNSAFE_PATH


@pytest.mark.timeout(10)
def test_fifo_as_metadata_does_not_hang(storage):
    make_checkpoint(storage, 1)
    os.makedirs(storage.dir_of(2))
    os.mkfifo(meta_path(storage, 2))
    assert storage.completed_ids() == [1, 2]  # a candidate, so that it is reported
    with pytest.raises(CheckpointError) as ei:
        storage.verify(2)
    assert ei.value.reason is CheckpointErrorReason.UNSAFE_PATH
    assert "not a regular file" in str(ei.value)
    meta, skipped = storage.latest_valid()
    assert meta is not None and meta.checkpoint_id == 1
    assert [e.reason for e in skipped] == [CheckpointErrorReason.UNSAFE_PATH]


@pytest.mark.timeout(10)
def test_fifo_as_state_file_does_not_hang(storage):
    make_checkpoint(storage, 1)
    path = state_path(storage, 1, "read#0")
    os.remove(path)
    os.mkfifo(path)
    with pytest.raises(CheckpointError) as ei:
        storage.verify(1)
    assert ei.value.reason is CheckpointErrorReason.UNSAFE_PATH


@pytest.mark.timeout(10)
def test_oversized_metadata_is_refused_unread(storage):
    from abs_engine.checkpoint.safe_io import MAX_METADATA

    make_checkpoint(storage, 1)
    with open(meta_path(storage, 1), "r+b") as f:
        f.truncate(MAX_METADATA + 1)  # sparse: costs no disk
    with pytest.raises(CheckpointError) as ei:
        storage.load_metadata(1)
    assert ei.value.reason is CheckpointErrorReason.TOO_LARGE
    assert "maximum" in str(ei.value)


def test_state_file_larger_than_recorded_is_too_large(storage):
    make_checkpoint(storage, 1)
    path = state_path(storage, 1, "read#0")
    with open(path, "r+b") as f:
        f.truncate(50 << 20)  # sparse
    with pytest.raises(CheckpointError) as ei:
        storage.verify(1)
    assert ei.value.reason is CheckpointErrorReason.TOO_LARGE
    assert "recorded" in str(ei.value)


def test_symlinked_checkpoint_directory_is_refused_and_pruned_without_following(tmp_path):
    elsewhere = CheckpointStorage(str(tmp_path / "elsewhere"), retain=10)
    make_checkpoint(elsewhere, 1)  # a valid checkpoint outside the directory
    s = CheckpointStorage(str(tmp_path / "ck"), retain=1)
    make_checkpoint(s, 2)
    os.symlink(elsewhere.dir_of(1), s.dir_of(1))
    assert s.completed_ids() == [1, 2]
    with pytest.raises(CheckpointError) as ei:
        s.verify(1)
    assert ei.value.reason is CheckpointErrorReason.UNSAFE_PATH
    assert "symbolic link" in str(ei.value)
    assert s.prune() == [1]
    assert not os.path.lexists(s.dir_of(1))
    assert elsewhere.verify(1).checkpoint_id == 1  # the target was not touched


def test_symlinked_checkpoint_dirs_are_reported_never_followed(tmp_path):
    """A ``chk-N`` link is a candidate (so latest_valid reports it as UNSAFE_PATH), kept by
    remove_orphans_after like any invalid checkpoint, and unlinked (not followed) by prune."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_bytes(b"x")
    s = CheckpointStorage(str(tmp_path / "ck"), retain=1)
    make_checkpoint(s, 1)
    os.symlink(str(target), s.dir_of(2))
    os.makedirs(s.dir_of(3))  # a real orphan
    assert s.completed_ids() == [1, 2]
    meta, skipped = s.latest_valid()
    assert meta is not None and meta.checkpoint_id == 1
    assert [(e.checkpoint_id, e.reason) for e in skipped] == [(2, CheckpointErrorReason.UNSAFE_PATH)]
    assert s.remove_orphans_after(1) == [3]
    make_checkpoint(s, 4)
    assert s.prune() == [1, 2]
    assert s.ids_on_disk() == [4]
    assert (target / "keep").read_bytes() == b"x"


# ---- writing never follows what is planted ------------------------------------------------------


def test_write_state_file_creates_and_returns_path(storage):
    from abs_engine.checkpoint.safe_io import write_state_file

    os.makedirs(storage.root)
    path = write_state_file(storage.root, 3, "t#0.state", b"abc")
    assert path == state_path(storage, 3, "t#0")
    with open(path, "rb") as f:
        assert f.read() == b"abc"
    assert write_state_file(storage.root, 3, "t#1.state", b"") == state_path(storage, 3, "t#1")


@pytest.mark.parametrize("planted", ["symlink", "file", "dangling"])
def test_write_state_file_refuses_a_planted_file(storage, tmp_path, planted):
    from abs_engine.checkpoint.safe_io import write_state_file

    target = tmp_path / "target"
    target.write_bytes(b"original")
    os.makedirs(storage.dir_of(1))
    path = state_path(storage, 1, "t#0")
    if planted == "symlink":
        os.symlink(str(target), path)
    elif planted == "dangling":
        os.symlink(str(tmp_path / "created-by-following"), path)
    else:
        with open(path, "wb") as f:
            f.write(b"planted")
    with pytest.raises(CheckpointError) as ei:
        write_state_file(storage.root, 1, "t#0.state", b"new state")
    assert ei.value.reason is CheckpointErrorReason.UNSAFE_PATH
    assert target.read_bytes() == b"original"
    assert not (tmp_path / "created-by-following").exists()


def test_write_state_file_refuses_a_symlinked_checkpoint_dir(storage, tmp_path):
    from abs_engine.checkpoint.safe_io import write_state_file

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.makedirs(storage.root)
    os.symlink(str(elsewhere), storage.dir_of(1))
    with pytest.raises(CheckpointError) as ei:
        write_state_file(storage.root, 1, "t#0.state", b"state")
    assert ei.value.reason is CheckpointErrorReason.UNSAFE_PATH
    assert os.listdir(elsewhere) == []
    with pytest.raises(CheckpointError) as ei:
        storage.write_metadata(Metadata(1, "job", FP, 0.0, False, {}, {}, 1.0))
    assert ei.value.reason is CheckpointErrorReason.UNSAFE_PATH
    assert os.listdir(elsewhere) == []


def test_write_state_file_refuses_an_unsafe_name(storage):
    from abs_engine.checkpoint.safe_io import write_state_file

    os.makedirs(storage.root)
    with pytest.raises(CheckpointError) as ei:
        write_state_file(storage.root, 1, "../escape.state", b"x")
    assert ei.value.reason is CheckpointErrorReason.UNSAFE_PATH
    assert not os.path.exists(os.path.join(storage.root, "escape.state"))


def test_write_metadata_replaces_a_planted_tmp_link_without_following_it(storage, tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"original")
    os.makedirs(storage.dir_of(1))
    os.symlink(str(target), meta_path(storage, 1) + ".tmp")
    meta = make_checkpoint(storage, 1)
    assert target.read_bytes() == b"original"
    assert storage.verify(1) == meta
    assert not os.path.lexists(meta_path(storage, 1) + ".tmp")


class _FakeControl:
    def __init__(self) -> None:
        self.sent: list[object] = []

    def send(self, msg: object) -> None:
        self.sent.append(msg)


def test_snapshot_writer_writes_through_the_checks(storage, tmp_path):
    from abs_engine.runtime.writer import Job, SnapshotWriter

    errors: list[BaseException] = []
    control = _FakeControl()
    writer = SnapshotWriter(control, "t#0", storage.root, errors.append)  # type: ignore[arg-type]
    blob = codec.pack({"task": "t#0", "checkpoint_id": 1, "operators": {}})
    os.makedirs(storage.root)
    writer.submit(Job(1, "t#0.state", blob, 0.5, 0, False, 0.0, 0.0))
    # A planted link for the next checkpoint: refused, reported, target untouched.
    target = tmp_path / "target"
    target.write_bytes(b"original")
    os.makedirs(storage.dir_of(2))
    os.symlink(str(target), state_path(storage, 2, "t#0"))
    writer.submit(Job(2, "t#0.state", blob, 0.5, 0, False, 0.0, 0.0))
    writer.submit(Job(3, "../t#0.state", blob, 0.5, 0, False, 0.0, 0.0))  # not a plain name: refused, nothing written
    writer.flush()
    with open(state_path(storage, 1, "t#0"), "rb") as f:
        assert f.read() == blob
    assert len(control.sent) == 1
    ack = control.sent[0]
    assert (ack.checkpoint_id, ack.file, ack.size) == (1, "t#0.state", len(blob))  # type: ignore[attr-defined]
    assert ack.sha256 == hashlib.sha256(blob).hexdigest()  # type: ignore[attr-defined]
    assert len(errors) == 2 and all(isinstance(e, CheckpointError) for e in errors)
    assert [e.reason for e in errors] == [CheckpointErrorReason.UNSAFE_PATH] * 2  # type: ignore[attr-defined]
    assert target.read_bytes() == b"original"
    assert not os.path.exists(os.path.join(storage.root, "t#0.state"))


# ---- decoding, job identity, restore ------------------------------------------------------------


def _undecodable_state(storage: CheckpointStorage, cid: int) -> None:
    """Checkpoint ``cid`` whose state file passes its checksum but does not decode."""
    blob = codec.pack({"task": "read#0", "checkpoint_id": cid, "operators": {"read": b"\xc1\xc1"}})
    d = storage.dir_of(cid)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "read#0.state"), "wb") as f:
        f.write(blob)
    storage.write_metadata(Metadata(cid, "job", FP, 0.0, False,
                                    {"read#0": FileRef("read#0.state", len(blob), hashlib.sha256(blob).hexdigest())},
                                    {}, 1.0))


def test_checkpoint_that_passes_checksum_but_does_not_decode_is_skipped(storage):
    make_checkpoint(storage, 1)
    make_checkpoint(storage, 2)
    _undecodable_state(storage, 3)
    with pytest.raises(CheckpointError) as ei:
        storage.verify(3)
    assert ei.value.reason is CheckpointErrorReason.CORRUPT_STATE
    assert ei.value.checkpoint_id == 3
    meta, skipped = storage.latest_valid(FP)
    assert meta is not None and meta.checkpoint_id == 2
    assert [(e.checkpoint_id, e.reason) for e in skipped] == [(3, CheckpointErrorReason.CORRUPT_STATE)]


def test_job_id_round_trips_and_old_metadata_reads_as_empty(storage):
    meta = make_checkpoint(storage, 1, job_id="run-a")
    assert storage.verify(1).job_id == "run-a" == meta.job_id
    body = meta.to_dict()
    del body["job_id"]  # written by an engine that did not know job ids
    forge_metadata(storage, 1, body)
    assert storage.verify(1).job_id == ""
    assert Metadata(1, "j", FP, 0.0, False, {}, {}, 1.0).job_id == ""  # positional construction still works


def test_foreign_job_checkpoints_are_skipped(storage):
    make_checkpoint(storage, 1, job_id="mine")
    make_checkpoint(storage, 2, job_id="")  # older engine: no id, usable by anyone
    make_checkpoint(storage, 3, job_id="other", fingerprint="other-shape")
    meta, skipped = storage.latest_valid(FP, job_id="mine")
    assert meta is not None and meta.checkpoint_id == 2
    assert [(e.checkpoint_id, e.reason) for e in skipped] == [(3, CheckpointErrorReason.FOREIGN_JOB)]
    assert "other" in str(skipped[0]) and "directory of its own" in str(skipped[0])
    os.remove(state_path(storage, 2, "read#0"))
    meta, skipped = storage.latest_valid(FP, job_id="mine")
    assert meta is not None and meta.checkpoint_id == 1
    assert [e.reason for e in skipped] == [CheckpointErrorReason.FOREIGN_JOB, CheckpointErrorReason.MISSING_FILE]
    # Without a job id (e.g. the CLI) every job's checkpoints are candidates.
    assert storage.latest_valid()[0].checkpoint_id == 3  # type: ignore[union-attr]


STATE_WITH_LISTS = {
    "nested": [1, [2, [3, []]], {"k": [4, 5]}],
    "tuple_keys": {("a", 1): [1, 2], (("x", (1, 2)), 3): {"inner": [6]}, 9: [7]},
    "pending": [[2, b"a\t3\n"], [3, b"\xff"]],
}


def test_restored_state_keeps_lists_and_tuple_keys(storage):
    make_checkpoint(storage, 1, states={"t#0": {"op": STATE_WITH_LISTS}})
    got = storage.read_state(1, "t#0")["op"]
    assert got == STATE_WITH_LISTS
    assert type(got["nested"]) is list and type(got["nested"][1][1]) is list
    assert type(got["tuple_keys"][("a", 1)]) is list
    assert (("x", (1, 2)), 3) in got["tuple_keys"]
    got["nested"].append(9)  # mutable, as the operator left it


def test_large_state_round_trips(storage):
    big = {i: [i, str(i)] for i in range(200_000)}
    big[(1, 2)] = [3]
    make_checkpoint(storage, 1, states={"t#0": {"op": big}})
    assert storage.read_state(1, "t#0")["op"] == big


def test_back_edge_records_still_decode_as_tuples(storage):
    blob = codec.pack({"task": "t#0", "checkpoint_id": 1, "operators": {"op": codec.pack([1, 2])},
                       "logs": {"a->b": codec.pack([(1, "x"), (2, "y")])}, "finished": True})
    os.makedirs(storage.dir_of(1))
    with open(state_path(storage, 1, "t#0"), "wb") as f:
        f.write(blob)
    storage.write_metadata(Metadata(1, "job", FP, 0.0, False,
                                    {"t#0": FileRef("t#0.state", len(blob), hashlib.sha256(blob).hexdigest())},
                                    {}, 1.0))
    snap = storage.read_snapshot(1, "t#0")
    assert snap.states == {"op": [1, 2]}
    assert snap.logs == {"a->b": [(1, "x"), (2, "y")]}
    assert snap.finished is True


def test_load_task_snapshot_for_workers(storage, tmp_path):
    from abs_engine.checkpoint.safe_io import load_task_snapshot

    meta = make_checkpoint(storage, 1, states={"t#0": {"op": STATE_WITH_LISTS}})
    e = meta.tasks["t#0"]
    snap = load_task_snapshot(storage.root, 1, e.file, e.size, e.sha256)
    assert snap.states == {"op": STATE_WITH_LISTS} and snap.logs == {} and snap.finished is False
    with pytest.raises(CheckpointError) as ei:
        load_task_snapshot(storage.root, 1, e.file, e.size, "0" * 64)
    assert ei.value.reason is CheckpointErrorReason.CHECKSUM_MISMATCH
    with pytest.raises(CheckpointError) as ei:
        load_task_snapshot(storage.root, 1, "../../secret", e.size, e.sha256)
    assert ei.value.reason is CheckpointErrorReason.UNSAFE_PATH
    with pytest.raises(CheckpointError) as ei:
        load_task_snapshot(storage.root, 1, "gone.state", e.size, e.sha256)
    assert ei.value.reason is CheckpointErrorReason.MISSING_FILE
    os.replace(storage.dir_of(1), str(tmp_path / "moved"))
    os.symlink(str(tmp_path / "moved"), storage.dir_of(1))
    with pytest.raises(CheckpointError) as ei:
        load_task_snapshot(storage.root, 1, e.file, e.size, e.sha256)
    assert ei.value.reason is CheckpointErrorReason.UNSAFE_PATH


def test_read_checked_and_load_task_snapshot(storage, tmp_path):
    from abs_engine.checkpoint.safe_io import load_task_snapshot, read_checked

    meta = make_checkpoint(storage, 1)
    e = meta.tasks["read#0"]
    d = storage.dir_of(1)
    assert len(read_checked(d, e.file, e.size, 1 << 20)) == e.size
    assert len(read_checked(d, e.file, None, 1 << 20)) == e.size
    assert load_task_snapshot(storage.root, 1, e.file, e.size, e.sha256).states == storage.read_state(1, "read#0")
    with pytest.raises(CheckpointError) as ei:
        read_checked(d, e.file, None, e.size - 1)
    assert ei.value.reason is CheckpointErrorReason.TOO_LARGE
    with pytest.raises(CheckpointError) as ei:
        read_checked(d, e.file, e.size + 1, 1 << 20)
    assert ei.value.reason is CheckpointErrorReason.CHECKSUM_MISMATCH
    with pytest.raises(CheckpointError) as ei:
        read_checked(d, "..", None, 1 << 20)
    assert ei.value.reason is CheckpointErrorReason.UNSAFE_PATH
    with pytest.raises(CheckpointError) as ei:
        load_task_snapshot(storage.root, 1, e.file, e.size, "f" * 64)
    assert ei.value.reason is CheckpointErrorReason.CHECKSUM_MISMATCH


def test_lock_file_is_not_a_checkpoint(storage):
    from abs_engine.checkpoint.lock import DirectoryLock

    make_checkpoint(storage, 1)
    with DirectoryLock(storage.root, job="job") as lock:
        assert storage.ids_on_disk() == [1]
        assert storage.prune() == [] and storage.remove_orphans_after(0) == []
        assert os.path.exists(lock.path)
