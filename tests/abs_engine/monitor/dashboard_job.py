"""A paced event-time job for the browser test: runs until SIGTERM stops it with a savepoint.
Its windows meet one late record (``LATE_AT``) and a map skips one (``SKIP_AT``). A second,
slower pipeline ("ticks", independent of the first) gives the dashboard a tab per pipeline.

Each source subtask holds after ``HOLD`` records (indices below ``LATE_AT``) until the file
``gate`` in the directory exists: the test opens it once every windows task's watermark has
passed the late record's window, so that record is late however the subtasks were scheduled
(its lateness depends on both source subtasks' watermarks, not only on its own subtask's).

    python dashboard_job.py CHECKPOINT_DIR
"""

from __future__ import annotations

import os
import sys
import time

from abs_engine import Dataflow
from abs_engine.testing import CapturingSink, GatedSource
from operators import RangeSource, TumblingWindows, ascending


def slow(i: int) -> int:
    if i % 100 == 0:
        time.sleep(0.01)  # the workload: about 10k records a second, beside the main pipeline
    return i


def paced(i: int) -> str:
    if i % 100 == 0:
        time.sleep(0.002)  # the workload: about 50k records a second, so the job runs for minutes
    return f"w{i}"


LATE_AT, SKIP_AT = 5_000, 7_000  #: the record whose timestamp is far behind, the one a map skips
HOLD = 2_000  #: records each of the two source subtasks reads before the gate (up to index 3,999)
WINDOW = 1_000  #: the tumbling windows' size: the late record's window ends here


def timestamp(i: int) -> int:
    return 0 if i == LATE_AT else i  # behind the watermark once the window [0, 1000) has fired


def event_time(w: str) -> int:
    return timestamp(int(w[1:]))


def checked(w: str) -> str:
    if w == f"w{SKIP_AT}":
        raise ValueError("this record is skipped")
    return w


def main(directory: str) -> None:
    flow = Dataflow("browser")
    # Generated, not a list: 10M strings built and shipped to the workers cost seconds.
    source = GatedSource(RangeSource(10_000_000, batch_size=100), os.path.join(directory, "gate"), HOLD)
    words = (flow.source(source, "read", parallelism=2, timestamps=timestamp, watermarks=ascending())
             .map(paced, "paced", parallelism=2).map(checked, "checked", on_error="skip"))
    words.key_by(lambda w: w[-2:]).count("count", parallelism=2).sink(CapturingSink(os.path.join(directory, "out")),
                                                                      "out")
    # Event time: windows per key, with the late record on their side output.
    windows = (words.key_by(lambda w: w[-1:]).window(TumblingWindows(WINDOW), event_time)
               .aggregate(lambda: 0, lambda a, w: a + 1, name="windows", parallelism=2))
    windows.sink(CapturingSink(os.path.join(directory, "windows")), "window_out")
    windows.late.sink(CapturingSink(os.path.join(directory, "late")), "late")
    (flow.source(RangeSource(10_000_000, batch_size=100), "ticks").map(slow, "slow")
     .sink(CapturingSink(os.path.join(directory, "ticks")), "ticks_out"))
    flow.run(checkpoint_dir=os.path.join(directory, "ckpt"), checkpoint_interval=0.3, dashboard=0,
             channel_buffer=65536)


if __name__ == "__main__":
    main(sys.argv[1])
