"""Running a dataflow: compile it, pick who starts its workers, and hand it to the master
that fits it: ``JobMaster`` (master.py) for a job run as one, ``PipelinedMaster``
(pipelined.py) for a job of several pipelines that fail over alone, or the supervisor
(supervisor.py) that runs either in a driver process of its own."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..pipelines import find_pipelines
from .config import JobConfig, JobResult
from .launcher import Launcher
from .master import JobMaster
from .pipelined import PipelinedMaster

if TYPE_CHECKING:
    from ..api import Dataflow


def run_job(flow: "Dataflow", config: JobConfig) -> JobResult:
    """Compile ``flow`` and run it on the executor ``config.executor`` names (under a
    supervisor with ``config.supervise``: supervisor.py)."""
    plan = flow.compile()
    if config.supervise:
        from .supervisor import supervise

        return supervise(flow, config, plan.job)
    # Spark sources read through Spark jobs of their own while the job runs.
    reserve = sum(n.template.spark_slots for n in flow.graph.nodes.values())
    # (The in-process executor runs the whole job in the calling thread: one debugger, one job.)
    if config.failover == "pipeline" and config.executor != "inprocess" and len(find_pipelines(plan)) > 1:
        # (each pipeline's launcher counts the slots the others' workers hold as taken)
        return PipelinedMaster(flow.graph, plan, config, lambda others: make_launcher(config, reserve + others)).run()
    launcher = make_launcher(config, reserve)
    try:
        master = JobMaster(flow.graph, plan, config, launcher)
        res = master.run()
    finally:
        if launcher is not None:
            launcher.close()
    master.sources.count()
    return res


def make_launcher(config: JobConfig, reserve_slots: int = 0) -> Launcher | None:
    """Who starts the workers (None: the in-process executor has none)."""
    if config.executor == "inprocess":
        return None
    if config.executor == "local":
        from .local import LocalLauncher

        return LocalLauncher(config.host)
    if config.executor == "spark":
        from .spark import SparkLauncher

        return SparkLauncher(config.spark, reserve_slots)
    raise ValueError(f"unknown executor {config.executor!r}")


__all__ = ["run_job", "make_launcher"]
