"""Checkpoints on a real S3-compatible server (moto's standalone server on loopback):
the storage contract of storage.py (commit point, verification, fallback, pruning,
distrust of what is read back), and word count under SIGKILLs with its checkpoints there."""

from __future__ import annotations

import hashlib
import itertools

import pytest

from abs_engine import codec, fs
from abs_engine.checkpoint.remote import RemoteStorage, load_task_state, open_storage, write_task_state
from abs_engine.checkpoint.metadata import FileRef, Metadata, encode_metadata
from abs_engine.checkpoint.safe_io import METADATA, chk_name
from abs_engine.checkpoint.storage import CheckpointStorage
from tests.conftest import covered_by_the_cluster_test
from abs_engine.errors import CheckpointError, CheckpointErrorReason

_R = CheckpointErrorReason
_prefixes = itertools.count()


@pytest.fixture
def remote(s3_server) -> RemoteStorage:
    storage = open_storage(s3_server(f"ck-{next(_prefixes)}"), retain=2)
    assert isinstance(storage, RemoteStorage)
    storage.make_root()
    return storage


def checkpoint(storage: RemoteStorage, cid: int, tasks: tuple[str, ...] = ("a#0", "b#0"), job_id: str = "j1",
               final: bool = False) -> Metadata:
    """State files written as the workers do (write_task_state), then the metadata."""
    entries = {}
    for t in tasks:
        blob = codec.pack({"task": t, "checkpoint_id": cid, "operators": {"op": codec.pack({"n": cid})},
                           "logs": {}, "finished": False})
        write_task_state(storage.root, cid, f"{t}.state", blob)
        entries[t] = FileRef(f"{t}.state", len(blob), hashlib.sha256(blob).hexdigest())
    meta = Metadata(checkpoint_id=cid, job="job", fingerprint="fp", created=1.0, final=final, tasks=entries,
                    alignment_ms={}, duration_ms=1.0, job_id=job_id)
    storage.write_metadata(meta)
    return meta


def test_a_local_location_or_file_uri_is_the_descriptor_safe_storage(tmp_path):
    assert type(open_storage(str(tmp_path))) is CheckpointStorage
    assert open_storage(f"file://{tmp_path}/ck").root == f"{tmp_path}/ck"


def test_checkpoints_round_trip_and_the_newest_valid_is_restored(remote):
    for cid in (1, 2, 3):
        checkpoint(remote, cid)
    assert remote.completed_ids() == [1, 2, 3]
    meta, skipped = remote.latest_valid("fp", job_id="j1")
    assert meta is not None and meta.checkpoint_id == 3 and skipped == []
    assert remote.read_state(3, "a#0") == {"op": {"n": 3}}
    e = meta.tasks["b#0"]
    assert load_task_state(remote.root, 3, e.file, e.size, e.sha256).states == {"op": {"n": 3}}
    assert remote.prune() == [1] and remote.completed_ids() == [2, 3]


def test_state_without_metadata_is_not_a_checkpoint_and_is_removed_at_restart(remote):
    checkpoint(remote, 1)
    write_task_state(remote.root, 2, "a#0.state", b"half a checkpoint")  # the crash came before the commit
    assert remote.ids_on_disk() == [1, 2] and remote.completed_ids() == [1]
    assert remote.latest_valid("fp")[0].checkpoint_id == 1  # type: ignore[union-attr]
    assert remote.remove_orphans_after(1) == [2] and remote.ids_on_disk() == [1]


def test_a_state_file_is_never_put_over_an_existing_one(remote):
    checkpoint(remote, 1)
    with pytest.raises(CheckpointError) as info:
        write_task_state(remote.root, 1, "a#0.state", b"a stale writer")
    assert info.value.reason is _R.UNSAFE_PATH
    assert remote.verify(1).checkpoint_id == 1


@pytest.mark.parametrize("damage", ["flip", "truncate", "grow", "delete"])
def test_a_damaged_state_object_is_skipped_for_the_previous_checkpoint(remote, damage):
    checkpoint(remote, 1)
    meta = checkpoint(remote, 2)
    name = (chk_name(2), meta.tasks["a#0"].file)
    data = remote.store.objects.read(name, 1 << 20)
    if damage == "delete":
        remote.store.objects.fs.delete_file(remote.store.objects.path(*name))
    else:
        changed = {"flip": bytes([data[0] ^ 1]) + data[1:], "truncate": data[:-1], "grow": data + b"x" * 10}[damage]
        remote.store.objects.put(name, changed)
    restored, skipped = remote.latest_valid("fp")
    assert restored is not None and restored.checkpoint_id == 1
    reason = {"flip": _R.CHECKSUM_MISMATCH, "truncate": _R.CHECKSUM_MISMATCH, "grow": _R.TOO_LARGE,
              "delete": _R.MISSING_FILE}[damage]
    assert [(e.checkpoint_id, e.reason) for e in skipped] == [(2, reason)]


def test_metadata_that_reaches_outside_its_checkpoint_is_refused(remote):
    meta = checkpoint(remote, 1)
    bad = Metadata(checkpoint_id=1, job="job", fingerprint="fp", created=1.0, final=False,
                   tasks={"a#0": meta.tasks["a#0"]}, alignment_ms={}, duration_ms=1.0)
    doc = codec.unpack(encode_metadata(bad))
    body = codec.unpack(doc["body"])
    body["tasks"]["a#0"] = ["../ck-elsewhere/a#0.state", *body["tasks"]["a#0"][1:]]
    doc["body"] = codec.pack(body)
    doc["sha256"] = hashlib.sha256(doc["body"]).hexdigest()
    remote.store.objects.put((chk_name(1), METADATA), codec.pack(doc))
    with pytest.raises(CheckpointError) as info:
        remote.verify(1)
    assert info.value.reason is _R.UNSAFE_PATH


def test_oversized_metadata_is_refused_unread(remote, monkeypatch):
    from abs_engine.checkpoint import remote as remote_mod

    checkpoint(remote, 1)
    monkeypatch.setattr(remote_mod, "MAX_METADATA", 16)
    with pytest.raises(CheckpointError) as info:
        remote.load_metadata(1)
    assert info.value.reason is _R.TOO_LARGE


def test_an_unreachable_store_fails_the_restore_instead_of_falling_back(remote, monkeypatch):
    checkpoint(remote, 1)
    checkpoint(remote, 2)

    def down(*args: object, **kw: object) -> bytes:
        raise fs.StoreError("connection refused")

    monkeypatch.setattr(remote.store.objects, "read", down)
    with pytest.raises(CheckpointError) as info:
        remote.latest_valid("fp")
    assert info.value.reason is _R.UNREACHABLE  # never "restore from checkpoint 1" or from nothing


# ---- a job with its checkpoints on the S3 server ---------------------------------------------


def _wordcount(src: str, out: str, parallelism: int = 2, gate: str | None = None):  # type: ignore[no-untyped-def]
    """test_recovery's word count (held by ``gate`` until the kills), named apart."""
    from tests.abs_engine.executors.test_recovery import wordcount

    return wordcount(src, out, parallelism, gate, name="wordcount-s3")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_wordcount_with_checkpoints_on_s3_under_sigkills_is_exact(s3_server, medium_corpus, tmp_path):
    from abs_engine.testing import KillOnCheckpoints
    from tests.abs_engine.executors.test_recovery import as_counts, output_lines
    from tests.chaos_checks import assert_each_kill_restored
    from tests.conftest import batch_word_count

    location = s3_server("wordcount-kills")
    out, gate = str(tmp_path / "out.tsv"), str(tmp_path / "gate")
    chaos = KillOnCheckpoints([1, 2, 3], seed=7, open_gate=gate)
    res = _wordcount(medium_corpus, out, gate=gate).run(checkpoint_interval=0.05, checkpoint_dir=location,
                                                        chaos=chaos, restart_delay=0, retained_checkpoints=2)
    assert as_counts(output_lines(out)) == batch_word_count(medium_corpus)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    storage = open_storage(location)
    assert res.checkpoint_dir == storage.shown and "endpoint_override" in res.checkpoint_dir
    completed = storage.completed_ids()
    assert len(completed) == 2 and storage.verify(completed[-1]).final  # pruned to 2; the final one committed


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(240)
@covered_by_the_cluster_test
def test_wordcount_on_spark_with_checkpoints_on_s3_under_sigkills_is_exact(spark, s3_server, medium_corpus,
                                                                          tmp_path):
    """Workers inside Spark tasks write and read their state on the S3 server."""
    from abs_engine.testing import KillOnCheckpoints
    from tests.abs_engine.executors.test_recovery import as_counts, output_lines
    from tests.chaos_checks import assert_each_kill_restored
    from tests.conftest import batch_word_count

    out, gate = str(tmp_path / "out.tsv"), str(tmp_path / "gate")
    chaos = KillOnCheckpoints([1, 2], seed=3, open_gate=gate)
    res = _wordcount(medium_corpus, out, gate=gate).run(executor="spark", spark=spark, checkpoint_interval=0.05,
                                                        checkpoint_dir=s3_server("wordcount-spark"), chaos=chaos,
                                                        restart_delay=0)
    assert as_counts(output_lines(out)) == batch_word_count(medium_corpus)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)


def test_a_job_on_an_unreachable_store_fails_at_once_with_the_reason(small_corpus, tmp_path):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(CheckpointError) as info:
        _wordcount(small_corpus, str(tmp_path / "o.tsv")).run(
            checkpoint_dir=f"s3://nobucket/ck?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1")
    assert info.value.reason is _R.UNREACHABLE and f"127.0.0.1:{port}" in str(info.value)
    assert not (tmp_path / "o.tsv").exists()
