"""The abs-engine command line: plan, checkpoints list, checkpoints show."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest

from abs_engine import codec
from abs_engine.checkpoint.metadata import FileRef, Metadata
from abs_engine.checkpoint.safe_io import METADATA
from abs_engine.checkpoint.storage import CheckpointStorage
from abs_engine.cli import jsonable, main

ROOT = Path(__file__).resolve().parents[2]
WORDCOUNT = ROOT / "examples" / "wordcount.py"


def make_checkpoint(storage: CheckpointStorage, cid: int, states: dict[str, dict], final: bool = False,
                    job: str = "wc") -> Metadata:
    tasks = {}
    for task, ops in states.items():
        blob = codec.pack({"task": task, "checkpoint_id": cid,
                           "operators": {name: codec.pack(s) for name, s in ops.items()}})
        os.makedirs(storage.dir_of(cid), exist_ok=True)
        with open(os.path.join(storage.dir_of(cid), f"{task}.state"), "wb") as f:
            f.write(blob)
        tasks[task] = FileRef(f"{task}.state", len(blob), hashlib.sha256(blob).hexdigest())
    meta = Metadata(cid, job, "fp-123", 1_700_000_000.0, final, tasks,
                    {t: 1.23456 for t in tasks}, 42.0,
                    layout={"shape": "s", "operators": {op: [t] for t, ops in states.items() for op in ops},
                            "max_parallelism": 128,
                            "keyed": [op for ops in states.values() for op in ops if op == "count"],
                            "kinds": {op: KINDS[op] for ops in states.values() for op in ops if op in KINDS}})
    storage.write_metadata(meta)
    return meta


KINDS = {"read": "source TextFileSource", "split": "operator flat_map", "count": "operator count keyed",
         "write": "sink FileSink"}
STATES = {
    "read#0": {"read": 1024, "split": None},
    "count#0": {"count": {"apple": 3, "pear": 1, 7: 2}},
    "write#0": {"write": {"published": 6, "pending": [(2, b"a\t3\n"), (3, b"\xff\xfe")]}},
}


@pytest.fixture
def ckdir(tmp_path) -> tuple[str, CheckpointStorage]:
    d = str(tmp_path / "ck")
    s = CheckpointStorage(d)
    make_checkpoint(s, 1, STATES)
    make_checkpoint(s, 2, STATES, final=True)
    return d, s


# ---- plan ---------------------------------------------------------------------------------


def test_plan_prints_chains_and_partitioning(capsys):
    assert main(["plan", str(WORDCOUNT)]) == 0
    out = capsys.readouterr().out
    assert "job 'wordcount'" in out
    assert "chains" in out
    assert "read [TextFileSource] -> split" in out  # source and flat_map are fused
    assert "count" in out and "write [FileSink]" in out
    assert "-> count_pre [pre_count(key=record)]" in out  # count_final's combiner, chained before the shuffle
    assert "count_pre -> count  [hash]" in out
    assert "read#1" in out and "write#0" in out


def test_plan_of_a_file_without_a_dataflow(tmp_path):
    f = tmp_path / "empty_flow.py"
    f.write_text("x = 1\n")
    with pytest.raises(SystemExit) as ei:
        main(["plan", str(f)])
    assert "build_flow" in str(ei.value.code)


def test_plan_never_runs_the_job_a_file_runs_at_import(tmp_path, capsys):
    marker = tmp_path / "ran"
    f = tmp_path / "runs_at_import.py"
    f.write_text(
        "from abs_engine import Dataflow\n"
        "from abs_engine.testing import TestingSource, CapturingSink\n"
        "flow = Dataflow('eager', parallelism=2)\n"
        f"flow.source(TestingSource(range(10)), name='nums').sink(CapturingSink({str(tmp_path / 'out')!r}), name='out')\n"
        "result = flow.run()\n"
        f"open({str(marker)!r}, 'w').write('ran')\n"
    )
    assert main(["plan", str(f)]) == 0
    assert "job 'eager'" in capsys.readouterr().out
    from abs_engine.api import PlanOnly
    from abs_engine.testing import CapturingSink

    assert not marker.exists() and CapturingSink(tmp_path / "out").records() == []  # nothing ran or written

    assert not PlanOnly.active  # a later flow.run() in this process runs as usual


def test_plan_of_a_build_flow_that_needs_arguments_says_how(tmp_path):
    f = tmp_path / "needs_args.py"
    f.write_text("def build_flow(path, parallelism=2):\n    raise AssertionError('never called')\n")
    with pytest.raises(SystemExit) as ei:
        main(["plan", str(f)])
    assert "needs arguments (path)" in str(ei.value.code) and "defaults" in str(ei.value.code)


ARGPARSE_SCRIPT = (
    "import argparse, sys\n"
    "from abs_engine import Dataflow\n"
    "from abs_engine.testing import TestingSource, CapturingSink\n"
    "ap = argparse.ArgumentParser()\n"
    "ap.add_argument('--parallelism', type=int, default=1)\n"
    "ap.add_argument('--name', default='plain')\n"
    "args = ap.parse_args()\n"
    "flow = Dataflow(args.name, parallelism=args.parallelism)\n"
    "flow.source(TestingSource(range(10)), name='nums').sink(CapturingSink(sys.argv[0] + '.out'), name='out')\n"
    "flow.run()\n")


def test_a_script_with_argparse_gets_its_own_arguments_never_ours(tmp_path, capsys):
    """`abs-engine plan script.py` used to leave `plan script.py` in sys.argv, and the
    script's argparse refused them; its own arguments go after `--`."""
    import sys

    f = tmp_path / "with_args.py"
    f.write_text(ARGPARSE_SCRIPT)
    before = list(sys.argv)
    assert main(["plan", str(f)]) == 0
    assert "job 'plain'" in capsys.readouterr().out
    assert main(["plan", str(f), "--", "--parallelism", "3", "--name", "mine"]) == 0
    out = capsys.readouterr().out
    assert "job 'mine'" in out and "nums x3" in out
    assert sys.argv == before  # (restored: only a job about to run keeps the script's argv)
    with pytest.raises(SystemExit):  # the script's own parser refuses what it does not know
        main(["plan", str(f), "--", "--nope"])


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as ei:
        main([])
    assert ei.value.code == 2
    assert "usage" in capsys.readouterr().err


# ---- checkpoints list ------------------------------------------------------------------------


def test_list(ckdir, capsys):
    d, s = ckdir
    assert main(["checkpoints", "list", d]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["id", "created"]
    rows = {int(line.split()[0]): line for line in lines[1:]}
    assert sorted(rows) == [1, 2]
    assert rows[1].rstrip().endswith("ok") and "False" in rows[1]
    assert rows[2].rstrip().endswith("ok") and "True" in rows[2]
    size = sum(e.size for e in s.load_metadata(1).tasks.values())
    assert f"{size:,}" in rows[1]
    assert " 3 " in rows[1]  # tasks


def test_a_job_of_pipelines_lists_each_and_shows_or_reports_one(tmp_path, capsys):
    d = tmp_path / "ck"
    make_checkpoint(CheckpointStorage(str(d / "pipeline-read")), 4, STATES)
    make_checkpoint(CheckpointStorage(str(d / "pipeline-other")), 7, {"other#0": {"other": 5}})
    assert main(["checkpoints", "list", str(d)]) == 0
    out = capsys.readouterr().out
    assert out.index("pipeline-other:") < out.index("pipeline-read:")
    mine = out.split("pipeline-read:")[1]
    assert [int(line.split()[0]) for line in mine.splitlines()[2:]] == [4]
    assert [int(line.split()[0]) for line in out.split("pipeline-read:")[0].splitlines()[2:] if line] == [7]
    assert main(["checkpoints", "show", str(d)]) == 2
    assert f"e.g. abs-engine checkpoints show {d / 'pipeline-other'}" in capsys.readouterr().err
    assert main(["checkpoints", "show", str(d / "pipeline-read")]) == 0
    assert "checkpoint 4 of job 'wc'" in capsys.readouterr().out
    # One report of the job, a tab per pipeline: each pipeline's stored statistics inlined.
    assert main(["report", str(d)]) == 2  # no statistics stored yet: said, not a broken page
    assert "no job statistics in" in capsys.readouterr().err
    for i, (name, restarts) in enumerate((("read", 0), ("other", 2))):
        (d / f"pipeline-{name}" / "_job_stats.json").write_text(json.dumps(
            {"version": 1, "job": {"name": "wc", "state": "FINISHED", "restarts": restarts}, "checkpoints": {},
             "details": {}, "pipeline_id": i}))
    out = tmp_path / "report.html"
    assert main(["report", str(d), "--output", str(out)]) == 0
    data = json.loads(out.read_text().split("window.ABS_REPORT = ", 1)[1].split(";</script>", 1)[0])
    # in the plan's order (pipeline_id), as the live dashboard shows them, not by name
    assert [(p["name"], p["job"]["restarts"]) for p in data["pipelines"]] == [("read", 0), ("other", 2)]
    # a pipeline without statistics (restored finished from a savepoint: not run again) is
    # left out and said, not the end of the report; a damaged one still fails it
    (d / "pipeline-other" / "_job_stats.json").unlink()
    assert main(["report", str(d), "--output", str(out)]) == 0
    assert "no statistics for pipeline-other" in capsys.readouterr().err
    data = json.loads(out.read_text().split("window.ABS_REPORT = ", 1)[1].split(";</script>", 1)[0])
    assert [p["name"] for p in data["pipelines"]] == ["read"]
    (d / "pipeline-read" / "_job_stats.json").write_text("{not json")
    assert main(["report", str(d), "--output", str(out)]) == 2
    assert "is not JSON" in capsys.readouterr().err


def test_list_marks_invalid_checkpoints(ckdir, capsys):
    d, s = ckdir
    make_checkpoint(s, 3, STATES)
    make_checkpoint(s, 4, STATES)
    with open(os.path.join(s.dir_of(2), "count#0.state"), "r+b") as f:
        f.truncate(3)
    os.remove(os.path.join(s.dir_of(3), "read#0.state"))
    with open(os.path.join(s.dir_of(4), METADATA), "r+b") as f:
        f.truncate(10)
    os.makedirs(s.dir_of(5))  # in progress / crashed before the metadata
    with open(os.path.join(s.dir_of(5), METADATA + ".tmp"), "wb") as f:
        f.write(b"partial")
    assert main(["checkpoints", "list", d]) == 0
    rows = {int(line.split()[0]): line.rstrip() for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows[1].endswith("ok")
    assert rows[2].endswith("INVALID: checksum_mismatch")
    assert rows[3].endswith("INVALID: missing_file")
    assert rows[4].endswith("INVALID: corrupt_metadata")
    assert rows[5].endswith("INVALID: missing_metadata")


def test_list_empty_dir(tmp_path, capsys):
    assert main(["checkpoints", "list", str(tmp_path)]) == 0
    assert "no checkpoints" in capsys.readouterr().out


# ---- checkpoints show ------------------------------------------------------------------------


def test_show_json_newest(ckdir, capsys):
    d, s = ckdir
    assert main(["checkpoints", "show", d, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["checkpoint_id"] == 2
    assert doc["final"] is True
    assert doc["job"] == "wc"
    assert doc["fingerprint"] == "fp-123"
    assert doc["path"] == s.dir_of(2)
    assert set(doc["tasks"]) == set(STATES)
    meta = s.load_metadata(2)
    assert doc["bytes"] == sum(e.size for e in meta.tasks.values())
    read = doc["tasks"]["read#0"]
    assert read["file"] == "read#0.state"
    assert read["bytes"] == meta.tasks["read#0"].size
    assert read["sha256"] == meta.tasks["read#0"].sha256
    assert read["alignment_ms"] == 1.235
    # state decoded per operator, made JSON-friendly
    assert read["state"] == {"read": 1024, "split": None}
    assert doc["tasks"]["count#0"]["state"] == {"count": {"apple": 3, "pear": 1, "7": 2}}
    # Keyed state by key group (the groups a rescale splits it by): keys and encoded bytes each.
    from abs_engine.keygroups import key_group

    groups = doc["tasks"]["count#0"]["summary"]["count"]["keys"]["groups"]
    expected: dict[str, list[int]] = {}
    for k, v in {"apple": 3, "pear": 1, 7: 2}.items():
        g = expected.setdefault(str(key_group(k, 128)), [0, 0])
        g[0] += 1
    assert {g: n for g, (n, _) in groups.items()} == {g: n for g, (n, _) in expected.items()}
    assert all(size > 0 for _, size in groups.values())
    write_bytes = len(codec.pack(STATES["write#0"]["write"]))
    assert doc["tasks"]["write#0"]["summary"]["write"] == {"state": {"bytes": write_bytes, "kind": "sinks"}}
    # Sizes per kind of state: the keyed counts, the source's offset, the sink's pending output.
    count_bytes = doc["tasks"]["count#0"]["summary"]["count"]["keys"]["bytes"]
    assert doc["by_kind"] == {"keyed": count_bytes, "sources": len(codec.pack(1024)), "sinks": write_bytes,
                              "operators": len(codec.pack(None))}
    assert doc["tasks"]["write#0"]["state"] == {"write": {
        "published": 6,
        "pending": [[2, {"$text": "a\t3\n"}], [3, {"$hex": "fffe"}]],
    }}


def test_show_json_by_id(ckdir, capsys):
    d, _ = ckdir
    assert main(["checkpoints", "show", d, "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["checkpoint_id"] == 1 and doc["final"] is False


def test_show_skips_invalid_newest(ckdir, capsys):
    d, s = ckdir
    os.remove(os.path.join(s.dir_of(2), "write#0.state"))
    assert main(["checkpoints", "show", d, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint_id"] == 1


def test_show_text(ckdir, capsys):
    d, _ = ckdir
    assert main(["checkpoints", "show", d]) == 0
    out = capsys.readouterr().out
    assert out.startswith("checkpoint 2 of job 'wc'")
    assert "final=True" in out
    assert "read#0:" in out and "read: 1024" in out
    assert '"apple": 3' in out


def test_show_text_truncates_long_state(tmp_path, capsys):
    s = CheckpointStorage(str(tmp_path))
    make_checkpoint(s, 1, {"t#0": {"big": {f"key{i}": i for i in range(100)}}})
    assert main(["checkpoints", "show", str(tmp_path)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("big:"))
    assert line.endswith("...")
    assert len(line.strip()) == len("big: ") + 200 + 3


def test_show_empty_dir_is_an_error(tmp_path, capsys):
    assert main(["checkpoints", "show", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("abs-engine: error:")
    assert "no valid checkpoint" in captured.err


def test_show_only_invalid_is_an_error(ckdir, capsys):
    d, s = ckdir
    for cid in (1, 2):
        os.remove(os.path.join(s.dir_of(cid), "read#0.state"))
    assert main(["checkpoints", "show", d, "--json"]) == 2
    assert "no valid checkpoint" in capsys.readouterr().err


def test_show_invalid_id_is_an_error(ckdir, capsys):
    d, s = ckdir
    assert main(["checkpoints", "show", d, "9"]) == 2
    assert "no metadata" in capsys.readouterr().err
    with open(os.path.join(s.dir_of(1), "count#0.state"), "ab") as f:
        f.write(b"x")
    assert main(["checkpoints", "show", d, "1", "--json"]) == 2
    assert "checksum" in capsys.readouterr().err


def test_jsonable():
    assert jsonable({(1, "a"): (b"hi", b"\x80"), 3: [1.5, None, True]}) == {
        '[1, "a"]': [{"$text": "hi"}, {"$hex": "80"}],
        "3": [1.5, None, True],
    }


# ---- a distrusted directory -------------------------------------------------------------------


def forge_metadata(storage: CheckpointStorage, cid: int, body: dict) -> None:
    """``_metadata`` with any body and a valid self-checksum (a forgery, not damage)."""
    from abs_engine.checkpoint.safe_io import FORMAT_VERSION, MAGIC

    raw = codec.pack(body)
    with open(os.path.join(storage.dir_of(cid), METADATA), "wb") as f:
        f.write(codec.pack({"magic": MAGIC, "version": FORMAT_VERSION, "body": raw,
                            "sha256": hashlib.sha256(raw).hexdigest()}))


SECRET = "TOP-SECRET-OUTSIDE-THE-DIRECTORY"


@pytest.fixture
def forged(ckdir, tmp_path) -> tuple[str, CheckpointStorage]:
    """Checkpoint 2 names, with matching size and sha256, a file outside the directory."""
    d, s = ckdir
    secret = tmp_path / "secret.state"
    blob = codec.pack({"task": "read#0", "checkpoint_id": 2, "operators": {"read": codec.pack(SECRET)}})
    secret.write_bytes(blob)
    body = s.load_metadata(2).to_dict()
    body["tasks"]["read#0"] = ["../../secret.state", len(blob), hashlib.sha256(blob).hexdigest()]
    forge_metadata(s, 2, body)
    return d, s


def test_list_reports_a_forged_name_as_unsafe(forged, capsys):
    d, _ = forged
    assert main(["checkpoints", "list", d]) == 0
    captured = capsys.readouterr()
    rows = {int(line.split()[0]): line.rstrip() for line in captured.out.splitlines()[1:]}
    assert rows[1].endswith("ok")
    assert rows[2].endswith("INVALID: unsafe_path")
    assert "checkpoint 2:" in captured.err and "plain file name" in captured.err
    assert SECRET not in captured.out + captured.err


def test_show_never_prints_a_file_outside_the_directory(forged, capsys):
    d, _ = forged
    assert main(["checkpoints", "show", d, "2", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "plain file name" in captured.err
    assert SECRET not in captured.err
    assert main(["checkpoints", "show", d, "--json"]) == 0  # falls back to the valid one
    out = capsys.readouterr().out
    assert json.loads(out)["checkpoint_id"] == 1
    assert SECRET not in out


def test_show_refuses_an_absolute_name(ckdir, tmp_path, capsys):
    d, s = ckdir
    secret = tmp_path / "abs.state"
    blob = codec.pack({"task": "read#0", "checkpoint_id": 1, "operators": {"read": codec.pack(SECRET)}})
    secret.write_bytes(blob)
    body = s.load_metadata(1).to_dict()
    body["tasks"]["read#0"] = [str(secret), len(blob), hashlib.sha256(blob).hexdigest()]
    forge_metadata(s, 1, body)
    assert main(["checkpoints", "show", d, "1"]) == 2
    captured = capsys.readouterr()
    assert "plain file name" in captured.err and SECRET not in captured.out + captured.err


@pytest.mark.timeout(10)
def test_list_and_show_do_not_hang_on_a_fifo_metadata(ckdir, capsys):
    d, s = ckdir
    os.makedirs(s.dir_of(3))
    os.mkfifo(os.path.join(s.dir_of(3), METADATA))
    assert main(["checkpoints", "list", d]) == 0
    rows = {int(line.split()[0]): line.rstrip() for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows[3].endswith("INVALID: unsafe_path")
    assert main(["checkpoints", "show", d, "3"]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert main(["checkpoints", "show", d, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint_id"] == 2


@pytest.mark.timeout(10)
def test_list_and_show_refuse_a_state_file_linked_to_dev_zero(ckdir, capsys):
    d, s = ckdir
    path = os.path.join(s.dir_of(2), "count#0.state")
    os.remove(path)
    os.symlink("/dev/zero", path)
    assert main(["checkpoints", "list", d]) == 0
    rows = {int(line.split()[0]): line.rstrip() for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows[2].endswith("INVALID: unsafe_path")
    assert main(["checkpoints", "show", d, "2"]) == 2
    assert "symbolic link" in capsys.readouterr().err


def test_list_ignores_the_lock_file(ckdir, capsys):
    from abs_engine.checkpoint.lock import DirectoryLock

    d, _ = ckdir
    with DirectoryLock(d, job="wc"):
        assert main(["checkpoints", "list", d]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert rows == ["1", "2"]



def test_list_shows_incremental_checkpoints_and_the_retired_ones_they_build_on(tmp_path, capsys):
    from tests.abs_engine.checkpoint.test_incremental import run_chain

    storage, _, _ = run_chain(tmp_path, 5, retain=2)  # 1..3 retired; 4 and 5 build on 1, 2, 3
    assert main(["checkpoints", "list", storage.root]) == 0
    rows = {int(line.split()[0]): line.rstrip() for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows[5].endswith("ok (incremental on 1, 2, 3, 4)")
    assert rows[4].endswith("ok (incremental on 1, 2, 3)")
    assert rows[1].endswith("shared: files used by 4, 5")
    assert rows[3].endswith("shared: files used by 4, 5")


def test_run_runs_the_job_a_file_runs_with_its_options_and_the_given_ones(tmp_path, capsys):
    """`abs-engine run FILE`: the job the file runs (its own options kept: here its
    parallelism's source split), under a supervisor with --supervise; exact output."""
    f = tmp_path / "job.py"
    out = tmp_path / "out"
    f.write_text(
        "from abs_engine import Dataflow\n"
        "from abs_engine.testing import TestingSource, CapturingSink\n"
        "flow = Dataflow('counted', parallelism=2)\n"
        f"flow.source(TestingSource(range(500), batch_size=50), name='nums').map(lambda x: (x % 5, 1))"
        f".key_by(lambda kv: kv[0]).count_final().sink(CapturingSink({str(out)!r}))\n"
        "flow.run(checkpoint_interval=0.02)\n"
    )
    ck = str(tmp_path / "ck")
    assert main(["run", str(f), "--supervise", "--checkpoint-dir", ck]) == 0
    said = capsys.readouterr().out
    assert said.startswith("counted: 500 source records") and f"checkpoints in {ck}" in said
    from abs_engine.testing import CapturingSink

    assert sorted(CapturingSink(out).records()) == [(k, 100) for k in range(5)]
    # without a checkpoint directory there is nothing to resume a crashed driver from
    assert main(["run", str(f), "--supervise"]) == 2
    assert "supervise=True restarts a crashed driver" in capsys.readouterr().err


def test_show_reads_a_window_operators_state_by_its_shape(tmp_path, capsys):
    """A session window job held with every session open: `checkpoints show` counts its keys,
    open windows, timers and watermark exactly (it used to count the state's three fields
    as three keys)."""
    from abs_engine import Dataflow
    from abs_engine.keygroups import key_group
    from abs_engine.testing import CapturingSink, GatedSource, TestingSource
    from operators import SessionWindows, ascending

    keys = [f"user{i}" for i in range(300)]
    items = [(k, t) for t in range(5) for k in keys]  # every key's clicks within one session gap
    flow = Dataflow("sessions")
    (flow.source(GatedSource(TestingSource(items, batch_size=100), tmp_path / "never", after=len(items)), "clicks",
                 timestamps=lambda r: r[1], watermarks=ascending())
     .key_by(lambda r: r[0]).window(SessionWindows(gap=1_000), lambda r: r[1])
     .aggregate(lambda: 0, lambda a, r: a + 1, merge=lambda a, b: a + b, name="sessionize")
     .sink(CapturingSink(tmp_path / "out"), "out"))
    ck = str(tmp_path / "ck")
    res = flow.run(executor="inprocess", checkpoint_dir=ck, checkpoint_interval=0.01,
                   stop_when=lambda r: r.checkpoints_completed >= 3 and r.source_records >= len(items))
    assert res.cancelled
    assert main(["checkpoints", "show", ck, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (summary,) = [t["summary"]["sessionize"] for t in doc["tasks"].values() if "sessionize" in t["summary"]]
    assert summary["keys"]["keys"] == 300 and summary["keys"]["windows"] == 300  # one open session a key
    assert summary["keys"]["key_groups"] == len({key_group(k, 128) for k in keys})
    assert summary["timers"]["timers"] == 300  # each session's end timer
    assert summary["watermark"]["value"] == 3  # ascending: the newest timestamp (4) less one
    assert main(["checkpoints", "show", ck]) == 0
    text = capsys.readouterr().out
    assert "keys: 300 keys in" in text and "300 open windows" in text and "timers" in text


def test_show_counts_a_joins_buffered_records_and_sizes_every_kind_of_state(tmp_path, capsys):
    """An interval join held with every record buffered (its bounds keep all): `checkpoints
    show` counts the buffered records per side exactly, and sums the bytes per kind."""
    from abs_engine import Dataflow
    from abs_engine.testing import CapturingSink, GatedSource, TestingSource
    from operators import ascending

    left = [(f"k{i}", t) for t in range(2) for i in range(50)]  # 100 records, 50 keys
    right = [(f"k{i}", 1) for i in range(50)]  # 50 records
    flow = Dataflow("join")

    def side(items, name):  # type: ignore[no-untyped-def]
        return flow.source(GatedSource(TestingSource(items, batch_size=25), tmp_path / "never", after=len(items)),
                           name, timestamps=lambda r: r[1], watermarks=ascending())

    (side(left, "clicks").interval_join(side(right, "views"), lambda r: r[0], lambda r: r[0], lambda r: r[1],
                                        lambda r: r[1], -1000, 1000, lambda a, b: (a, b), name="pair")
     .sink(CapturingSink(tmp_path / "out"), "out"))
    ck = str(tmp_path / "ck")
    res = flow.run(executor="inprocess", checkpoint_dir=ck, checkpoint_interval=0.01,
                   stop_when=lambda r: r.checkpoints_completed >= 3 and r.source_records >= 150)
    assert res.cancelled
    assert main(["checkpoints", "show", ck, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (summary,) = [t["summary"]["pair"] for t in doc["tasks"].values() if "pair" in t["summary"]]
    assert summary["keys"]["keys"] == 50 and summary["keys"]["buffered"] == [100, 50]
    assert summary["keys"]["kind"] == "joins" and summary["timers"]["kind"] == "timers"
    by_kind = doc["by_kind"]
    assert by_kind["joins"] == summary["keys"]["bytes"] and by_kind["timers"] == summary["timers"]["bytes"]
    assert by_kind["watermarks"] == summary["watermark"]["bytes"] > 0
    assert by_kind["sources"] > 0 and by_kind["sinks"] > 0 and "channel state" not in by_kind  # aligned
    assert main(["checkpoints", "show", ck]) == 0
    text = capsys.readouterr().out
    assert "100 left and 50 right records buffered" in text and f"joins {by_kind['joins']:,} bytes" in text


def test_show_sizes_the_channel_state_of_a_checkpoint(tmp_path, capsys):
    """In-flight records (a back-edge log, an unaligned checkpoint's channel state) are a kind
    of state of their own."""
    s = CheckpointStorage(str(tmp_path))
    meta = make_checkpoint(s, 1, STATES)
    records = [(f"w{i}", i) for i in range(40)]
    blob = codec.pack({"task": "count#0", "checkpoint_id": 1, "operators": {"count": codec.pack(STATES["count#0"]["count"])},
                       "logs": {"split#0->count#0": codec.pack(records)}})
    with open(os.path.join(s.dir_of(1), "count#0.state"), "wb") as f:
        f.write(blob)
    tasks = dict(meta.tasks, **{"count#0": FileRef("count#0.state", len(blob), hashlib.sha256(blob).hexdigest())})
    s.write_metadata(dataclasses.replace(meta, tasks=tasks))
    assert main(["checkpoints", "show", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["by_kind"]["channel state"] == len(codec.pack(records))
    assert main(["checkpoints", "show", str(tmp_path)]) == 0
    assert "channel split#0->count#0: 40 record(s) in flight" in capsys.readouterr().out


def test_planning_a_spark_source_starts_no_spark(tmp_path, capsys, monkeypatch):
    """`abs-engine plan` of a script reading CSV through Spark used to start a JVM (7 s)
    only to print the plan."""
    import abs_engine.spark_session as spark_session

    def no_spark(*a, **kw):
        raise AssertionError("a Spark session was started to plan")

    monkeypatch.setattr(spark_session, "embedded_session", no_spark)
    (tmp_path / "clicks.csv").write_text("user,ts\na,1\n")
    f = tmp_path / "csv_job.py"
    f.write_text(
        "from abs_engine import Dataflow\n"
        "from abs_engine.testing import CapturingSink\n"
        "from operators.spark import SparkSource\n"
        "flow = Dataflow('csv', parallelism=2)\n"
        f"flow.source(SparkSource.csv({str(tmp_path / 'clicks.csv')!r}), 'clicks').sink("
        f"CapturingSink({str(tmp_path / 'out')!r}), 'out')\n"
        "flow.run()\n")
    assert main(["plan", str(f)]) == 0
    assert "SparkSource" in capsys.readouterr().out
