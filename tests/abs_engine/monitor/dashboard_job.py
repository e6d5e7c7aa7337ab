"""A paced job for the browser test: runs until SIGTERM stops it with a savepoint.

    python dashboard_job.py CHECKPOINT_DIR
"""

from __future__ import annotations

import os
import sys
import time

from abs_engine import Dataflow
from abs_engine.testing import CapturingSink, TestingSource


def paced(w: str) -> str:
    if w.endswith("00"):
        time.sleep(0.002)  # the workload: about 50k records a second, so the job runs for minutes
    return w


def main(directory: str) -> None:
    flow = Dataflow("browser")
    (flow.source(TestingSource([f"w{i}" for i in range(10_000_000)]), "read", parallelism=2)
     .map(paced, "paced", parallelism=2).key_by(lambda w: w[-2:]).count("count", parallelism=2)
     .sink(CapturingSink(os.path.join(directory, "out")), "out"))
    flow.run(checkpoint_dir=os.path.join(directory, "ckpt"), checkpoint_interval=0.3, dashboard=0,
             channel_buffer=65536)


if __name__ == "__main__":
    main(sys.argv[1])
