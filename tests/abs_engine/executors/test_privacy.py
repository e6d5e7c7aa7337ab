"""Nothing a job writes is readable by another local user, and what the dashboard, the
stored statistics and the report show never holds a record.

One job (a record makes its first attempt fail; a savepoint is asked for over the control
endpoint once it runs again; its dashboard is on), then: every directory it made is 0700
and every file 0600 (checkpoints, state, ``_lock``, ``_fence``, statistics, the savepoint,
the report); user ``nobody`` (uid 65534, a forked child that drops root) can read none of
them nor take the lock; the failure's record and message are in ``JobResult.failures`` and
nowhere else."""

from __future__ import annotations

import json
import os
import stat
import threading
import urllib.request
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from abs_engine import Dataflow
from abs_engine.executors.job_control import request
from abs_engine.monitor.report import write_report
from abs_engine.testing import CapturingSink
from operators.base import Source

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SECRET = "SECRET-7f3a"  #: a record's content: it must not reach what others may see
N = 5_000


class GatedSource(Source[str]):
    """Records 0..N-1 (one of them SECRET), then nothing until ``gate`` exists: the job
    runs until the test has what it waits for (no race with the job's speed)."""

    def __init__(self, gate: str):
        self.gate = gate
        self.pos = 0

    def read_batch(self) -> list[str] | None:
        if self.pos >= N:
            return None if os.path.exists(self.gate) else []
        batch = [SECRET if i == N // 2 else f"r{i}" for i in range(self.pos, min(N, self.pos + 100))]
        self.pos += len(batch)
        return batch

    def snapshot(self, checkpoint_id: int) -> Any:
        return self.pos

    def restore(self, state: Any) -> None:
        self.pos = state


def parse(record: str) -> str:
    if record == SECRET and os.environ.get("ABS_ENGINE_ATTEMPT") == "0":
        raise ValueError(f"cannot parse {record!r}")
    return record


def walk_modes(root: str) -> dict[str, int]:
    modes = {}
    for base, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(base, n)
            modes[os.path.relpath(p, root)] = stat.S_IMODE(os.lstat(p).st_mode)
    modes["."] = stat.S_IMODE(os.stat(root).st_mode)
    return modes


def as_nobody(paths: list[str]) -> dict[str, str]:
    """What user nobody gets opening each path (for reading; the lock also for writing)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            out = {}
            for p in paths:
                try:
                    fd = os.open(p, os.O_RDWR if p.endswith("_lock") else os.O_RDONLY)
                    os.close(fd)
                    out[p] = "opened"
                except OSError as e:
                    out[p] = type(e).__name__
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        said = f.read()
    os.waitpid(pid, 0)
    got: dict[str, str] = json.loads(said)
    return got


def test_a_jobs_files_are_private_and_its_public_views_hold_no_record(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ck, out, gate = str(tmp_path / "ck"), str(tmp_path / "out"), str(tmp_path / "gate")
    flow = Dataflow("private")
    flow.source(GatedSource(gate), name="read").map(parse, name="parse").sink(CapturingSink(out), name="out")
    seen: dict[str, Any] = {}

    def ask() -> None:
        seen["savepoint"] = request(ck, "savepoint", 120)

    def watch(result: Any) -> bool:
        if result.restarts and result.checkpoints_completed and "asked" not in seen:
            seen["asked"] = threading.Thread(target=ask, daemon=True)
            seen["asked"].start()
            url = urlsplit(result.dashboard_url)
            token = parse_qs(url.query)["token"][0]
            api = urllib.request.Request(f"{url.scheme}://{url.netloc}/api/job",
                                         headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(api, timeout=10) as r:
                seen["api"] = r.read().decode()
        if result.savepoint and not os.path.exists(gate):
            open(gate, "w").close()  # the test has its savepoint: let the source end
        return False

    res = flow.run(checkpoint_dir=ck, checkpoint_interval=0.05, restart_delay=0, dashboard=0, stop_when=watch)
    seen["asked"].join(30)
    assert res.restarts == 1 and seen.get("savepoint") == res.savepoint
    assert sorted(CapturingSink(out).records()) == sorted(SECRET if i == N // 2 else f"r{i}" for i in range(N))
    # The whole story for the job's owner: JobResult and the driver's log.
    assert SECRET in res.failures[0] and "ValueError" in res.failures[0]
    report = os.path.join(ck, "report.html")
    write_report(ck, report)

    # 1. Private: 0700 directories, 0600 files, the savepoint and the report included.
    modes = walk_modes(ck)
    assert os.path.commonpath([res.savepoint, ck]) == ck  # the default savepoint_dir is inside
    assert {"_lock", "_fence", "_job_stats.json", "report.html"} <= set(modes)
    assert any(p.startswith("savepoints") and p.endswith(".state") for p in modes)
    loose = {p: oct(m) for p, m in modes.items() if m & 0o077}
    assert loose == {}, loose

    # 2. Another user reads nothing and cannot take the lock.
    states = [os.path.join(base, n) for base, _, files in os.walk(ck) for n in files if n.endswith(".state")]
    targets = [os.path.join(ck, "_lock"), os.path.join(ck, "_job_stats.json"), report, states[0]]
    if os.geteuid() == 0:
        assert as_nobody(targets) == {p: "PermissionError" for p in targets}

    # 3. Public views: the failure's operator and exception type, never the record or message.
    for name, text in (("/api/job", seen["api"]), ("_job_stats.json", open(os.path.join(ck, "_job_stats.json")).read()),
                       ("report", open(report).read())):
        assert SECRET not in text, name
        assert "operator 'parse'" in text and "ValueError" in text, name
