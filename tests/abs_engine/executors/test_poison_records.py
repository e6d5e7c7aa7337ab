"""Every user function is guarded the same way, end to end in real worker processes: a
record that makes a source's timestamps function, a window's timestamp function or a
key_by key function raise fails the job at once the second time it fails (a poison record:
one restart, not ten), naming the operator, the function, the exception and the record;
with on_error="skip" the job completes, the record is reported as skipped, and the output
is exactly the batch computation over the other records."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from abs_engine import Dataflow, JobFailed
from abs_engine.testing import CapturingSink, TestingSource
from operators import TumblingWindows

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

N = 3000
SIZE = 100  #: the windows' size, in timestamp units


def rows(bad: dict[int, str]) -> list[str]:
    """``key,timestamp`` lines (ascending within every subtask: no record is ever late),
    with the lines at the indices of ``bad`` replaced."""
    return [bad.get(i, f"k{i % 5},{i}") for i in range(N)]


def parse_ts(line: str) -> int:
    return int(line.split(",")[1])


def line_key(line: str) -> str:
    return line.split(",")[0]


def window_counts(lines: list[str]) -> list[tuple[Any, ...]]:
    """The batch oracle: (key, start, end, count) of every tumbling window."""
    counts = Counter((line_key(r), parse_ts(r) // SIZE * SIZE) for r in lines)
    return sorted((k, s, s + SIZE, c) for (k, s), c in counts.items())


def failed_at_once(flow: Dataflow, capsys: Any) -> str:
    """Run ``flow`` with ten restarts allowed: it must fail as a poison record after one."""
    with pytest.raises(JobFailed) as ei:
        flow.run(restart_attempts=10, restart_delay=0, progress=True)
    err = capsys.readouterr().err
    # the first failure only restarts (its pipeline, or its lane alone: executors/regions.py)
    assert err.count("restarting (attempt") + err.count("restarting region") == 1
    text = str(ei.value).split("\n\n--- traceback")[0]
    assert "poison record" in text
    return text


# -- a source's timestamps function -------------------------------------------------------------

def test_a_bad_row_in_a_timestamps_function_fails_the_job_at_once_naming_it(tmp_path: Any, capsys: Any) -> None:
    flow = Dataflow("ts_poison", parallelism=2)
    flow.source(TestingSource(rows({1234: "garbage"})), name="read", timestamps=parse_ts) \
        .sink(CapturingSink(tmp_path / "c"))
    text = failed_at_once(flow, capsys)
    assert "operator 'read'" in text and "the timestamps function 'parse_ts' raised IndexError" in text
    assert "record: 'garbage'" in text


def test_a_bad_row_in_a_timestamps_function_is_skipped_and_reported(tmp_path: Any) -> None:
    lines = rows({1234: "garbage", 2001: "k1,noon"})  # no timestamp; one that is no number
    sink = CapturingSink(tmp_path / "c")
    flow = Dataflow("ts_skip", parallelism=2)
    (flow.source(TestingSource(lines), name="read", timestamps=parse_ts, on_error="skip")
     .key_by(line_key).window(TumblingWindows(SIZE), parse_ts).aggregate(lambda: 0, lambda n, r: n + 1, name="win")
     .sink(sink, parallelism=1))
    res = flow.run(checkpoint_interval=0.05, restart_delay=0)
    assert res.restarts == 0 and res.skipped_records == 2
    good = [r for i, r in enumerate(lines) if i not in (1234, 2001)]
    assert sorted(sink.records()) == window_counts(good)


# -- a window's timestamp function ----------------------------------------------------------

def window_ts(line: str) -> int:
    ts = line.split(",")[2]  # the window reads a field of its own (the source's is fine)
    return int(ts)


def window_job(name: str, sink: Any, lines: list[str], on_error: str = "fail") -> Dataflow:
    flow = Dataflow(name, parallelism=2)
    (flow.source(TestingSource([f"{r},{parse_ts(r)}" if r.count(",") == 1 else r for r in lines]), name="read",
                 timestamps=parse_ts)
     .key_by(line_key).window(TumblingWindows(SIZE), window_ts)
     .aggregate(lambda: 0, lambda n, r: n + 1, name="win", on_error=on_error)
     .sink(sink, parallelism=1))
    return flow


def test_a_bad_record_in_a_windows_timestamp_function_fails_the_job_at_once(tmp_path: Any, capsys: Any) -> None:
    text = failed_at_once(window_job("win_poison", CapturingSink(tmp_path / "c"), rows({777: "k2,777,late"})),
                          capsys)
    assert "operator 'win'" in text and "the timestamp function 'window_ts' raised ValueError" in text
    assert "record: 'k2,777,late'" in text


def test_a_bad_record_in_a_windows_timestamp_function_is_skipped(tmp_path: Any) -> None:
    lines = rows({777: "k2,777,late"})
    sink = CapturingSink(tmp_path / "c")
    res = window_job("win_skip", sink, lines, on_error="skip").run(checkpoint_interval=0.05, restart_delay=0)
    assert res.restarts == 0 and res.skipped_records == 1
    assert sorted(sink.records()) == window_counts([r for i, r in enumerate(lines) if i != 777])


# -- a key_by key function -------------------------------------------------------------------

def user_key(x: int) -> int:
    if x == 1234:
        raise LookupError(f"no user for {x}")
    return x % 7


def test_a_bad_record_in_a_key_function_fails_the_job_at_once_naming_key_by(tmp_path: Any, capsys: Any) -> None:
    flow = Dataflow("key_poison", parallelism=2)
    flow.source(TestingSource(range(N)), name="read").key_by(user_key).count_final(name="count") \
        .sink(CapturingSink(tmp_path / "c"), parallelism=1)
    text = failed_at_once(flow, capsys)
    assert "operator \"key_by(user_key) of 'count'\"" in text
    assert "the key function 'user_key' raised LookupError: no user for 1234" in text and "record: 1234" in text


@pytest.mark.parametrize("parallelism", [2, 1])  # keyed before the shuffle (2 channels), in the operator (1)
def test_a_bad_record_in_a_key_function_is_skipped(tmp_path: Any, parallelism: int) -> None:
    sink = CapturingSink(tmp_path / "c")
    flow = Dataflow("key_skip", parallelism=parallelism)
    flow.source(TestingSource(range(N)), name="read").key_by(user_key, on_error="skip").count_final(name="count") \
        .sink(sink, parallelism=1)
    res = flow.run(checkpoint_interval=0.05, restart_delay=0)
    assert res.restarts == 0 and res.skipped_records == 1
    assert sorted(sink.records()) == sorted(Counter(x % 7 for x in range(N) if x != 1234).items())
