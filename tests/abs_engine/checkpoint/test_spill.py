"""Spill files (checkpoint/spill.py): a state file's channel state read back from its spill
files in order, and every way a spill file can be wrong refused with a typed error
(the files are written here as the writer writes them)."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import pytest

from abs_engine import codec
from abs_engine.checkpoint import spill
from abs_engine.checkpoint.safe_io import load_task_snapshot, write_state_file
from abs_engine.errors import CheckpointError, CheckpointErrorReason
from abs_engine.checkpoint.snapshot_file import encode as snapshot_file

_R = CheckpointErrorReason
CID = 7


def frames(*batches: list[Any]) -> list[bytes]:
    return [codec.pack(b) for b in batches]


def write(root: str, name: str, blob: bytes) -> tuple[str, int, str]:
    write_state_file(root, CID, name, blob)
    return name, len(blob), hashlib.sha256(blob).hexdigest()


def checkpoint(root: str, spilled: list[tuple[str, int, str]], own: dict[str, bytes]) -> Any:
    blob = snapshot_file("t#0", CID, codec.pack({}), own, False, spilled=spilled)
    name, size, sha = write(root, "t#0.tag.state", blob)
    return load_task_snapshot(root, CID, name, size, sha)


def test_logs_are_the_spill_files_in_order_then_the_state_files_own(tmp_path):
    root = str(tmp_path)
    s0 = write(root, spill.file_name("t#0.tag.state", 0), spill.encode({"a": frames([1, 2], [3]), "b": frames([10])}))
    s1 = write(root, spill.file_name("t#0.tag.state", 1), spill.encode({"a": frames([4]), "b": []}))
    snap = checkpoint(root, [s0, s1], {"a": codec.join_arrays(frames([5])), "c": codec.pack([])})
    assert snap.logs == {"a": [1, 2, 3, 4, 5], "b": [10], "c": []}
    assert snap.spilled == () and s0[0] == "t#0.tag.spill0"


@pytest.mark.parametrize("damage, reason", [
    ("flip", _R.CHECKSUM_MISMATCH),
    ("truncate", _R.CHECKSUM_MISMATCH),
    ("grow", _R.TOO_LARGE),
    ("remove", _R.MISSING_FILE),
    ("symlink", _R.UNSAFE_PATH),
])
def test_a_damaged_spill_file_makes_the_checkpoint_unusable(tmp_path, damage, reason):
    root = str(tmp_path)
    ref = write(root, "t#0.tag.spill0", spill.encode({"a": frames([1, 2, 3])}))
    path = os.path.join(root, "chk-000007", ref[0])
    data = open(path, "rb").read()
    os.unlink(path)
    if damage == "flip":
        open(path, "wb").write(data[:-1] + bytes([data[-1] ^ 1]))
    elif damage == "truncate":
        open(path, "wb").write(data[:-1])
    elif damage == "grow":
        open(path, "wb").write(data + b"\0")
    elif damage == "symlink":
        open(tmp_path / "elsewhere", "wb").write(data)
        os.symlink(tmp_path / "elsewhere", path)
    with pytest.raises(CheckpointError) as info:
        checkpoint(root, [ref], {})
    assert info.value.reason is reason and ref[0] in str(info.value)


def test_a_spill_reference_outside_the_checkpoint_directory_is_refused_before_it_is_read(tmp_path):
    root = str(tmp_path)
    blob = spill.encode({"a": frames([1])})
    (tmp_path / "outside").write_bytes(blob)
    with pytest.raises(CheckpointError) as info:
        checkpoint(root, [("../outside", len(blob), hashlib.sha256(blob).hexdigest())], {})
    assert info.value.reason is _R.UNSAFE_PATH


def test_a_spill_file_that_is_not_a_map_of_channels_is_corrupt(tmp_path):
    ref = write(str(tmp_path), "t#0.tag.spill0", codec.pack([1, 2]))
    with pytest.raises(CheckpointError) as info:
        checkpoint(str(tmp_path), [ref], {})
    assert info.value.reason is _R.CORRUPT_STATE and "spill file" in str(info.value)


@pytest.mark.parametrize("refs", [
    "x", [["f", 1]], [["f", -1, "0" * 64]], [["f", 1, "nothex"]], [[1, 1, "0" * 64]], [["f", True, "0" * 64]],
])
def test_malformed_spill_references_are_refused(refs):
    with pytest.raises(ValueError):
        spill.parse_refs(refs)


def test_a_state_file_with_malformed_spill_references_is_corrupt(tmp_path):
    root = str(tmp_path)
    blob = codec.pack({"task": "t#0", "checkpoint_id": CID, "operators": {}, "logs": {}, "finished": False,
                       "spilled": [["f", "ten", "0" * 64]]})
    name, size, sha = write(root, "t#0.tag.state", blob)
    with pytest.raises(CheckpointError) as info:
        load_task_snapshot(root, CID, name, size, sha)
    assert info.value.reason is _R.CORRUPT_STATE


def test_verification_checks_spill_files_and_reading_the_logs_resolves_them(tmp_path):
    """A checkpoint's verification (what recovery runs before choosing it) reads every
    spill file with its checks, and a damaged one makes the checkpoint invalid."""
    from abs_engine.checkpoint.metadata import FileRef, Metadata
    from abs_engine.checkpoint.storage import CheckpointStorage

    root = str(tmp_path)
    ref = write(root, "t#0.tag.spill0", spill.encode({"a": frames([1, 2])}))
    blob = snapshot_file("t#0", CID, codec.pack({}), {"a": codec.join_arrays(frames([3]))}, False, spilled=[ref])
    name, size, sha = write(root, "t#0.tag.state", blob)
    storage = CheckpointStorage(root)
    storage.write_metadata(Metadata(checkpoint_id=CID, job="j", fingerprint="f", created=0.0, final=False,
                                    tasks={"t#0": FileRef(name, size, sha)}, alignment_ms={}, duration_ms=1.0))
    assert storage.verify(CID).checkpoint_id == CID
    assert storage.read_logs(CID, "t#0") == {"a": [1, 2, 3]}
    path = os.path.join(root, "chk-000007", ref[0])
    data = open(path, "rb").read()
    os.unlink(path)
    open(path, "wb").write(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CheckpointError) as info:
        storage.verify(CID)
    assert info.value.reason is _R.CHECKSUM_MISMATCH
    assert storage.latest_valid()[0] is None


def test_the_writer_counts_spills_until_written_and_lists_them_in_order(tmp_path):
    """Spill jobs hand their bytes to the writer thread: counted as unwritten (what
    wait_spills holds the task thread on) until written, then listed in order."""
    import threading

    from abs_engine.runtime.writer import SnapshotWriter, SpillJob

    errors: list[BaseException] = []
    writer = SnapshotWriter(None, "t#0", str(tmp_path), errors.append)  # type: ignore[arg-type]
    gate = threading.Event()
    refs: list[tuple[str, int, str]] = []
    first = spill.encode({"a": frames([1])})

    def slow() -> bytes:
        gate.wait()
        return first

    writer.spill(SpillJob(CID, "t#0.tag.spill0", slow, refs, 100))
    writer.spill(SpillJob(CID, "t#0.tag.spill1", lambda: spill.encode({"a": frames([2])}), refs, 50))
    assert writer.spilling == 150 and refs == []  # the first write is held at its gate
    gate.set()
    writer.wait_spills(0)
    assert writer.spilling == 0 and not errors
    assert [r[0] for r in refs] == ["t#0.tag.spill0", "t#0.tag.spill1"]
    assert refs[0][1:] == (len(first), hashlib.sha256(first).hexdigest())
    snap = checkpoint(str(tmp_path), refs, {})
    assert snap.logs == {"a": [1, 2]}
