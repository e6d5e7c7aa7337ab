"""The user-facing graph API: a Dataflow, and Streams with map/flat_map/filter/key_by/...

    flow = Dataflow("wordcount", parallelism=2)
    words = flow.source(TextFileSource("in.txt")).flat_map(str.split)
    words.key_by().count_final().sink(FileSink("out.tsv"), parallelism=1)
    flow.run(checkpoint_interval=1.0, checkpoint_dir="ckpt")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable

from operators.aggregate import Aggregate, AggregateFinal, FoldFinal, StatefulMap
from operators.base import Operator, Sink, Source
from operators.basic import Filter, FlatMap, Identity, Map
from operators.keyed import Count, CountFinal, Reduce, ReduceFinal

from .errors import GraphError, GraphErrorReason
from .keygroups import UPPER_BOUND
from .graph import Edge, LogicalGraph, Node, NodeKind, Partition

if TYPE_CHECKING:
    from .executors.config import JobResult
    from .plan import Plan


def _on_error(on_error: str) -> str:
    if on_error not in ("fail", "skip"):
        raise GraphError(GraphErrorReason.BAD_ARGUMENT,
                         f"on_error must be 'fail' or 'skip', got {on_error!r}")
    return on_error


def _fn_label(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


class Dataflow:
    """A dataflow under construction. ``parallelism`` is the default for every operator.
    ``max_parallelism`` is the number of key groups keys are spread over (keygroups.py): the
    most subtasks any operator can ever have, fixed for the life of the job (its
    checkpoints record it; rescaling keeps it)."""

    def __init__(self, name: str = "dataflow", parallelism: int = 1, max_parallelism: int = 128):
        if not isinstance(parallelism, int) or isinstance(parallelism, bool) or parallelism < 1:
            raise GraphError(GraphErrorReason.BAD_PARALLELISM, f"parallelism must be an int >= 1, got {parallelism!r}")
        if (not isinstance(max_parallelism, int) or isinstance(max_parallelism, bool)
                or not 1 <= max_parallelism <= UPPER_BOUND):
            raise GraphError(GraphErrorReason.BAD_PARALLELISM,
                             f"max_parallelism must be an int between 1 and {UPPER_BOUND}, got {max_parallelism!r}")
        self.graph = LogicalGraph(name=name, default_parallelism=parallelism, max_parallelism=max_parallelism)
        self._counters: dict[str, int] = {}

    def _name(self, wanted: str | None, base: str) -> str:
        if wanted is not None:
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

    def source(self, source: Source, name: str | None = None, parallelism: int | None = None) -> "Stream":
        if not isinstance(source, Source):
            raise GraphError(
                GraphErrorReason.BAD_ARGUMENT,
                f"Dataflow.source() takes an operators.Source, got {type(source).__name__}",
            )
        n = self._name(name, "source")
        self._add(Node(n, NodeKind.SOURCE, source, type(source).__name__, parallelism))
        return Stream(self, n)

    def feedback(self, name: str | None = None, parallelism: int | None = None) -> "Feedback":
        """A loop handle: use it as a stream now, ``connect`` the loop's end to it later."""
        n = self._name(name, "feedback")
        self._add(Node(n, NodeKind.OPERATOR, Identity(), "feedback", parallelism, feedback=True, connected=False))
        return Feedback(self, n)

    # -- compiling and running (imported lazily: the API does not depend on the runtime) --

    def compile(self) -> "Plan":
        from .compiler import compile_graph

        return compile_graph(self.graph)

    def explain(self) -> str:
        from .compiler import explain

        return explain(self.compile())

    def run(self, **config: Any) -> "JobResult":
        """Run the job; see executors.config.JobConfig for the options (``executor=`` picks
        who starts the workers)."""
        if PlanOnly.active:
            raise PlanOnly(self)  # `abs-engine plan` loads the file: it never runs a job
        from .executors.master import JobConfig, run_job

        return run_job(self, JobConfig(**config))


class PlanOnly(BaseException):
    """Raised by ``Dataflow.run`` while ``abs-engine plan`` loads a file (``active``): the
    file's job is captured, never run. A BaseException, so user code's ``except
    Exception`` cannot swallow it."""

    active = False

    def __init__(self, flow: Dataflow):
        super().__init__("planning only")
        self.flow = flow


class Stream:
    """A stream of records produced by one operator."""

    def __init__(self, flow: Dataflow, node: str, partition: Partition | None = None):
        self.flow = flow
        self.node = node
        self._partition = partition

    def _then(
        self,
        op: Operator,
        base: str,
        label: str,
        name: str | None,
        parallelism: int | None,
        key_fn: Callable[[Any], Any] | None = None,
        keyed: bool = False,
        kind: NodeKind = NodeKind.OPERATOR,
    ) -> str:
        n = self.flow._name(name, base)
        self.flow._add(Node(n, kind, op, label, parallelism, key_fn=key_fn, keyed=keyed))
        self.flow.graph.edges.append(Edge(self.node, n, self._partition))
        return n

    def map(self, fn: Callable[[Any], Any], name: str | None = None, parallelism: int | None = None,
            on_error: str = "fail") -> "Stream":
        """``fn(record)`` for every record. on_error="skip" drops (and reports) records on
        which ``fn`` raises; the default fails the task, naming the record."""
        return Stream(self.flow, self._then(Map(fn, _on_error(on_error)), "map", f"map({_fn_label(fn)})", name,
                                            parallelism))

    def flat_map(
        self, fn: Callable[[Any], Iterable[Any]], name: str | None = None, parallelism: int | None = None,
        on_error: str = "fail",
    ) -> "Stream":
        """Every record ``fn(record)`` yields; on_error as in map()."""
        return Stream(self.flow, self._then(FlatMap(fn, _on_error(on_error)), "flat_map", f"flat_map({_fn_label(fn)})",
                                            name, parallelism))

    def filter(self, fn: Callable[[Any], bool], name: str | None = None, parallelism: int | None = None,
               on_error: str = "fail") -> "Stream":
        """The records for which ``fn(record)`` is true; on_error as in map()."""
        return Stream(self.flow, self._then(Filter(fn, _on_error(on_error)), "filter", f"filter({_fn_label(fn)})",
                                            name, parallelism))

    def apply(self, op: Operator, name: str | None = None, parallelism: int | None = None) -> "Stream":
        """Any user-defined Operator subclass."""
        return Stream(self.flow, self._then(op, "apply", type(op).__name__, name, parallelism))

    def key_by(self, key: Callable[[Any], Any] | None = None) -> "KeyedStream":
        """Partition by ``key(record)`` (the record itself when key is None)."""
        return KeyedStream(self.flow, self.node, key)

    def rebalance(self) -> "Stream":
        return Stream(self.flow, self.node, Partition.REBALANCE)

    def forward(self) -> "Stream":
        return Stream(self.flow, self.node, Partition.FORWARD)

    def union(self, *others: "Stream", name: str | None = None, parallelism: int | None = None) -> "Stream":
        for o in others:
            if o.flow is not self.flow:
                raise GraphError(GraphErrorReason.FOREIGN_STREAM, "union() of streams from different Dataflows")
        n = self._then(Identity(), "union", "union", name, parallelism)
        for o in others:
            self.flow.graph.edges.append(Edge(o.node, n, o._partition))
        return Stream(self.flow, n)

    def sink(self, sink: Sink, name: str | None = None, parallelism: int | None = None) -> None:
        if not isinstance(sink, Sink):
            raise GraphError(
                GraphErrorReason.BAD_ARGUMENT, f"Stream.sink() takes an operators.Sink, got {type(sink).__name__}"
            )
        self._then(sink, "sink", type(sink).__name__, name, parallelism, kind=NodeKind.SINK)


class KeyedStream(Stream):
    """A stream whose next operator is keyed: its input is hash-partitioned by the key."""

    def __init__(self, flow: Dataflow, node: str, key_fn: Callable[[Any], Any] | None):
        super().__init__(flow, node, Partition.HASH)
        self.key_fn = key_fn

    def _keyed(self, op: Operator, base: str, name: str | None, parallelism: int | None) -> Stream:
        label = f"{base}(key={_fn_label(self.key_fn) if self.key_fn else 'record'})"
        return Stream(self.flow, self._then(op, base, label, name, parallelism, key_fn=self.key_fn, keyed=True))

    def count(self, name: str | None = None, parallelism: int | None = None) -> Stream:
        """Running count per key: ``(key, count so far)`` for every record."""
        return self._keyed(Count(self.key_fn), "count", name, parallelism)

    def count_final(self, name: str | None = None, parallelism: int | None = None) -> Stream:
        """Count per key for bounded input: ``(key, count)`` once per key at the end."""
        return self._keyed(CountFinal(self.key_fn), "count_final", name, parallelism)

    def reduce(self, fn: Callable[[Any, Any], Any], name: str | None = None, parallelism: int | None = None,
               on_error: str = "fail") -> Stream:
        """Running reduce per key: a key's first record is its accumulator, then ``acc =
        fn(acc, record)``; emits ``(key, acc)`` for every record. ``fn`` combines two values
        of the record's type; for an accumulator of another type use ``aggregate``. If
        ``fn`` raises, the key's state is unchanged; on_error="fail" fails the task naming
        the record, "skip" drops and reports it."""
        return self._keyed(Reduce(fn, self.key_fn, _on_error(on_error)), "reduce", name, parallelism)

    def reduce_final(
        self, fn: Callable[[Any, Any], Any], name: str | None = None, parallelism: int | None = None,
        on_error: str = "fail",
    ) -> Stream:
        """``reduce`` for bounded input: ``(key, acc)`` once per key at the end."""
        return self._keyed(ReduceFinal(fn, self.key_fn, _on_error(on_error)), "reduce_final", name, parallelism)

    def aggregate(self, create: Callable[[], Any], add: Callable[[Any, Any], Any],
                  result: Callable[[Any], Any] | None = None, name: str | None = None,
                  parallelism: int | None = None, on_error: str = "fail") -> Stream:
        """Running aggregate per key (Flink's AggregateFunction): ``acc = add(acc, record)``
        from ``create()``; emits ``(key, result(acc))`` (or ``(key, acc)``) for every record.
        E.g. a running mean: ``aggregate(lambda: (0, 0), lambda a, r: (a[0] + 1, a[1] + r[1]),
        lambda a: a[1] / a[0])``. See operators/aggregate.py for failures and state."""
        return self._keyed(Aggregate(create, add, result, self.key_fn, _on_error(on_error)), "aggregate", name,
                           parallelism)

    def aggregate_final(self, create: Callable[[], Any], add: Callable[[Any, Any], Any],
                        result: Callable[[Any], Any] | None = None, name: str | None = None,
                        parallelism: int | None = None, on_error: str = "fail") -> Stream:
        """``aggregate`` for bounded input: ``(key, result(acc))`` once per key at the end."""
        return self._keyed(AggregateFinal(create, add, result, self.key_fn, _on_error(on_error)), "aggregate_final",
                           name, parallelism)

    def fold_final(self, create: Callable[[], Any], fold: Callable[[Any, Any], Any], name: str | None = None,
                   parallelism: int | None = None, on_error: str = "fail") -> Stream:
        """Fold per key for bounded input (Bytewax's ``fold_final``): ``acc = fold(acc,
        record)`` from ``create()``; ``(key, acc)`` once per key at the end."""
        return self._keyed(FoldFinal(create, fold, self.key_fn, _on_error(on_error)), "fold_final", name,
                           parallelism)

    def stateful_map(self, fn: Callable[[Any, Any], tuple[Any, Any]], name: str | None = None,
                     parallelism: int | None = None, on_error: str = "fail") -> Stream:
        """Per key (Bytewax's ``stateful_map``): ``state, out = fn(state, record)``, ``state``
        None for a key's first record; emits ``(key, out)``; returning state None drops it."""
        return self._keyed(StatefulMap(fn, self.key_fn, _on_error(on_error)), "stateful_map", name, parallelism)

    def apply_keyed(self, op: Operator, name: str | None = None, parallelism: int | None = None) -> Stream:
        """A user-defined keyed operator; it must key its state by the same key. A
        ``KeyedProcess`` (operators/keyed_process.py) gets this stream's key function and
        runtime-owned per-key state (snapshotted, rescaled by key group, incremental)."""
        from operators.keyed_process import KeyedProcess

        if isinstance(op, KeyedProcess) and op.key_fn is None:
            op.key_fn = self.key_fn
        return self._keyed(op, "keyed", name, parallelism)


class Feedback(Stream):
    """The head of a loop: records sent to ``connect(stream)`` come back here."""

    def connect(self, stream: Stream) -> None:
        node = self.flow.graph.nodes[self.node]
        if node.connected:
            raise GraphError(GraphErrorReason.BAD_ARGUMENT, f"feedback {self.node!r} is already connected", self.node)
        node.connected = True
        self.flow.graph.edges.append(Edge(stream.node, self.node, stream._partition))
