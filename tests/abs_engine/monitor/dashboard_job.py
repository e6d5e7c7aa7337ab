"""A paced job for the browser test: runs until SIGTERM stops it with a savepoint.

    python dashboard_job.py CHECKPOINT_DIR
"""

from __future__ import annotations

import os
import sys
import time

from abs_engine import Dataflow
from abs_engine.testing import CapturingSink
from operators import RangeSource


def paced(i: int) -> str:
    if i % 100 == 0:
        time.sleep(0.002)  # the workload: about 50k records a second, so the job runs for minutes
    return f"w{i}"


def main(directory: str) -> None:
    flow = Dataflow("browser")
    # Generated, not a list: 10M strings built and shipped to the workers cost seconds.
    (flow.source(RangeSource(10_000_000, batch_size=100), "read", parallelism=2)
     .map(paced, "paced", parallelism=2).key_by(lambda w: w[-2:]).count("count", parallelism=2)
     .sink(CapturingSink(os.path.join(directory, "out")), "out"))
    flow.run(checkpoint_dir=os.path.join(directory, "ckpt"), checkpoint_interval=0.3, dashboard=0,
             channel_buffer=65536)


if __name__ == "__main__":
    main(sys.argv[1])
