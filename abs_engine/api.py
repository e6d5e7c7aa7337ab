"""The user-facing graph API: a Dataflow, and Streams with map/flat_map/filter/key_by/...

A word count::

    flow = Dataflow("wordcount", parallelism=2)
    words = flow.source(TextFileSource("in.txt")).flat_map(str.split)
    words.key_by().count_final().sink(FileSink("out.tsv"), parallelism=1)
    flow.run(checkpoint_interval=1.0, checkpoint_dir="ckpt")

This module holds ``Dataflow``; the streams it makes live in ``abs_engine.streams``
(``Stream``, ``Feedback``), ``abs_engine.keyed`` (``KeyedStream``) and
``abs_engine.windowed`` (``WindowedStream``, ``WindowResults``), and are importable from
here as well.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from operators.base import Source
from operators.basic import Identity
from operators.eventtime import BoundedOutOfOrderness, EventTimeSource

from .errors import GraphError, GraphErrorReason
from .names import check_name
from .keygroups import UPPER_BOUND
from .graph import LogicalGraph, Node, NodeKind
from .keyed import KeyedStream
from .streams import Feedback, Stream, T, _on_error
from .windowed import WindowedStream, WindowResults

if TYPE_CHECKING:
    from .executors.config import JobResult
    from .plan import Plan

__all__ = ["Dataflow", "PlanOnly", "Stream", "KeyedStream", "WindowedStream", "WindowResults", "Feedback"]


class Dataflow:
    """A dataflow under construction. ``name`` names the job (its checkpoints, its logs, a
    sink's bookkeeping; letters, digits, ``_``, ``-`` and ``.``). ``parallelism`` is the
    default for every operator. ``max_parallelism`` is the number of key groups keys are
    spread over (keygroups.py): the most subtasks any operator can ever have, fixed for the
    life of the job (its checkpoints record it; rescaling keeps it). GraphError for a bad
    value."""

    def __init__(self, name: str = "dataflow", parallelism: int = 1, max_parallelism: int = 128):
        if not isinstance(parallelism, int) or isinstance(parallelism, bool) or parallelism < 1:
            raise GraphError(GraphErrorReason.BAD_PARALLELISM, f"parallelism must be an int >= 1, got {parallelism!r}")
        if (not isinstance(max_parallelism, int) or isinstance(max_parallelism, bool)
                or not 1 <= max_parallelism <= UPPER_BOUND):
            raise GraphError(GraphErrorReason.BAD_PARALLELISM,
                             f"max_parallelism must be an int between 1 and {UPPER_BOUND}, got {max_parallelism!r}")
        self.graph = LogicalGraph(name=check_name(name, "dataflow"), default_parallelism=parallelism,
                                  max_parallelism=max_parallelism)
        self._counters: dict[str, int] = {}

    def _name(self, wanted: str | None, base: str) -> str:
        if wanted is not None:
            check_name(wanted, "operator")
            if wanted in self.graph.nodes:
                raise GraphError(
                    GraphErrorReason.DUPLICATE_NAME,
                    f"operator name {wanted!r} is used twice: give each operator a unique name",
                    wanted,
                )
            return wanted
        n = self._counters.get(base, 0) + 1
        self._counters[base] = n
        name = base if n == 1 else f"{base}_{n}"
        while name in self.graph.nodes:
            n += 1
            self._counters[base] = n
            name = f"{base}_{n}"
        return name

    def _add(self, node: Node) -> None:
        if node.parallelism is not None and (
            not isinstance(node.parallelism, int) or isinstance(node.parallelism, bool) or node.parallelism < 1
        ):
            raise GraphError(
                GraphErrorReason.BAD_PARALLELISM,
                f"operator {node.name!r}: parallelism must be an int >= 1, got {node.parallelism!r}",
                node.name,
            )
        self.graph.nodes[node.name] = node

    def source(self, source: Source[T], name: str | None = None, parallelism: int | None = None,
               timestamps: Callable[[T], Any] | None = None,
               watermarks: BoundedOutOfOrderness | None = None, on_error: str = "fail") -> "Stream[T]":
        """The stream of records ``source`` reads, in ``parallelism`` subtasks (the dataflow's
        default if None; at most the source's ``max_subtasks``). Each subtask reads its own
        share and snapshots its offset. ``name`` names the source operator (as in ``Stream.map``).

        Event time (docs/event-time.md): ``timestamps(record)`` gives a record's timestamp
        and ``watermarks`` (default ``BoundedOutOfOrderness(0)``: ascending timestamps) how
        far behind the newest one the subtask's watermark stays, and after how long without
        records it declares itself idle. ``on_error`` applies to ``timestamps``: a record it
        raises on (or gives no number for) fails the task naming the record ("fail"), or is
        dropped and reported ("skip")."""
        if not isinstance(source, Source):
            raise GraphError(
                GraphErrorReason.BAD_ARGUMENT,
                f"Dataflow.source() takes an operators.Source, got {type(source).__name__}",
            )
        if watermarks is not None and timestamps is None:
            raise GraphError(GraphErrorReason.BAD_ARGUMENT,
                             "Dataflow.source(): watermarks= needs timestamps= (the function that reads a "
                             "record's event time)")
        if watermarks is not None and not isinstance(watermarks, BoundedOutOfOrderness):
            raise GraphError(GraphErrorReason.BAD_ARGUMENT,
                             f"Dataflow.source(): watermarks= takes a BoundedOutOfOrderness, got "
                             f"{type(watermarks).__name__}")
        _on_error(on_error)
        limit = source.max_subtasks
        if limit is not None and parallelism is not None and parallelism > limit:
            raise GraphError(GraphErrorReason.BAD_ARGUMENT,
                             f"Dataflow.source(): {type(source).__name__} can be read by at most {limit} subtask(s), "
                             f"not {parallelism}: give it parallelism={limit} (or leave parallelism out)")
        if limit is not None and parallelism is None:
            parallelism = min(limit, self.graph.default_parallelism)
        if on_error != "fail" and timestamps is None:
            raise GraphError(GraphErrorReason.BAD_ARGUMENT,
                             "Dataflow.source(): on_error= applies to the timestamps= function; without one "
                             "there is no user function to guard (give on_error to the operators instead)")
        if timestamps is not None:
            if not callable(timestamps):
                raise GraphError(GraphErrorReason.BAD_ARGUMENT,
                                 "Dataflow.source(): timestamps= must be a function of the record")
            source = EventTimeSource(source, timestamps, watermarks or BoundedOutOfOrderness(), on_error)
        n = self._name(name, "source")
        label = type(source.inner).__name__ + "[event time]" if isinstance(source, EventTimeSource) else \
            type(source).__name__
        self._add(Node(n, NodeKind.SOURCE, source, label, parallelism))
        return Stream(self, n)

    def feedback(self, name: str | None = None, parallelism: int | None = None) -> "Feedback[Any]":
        """A loop handle: use it as a stream now, ``connect`` the loop's end to it later.
        Annotate it for typed loops: ``loop: Feedback[int] = flow.feedback()``. ``name`` and
        ``parallelism`` are its operator's (as in ``Stream.map``)."""
        n = self._name(name, "feedback")
        self._add(Node(n, NodeKind.OPERATOR, Identity(), "feedback", parallelism, feedback=True, connected=False))
        return Feedback(self, n)

    # -- compiling and running (imported lazily: the API does not depend on the runtime) --

    def compile(self) -> "Plan":
        """Validate the graph and expand it into subtasks and channels (pure data); raises
        GraphError naming the problem (a cycle with no source, an unconnected feedback...)."""
        from .compiler import compile_graph

        return compile_graph(self.graph)

    def explain(self) -> str:
        """The compiled plan as text: operators, subtasks, edges and back-edges."""
        from .compiler import explain

        return explain(self.compile())

    def run(self, **config: Any) -> "JobResult":
        """Run the job; see executors.config.JobConfig for the options (``executor=`` picks
        who starts the workers)."""
        if PlanOnly.active:
            raise PlanOnly(self, config)  # `abs-engine plan`/`run` load the file: loading never runs a job
        from .executors.config import JobConfig
        from .executors.run import run_job

        return run_job(self, JobConfig(**config))


class PlanOnly(BaseException):
    """Raised by ``Dataflow.run`` while ``abs-engine plan`` (or ``run``) loads a job file
    (``active`` is then True): the file's job is captured, never run, carrying ``flow`` and
    the options ``config`` it was run with. A BaseException, so user code's ``except
    Exception`` cannot swallow it."""

    active = False

    def __init__(self, flow: Dataflow, config: dict[str, Any] | None = None):
        super().__init__("planning only")
        self.flow = flow
        self.config = dict(config or {})  #: the options the file ran it with
