"""The CheckpointStore contract (checkpoint/stores.py), the same tests for every store: the
local directory, the simulation's memory store and a real S3-compatible server. Whatever
a store is, the commit point is ``put_metadata``, reads are bounded and verified with the
same CheckpointError reasons, retiring keeps only the named files; and the storage logic
(CheckpointStorage) over it keeps, verifies and falls back alike."""

from __future__ import annotations

import hashlib
import itertools
import os
from typing import Any, Callable

import pytest

from abs_engine import codec
from abs_engine.checkpoint import remote, stores
from abs_engine.checkpoint.metadata import FileRef, Metadata
from abs_engine.checkpoint.safe_io import MAX_STATE_FILE, METADATA, chk_name
from abs_engine.checkpoint.storage import CheckpointStorage
from abs_engine.checkpoint.stores import CheckpointStore, LocalStore
from abs_engine.errors import CheckpointError, CheckpointErrorReason
from abs_engine.simulation import storage as sim_storage

_R = CheckpointErrorReason
_prefixes = itertools.count()
Plant = Callable[[int, str, bytes], None]  #: (checkpoint id, name, bytes): written raw, over anything there


@pytest.fixture(params=["local", "memory", "remote"])
def store(request: Any, tmp_path: Any) -> tuple[CheckpointStore, Plant]:
    if request.param == "local":
        local = LocalStore(os.path.realpath(str(tmp_path / "ck")))
        local.make_root()

        def plant_local(cid: int, name: str, data: bytes) -> None:
            os.makedirs(local.dir_of(cid), exist_ok=True)
            with open(os.path.join(local.dir_of(cid), name), "wb") as f:
                f.write(data)
        return local, plant_local
    if request.param == "memory":
        memory = sim_storage.MemoryStore()
        return memory, lambda cid, name, data: memory.blobs.setdefault(cid, {}).__setitem__(name, data)
    objects = remote.RemoteStore(request.getfixturevalue("s3_server")(f"stores-{next(_prefixes)}"))
    objects.make_root()
    return objects, lambda cid, name, data: objects.objects.put((chk_name(cid), name), data)


def _entry(data: bytes) -> tuple[int, str]:
    return len(data), hashlib.sha256(data).hexdigest()


def test_a_checkpoint_exists_from_its_metadata_on(store: tuple[CheckpointStore, Plant]) -> None:
    s, plant = store
    assert s.ids() == []
    plant(2, "a#0.state", b"state")
    plant(1, "a#0.state", b"state")
    assert s.ids() == [1, 2] and not s.has_metadata(1)
    with pytest.raises(CheckpointError) as info:
        s.read_metadata(1)
    assert info.value.reason is _R.MISSING_METADATA
    shown = s.put_metadata(1, b"the document")
    assert s.has_metadata(1) and not s.has_metadata(2)
    assert s.read_metadata(1) == (b"the document", shown) and f"{chk_name(1)}/{METADATA}" in shown
    assert chk_name(1) in s.dir_of(1) and s.shown.partition("?")[0] in s.dir_of(1)


DAMAGE: dict[str, tuple[Callable[[bytes], bytes], CheckpointErrorReason]] = {
    "flip": (lambda d: bytes([d[0] ^ 1]) + d[1:], _R.CHECKSUM_MISMATCH),
    "truncate": (lambda d: d[:-1], _R.CHECKSUM_MISMATCH),
    "grow": (lambda d: d + b"x" * 10, _R.TOO_LARGE),
}


@pytest.mark.parametrize("damage", [*DAMAGE, "missing", "unsafe", "huge"])
def test_reads_are_bounded_and_verified_with_the_same_reasons(store: tuple[CheckpointStore, Plant],
                                                              damage: str) -> None:
    s, plant = store
    data = b"some state bytes"
    size, sha = _entry(data)
    plant(1, "a#0.state", data)
    got, shown = s.read_file(1, "a#0.state", size, sha)
    assert got == data and f"{chk_name(1)}/a#0.state" in shown
    name, recorded, reason = "a#0.state", size, None
    if damage in DAMAGE:
        change, reason = DAMAGE[damage]
        plant(1, "a#0.state", change(data))
    elif damage == "missing":
        name, reason = "b#0.state", _R.MISSING_FILE
    elif damage == "unsafe":
        name, reason = "../chk-000002/a#0.state", _R.UNSAFE_PATH
    else:
        recorded, reason = MAX_STATE_FILE + 1, _R.TOO_LARGE
    with pytest.raises(CheckpointError) as info:
        s.read_file(1, name, recorded, sha, task="a#0")
    assert info.value.reason is reason and info.value.checkpoint_id == 1
    assert "task a#0" in str(info.value)


def test_metadata_reads_are_bounded(store: tuple[CheckpointStore, Plant], monkeypatch: pytest.MonkeyPatch) -> None:
    s, plant = store
    for module in (stores, remote, sim_storage):
        monkeypatch.setattr(module, "MAX_METADATA", 16)
    s.put_metadata(1, b"x" * 16)
    assert s.read_metadata(1)[0] == b"x" * 16
    plant(1, METADATA, b"x" * 17)
    with pytest.raises(CheckpointError) as info:
        s.read_metadata(1)
    assert info.value.reason is _R.TOO_LARGE


def test_retire_keeps_only_the_named_files_and_remove_deletes_all(store: tuple[CheckpointStore, Plant]) -> None:
    s, plant = store
    for name in ("a#0.state", "b#0.state", "b#0.spill0"):
        plant(1, name, b"bytes")
    s.put_metadata(1, b"doc")
    plant(2, "a#0.state", b"bytes")
    assert s.list_files(1) == {"a#0.state", "b#0.state", "b#0.spill0", METADATA}
    s.retire(1, {"a#0.state"})
    assert s.list_files(1) == {"a#0.state"} and not s.has_metadata(1)
    s.remove(1)
    s.remove(3)  # nothing there: fine
    assert s.ids() == [2] and s.list_files(1) == set()


def _checkpoint(storage: CheckpointStorage, plant: Plant, cid: int) -> Metadata:
    tasks = {}
    for t in ("a#0", "b#0"):
        blob = codec.pack({"task": t, "checkpoint_id": cid, "operators": {"op": codec.pack({"n": cid})},
                           "logs": {}, "finished": False})
        plant(cid, f"{t}.state", blob)
        tasks[t] = FileRef(f"{t}.state", *_entry(blob))
    meta = Metadata(checkpoint_id=cid, job="job", fingerprint="fp", created=1.0, final=False, tasks=tasks,
                    alignment_ms={}, duration_ms=1.0)
    storage.write_metadata(meta)
    return meta


def test_the_storage_logic_is_the_same_over_every_store(store: tuple[CheckpointStore, Plant]) -> None:
    s, plant = store
    storage = CheckpointStorage(s, retain=2)
    assert storage.root == s.root and storage.shown == s.shown
    for cid in (1, 2, 3):
        meta = _checkpoint(storage, plant, cid)
        storage.prune()
    plant(4, "a#0.state", b"in progress")
    assert storage.completed_ids() == [2, 3] and storage.ids_on_disk() == [2, 3, 4]
    assert storage.read_state(3, "a#0") == {"op": {"n": 3}}
    plant(3, meta.tasks["b#0"].file, b"damaged")
    restored, skipped = storage.latest_valid("fp")
    assert restored is not None and restored.checkpoint_id == 2
    assert [(e.checkpoint_id, e.reason) for e in skipped] == [(3, _R.CHECKSUM_MISMATCH)]
    assert storage.remove_orphans_after(2) == [4] and storage.ids_on_disk() == [2, 3]
