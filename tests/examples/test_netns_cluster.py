"""A real multi-host Spark cluster (examples/netns_cluster.py: every host a network
namespace, no shared disk, checkpoints and output on an S3 store of its own): word count
under a lost host, a 20 s network partition, and lossy, delayed links, each exactly equal
to its batch oracle, each detected and recovered in bounded time, and no worker of an old
attempt writing anything afterwards.

Skipped where network namespaces cannot be made (not root, a container without
CAP_SYS_ADMIN), unless ABS_ENGINE_REQUIRE_CLUSTER is set (CI sets it: there the test cannot
quietly not run). One Spark application runs the three jobs in turn (its start-up is paid
once), the partitioned host healing while the last job runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from examples.netns_cluster import NetnsCluster, namespaces_allowed

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(480)]

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "..", "..", "examples", "cluster_wordcount.py")
HEARTBEAT_TIMEOUT = 6.0


@pytest.fixture
def cluster(tmp_path):  # type: ignore[no-untyped-def]
    why = namespaces_allowed()
    if why:
        if os.environ.get("ABS_ENGINE_REQUIRE_CLUSTER"):
            pytest.fail(f"the namespace cluster must run here: {why}")
        pytest.skip(why)
    c = NetnsCluster(workers=3, cores=1, root=str(tmp_path / "cluster"))
    c.start()
    try:
        yield c
    finally:
        c.stop()


#: long enough to be seen (heartbeat_timeout) and recovered from (about 8 s) well before the heal
PARTITION_SECONDS = 20


def test_a_lost_host_a_partition_and_lossy_links_on_a_multi_host_cluster_are_exact(cluster):
    p = cluster.popen("driver", [sys.executable, JOB, "--fault", "host,partition,netem",
                                 "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT),
                                 "--partition-seconds", str(PARTITION_SECONDS)],
                      env=cluster.env(), output=subprocess.PIPE, cwd=os.getcwd())
    out, _ = p.communicate(timeout=280)
    text = out.decode(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.startswith("[{")]
    assert lines, text[-4000:]
    host, partition, netem = reports = json.loads(lines[-1])
    shown = json.dumps(reports, indent=1)  # every report whole, whichever assertion fails
    for r in (host, partition, netem):
        # Exactly the oracle's rows (every 100th count of every word, once each), restored
        # from the checkpoint the fault followed.
        assert r["exact"], shown
        assert r["restarts"] >= 1 and r["restored_from"][0] == r["fault_after_checkpoint"], shown
    # A lost machine: its connections reset, so it is seen at once; the job goes on at
    # once on the two hosts left, and the host's slots come back when it does.
    assert host["failure_seen_after_s"] < HEARTBEAT_TIMEOUT, shown
    assert host.get("running_again_after_s") is not None, shown
    # A partition: seen within the heartbeat timeout (plus the driver's 0.1 s check and a
    # loaded machine's slack); the job recovers on the slots left, long before the heal.
    assert partition["failure_seen_after_s"] <= HEARTBEAT_TIMEOUT + 2, shown
    assert "heartbeat_timeout" in partition["failure"], shown
    assert partition.get("running_again_after_s", PARTITION_SECONDS) < PARTITION_SECONDS, shown
    # The cut-off workers fenced themselves (control connection unacknowledged for half
    # the timeout: about 4 s) before their replacements ran, and after the heal nothing of
    # theirs is left and nothing on the store changed.
    gone = partition["old_workers_gone_after_s"]
    assert gone is not None and gone < partition["running_again_after_s"], shown
    assert partition["old_workers_left_after_heal"] == [], shown
    assert partition["written_after_heal"] == [], shown
    assert netem["links"], shown
    assert p.returncode == 0, text[-4000:]
