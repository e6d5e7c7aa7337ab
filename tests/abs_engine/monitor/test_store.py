"""Stored job statistics: written whole, read back bounded, and refused with a typed error
when missing, planted (a link, a FIFO), too big or not a statistics document."""

from __future__ import annotations

import json
import os

import pytest

from abs_engine.errors import CheckpointError, CheckpointErrorReason
from abs_engine.monitor import store
from abs_engine.monitor.model import CheckpointStatus
from abs_engine.monitor.report import json_for_script, render
from abs_engine.monitor.tracker import JobTracker
from tests.abs_engine.monitor.test_tracker import Clock, plan


def tracker(tmp_path) -> JobTracker:  # type: ignore[no-untyped-def]
    tr = JobTracker(plan(tmp_path / "out"), "aligned", 1.0, Clock())
    tr.job_id = "job-1"
    tr.triggered(1, "aligned", 1000.0, 6)
    return tr


def test_written_when_changed_and_read_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tr = tracker(tmp_path)
    w = store.StatsWriter(str(tmp_path))
    w.write(tr)
    assert w.flush()
    doc = store.read_stats(str(tmp_path))
    assert doc["job"]["jid"] == "job-1" and doc["checkpoints"]["counts"]["in_progress"] == 1
    os.remove(tmp_path / store.STATS_FILE)
    w.write(tr, force=True)  # nothing changed since: not written again
    assert not (tmp_path / store.STATS_FILE).exists()
    tr.abort_pending("the job ended")
    w.write(tr, force=True)
    assert store.read_stats(str(tmp_path))["checkpoints"]["counts"]["failed"] == 1
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]
    tr.triggered(2, "aligned", 1000.0, 6)
    w.write(tr, force=True)
    w.close()  # one job, one thread: it ends with the job
    assert not w._thread.is_alive()
    assert store.read_stats(str(tmp_path))["checkpoints"]["counts"]["in_progress"] == 1


def test_a_failed_write_is_tried_again_and_never_raises(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tr = tracker(tmp_path)
    w = store.StatsWriter(str(tmp_path))
    real = w.dir.put
    calls = []

    def flaky(names, data):  # type: ignore[no-untyped-def]
        calls.append(names)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        real(names, data)

    monkeypatch.setattr(w.dir, "put", flaky)
    w.write(tr, force=True)  # fails: reported, not raised
    assert "No space left" in w.error and not (tmp_path / store.STATS_FILE).exists()
    w.write(tr, force=True)  # nothing changed, but the last write failed: written now
    assert w.error == "" and store.read_stats(str(tmp_path))["job"]["jid"] == "job-1"
    assert len(calls) == 2


def test_non_finite_numbers_are_written_as_null(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tr = JobTracker(plan(tmp_path / "out"), "aligned", float("inf"), Clock())
    w = store.StatsWriter(str(tmp_path))
    w.write(tr, force=True)
    assert w.error == "" and store.read_stats(str(tmp_path))["job"]["checkpoint_interval"] is None


def test_a_planted_link_where_the_report_goes_is_replaced_not_written_through(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from abs_engine.monitor.report import write_report

    store.StatsWriter(str(tmp_path)).write(tracker(tmp_path), force=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "report.html"
    os.symlink(victim, out)
    write_report(str(tmp_path), str(out))
    assert victim.read_text() == "keep me" and not out.is_symlink() and "job-1" in out.read_text()


def test_missing_planted_large_and_foreign_files_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CheckpointError) as e:
        store.read_stats(str(tmp_path))
    assert e.value.reason is CheckpointErrorReason.NOT_FOUND and "checkpoint_dir" in str(e.value)
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"version": 1, "job": {}, "checkpoints": {}, "details": {}}))
    os.symlink(secret, tmp_path / store.STATS_FILE)
    with pytest.raises(CheckpointError) as e:
        store.read_stats(str(tmp_path))
    assert e.value.reason is CheckpointErrorReason.UNSAFE_PATH
    os.remove(tmp_path / store.STATS_FILE)
    os.mkfifo(tmp_path / store.STATS_FILE)  # would block a reader that opened it plainly
    with pytest.raises(CheckpointError) as e:
        store.read_stats(str(tmp_path))
    assert e.value.reason is CheckpointErrorReason.UNSAFE_PATH
    os.remove(tmp_path / store.STATS_FILE)
    with open(tmp_path / store.STATS_FILE, "wb") as f:
        f.truncate(store.MAX_STATS_BYTES + 1)  # sparse: no disk used
    with pytest.raises(CheckpointError) as e:
        store.read_stats(str(tmp_path))
    assert e.value.reason is CheckpointErrorReason.TOO_LARGE
    for bad in (b"{not json", b'{"version": 2, "job": {}, "checkpoints": {}, "details": {}}', b"[1, 2]",
                b'{"version": 1, "job": {"duration": NaN}, "checkpoints": {}, "details": {}}'):  # (no report could inline it)
        (tmp_path / store.STATS_FILE).write_bytes(bad)
        with pytest.raises(CheckpointError) as e:
            store.read_stats(str(tmp_path))
        assert e.value.reason is CheckpointErrorReason.CORRUPT_STATE


def test_report_inlines_everything_and_data_cannot_end_its_script(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tr = tracker(tmp_path)
    tr.ended(1, CheckpointStatus.FAILED,
             "</script><script>alert(1)</script>\u2028")
    html = render(tr.report_doc())
    assert 'src="static/' not in html and 'href="static/' not in html  # nothing fetched: opens offline
    assert "alert(1)</script>" not in html and "\\u003c/script>" in html
    assert json.loads(json_for_script({"a": "</script>\u2028"})) == {"a": "</script>\u2028"}
