"""The user-facing graph API: a Dataflow, and Streams with map/flat_map/filter/key_by/...

A word count::

    flow = Dataflow("wordcount", parallelism=2)
    words = flow.source(TextFileSource("in.txt")).flat_map(str.split)
    words.key_by().count_final().sink(FileSink("out.tsv"), parallelism=1)
    flow.run(checkpoint_interval=1.0, checkpoint_dir="ckpt")
"""

from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable, TypeVar, overload

from operators.aggregate import Aggregate, AggregateFinal, FoldFinal, MergeFinal, PreAggregate, StatefulMap
from operators.base import KeyFunction, Operator, Sink, Source
from operators.basic import Filter, FlatMap, Identity, Map
from operators.eventtime import BoundedOutOfOrderness, EventTimeSource
from operators.joins import IntervalJoin
from operators.timers import KeyedTimedProcess
from operators.windows import (AGGREGATE, PROCESS, REDUCE, SessionWindows, SlidingWindows, TumblingWindows,
                               WindowOperator, Windows)
from operators.keyed import Count, CountFinal, Reduce, ReduceFinal

from .errors import GraphError, GraphErrorReason
from .names import check_name
from .outputs import conflicting
from .keygroups import UPPER_BOUND
from .graph import Edge, LogicalGraph, Node, NodeKind, Partition

if TYPE_CHECKING:
    from .executors.config import JobResult
    from .plan import Plan

# The types a stream's records have *in the dataflow's code*. What crosses a process is
# encoded with msgpack (docs/dataflows.md, "Records between processes"): a list arrives as a tuple, a set or a custom class
# is refused. The types are a promise to mypy only; nothing checks them at run time.
T = TypeVar("T")  #: a stream's records
U = TypeVar("U")  #: the records of the stream a function makes
K = TypeVar("K")  #: a keyed stream's keys
A = TypeVar("A")  #: an accumulator
R = TypeVar("R")  #: what an accumulator's ``result`` makes
S = TypeVar("S")  #: the per-key state of ``stateful_map``


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
        default if None). Each subtask reads its own share and snapshots its offset.

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
        Annotate it for typed loops: ``loop: Feedback[int] = flow.feedback()``."""
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


class Stream(Generic[T]):
    """A stream of records of type ``T`` produced by one operator. Its methods add the next
    operator and return the stream it produces; ``name`` names that operator (unique in the
    dataflow, the key of its state in checkpoints) and ``parallelism`` sets its subtasks."""

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

    def map(self, fn: Callable[[T], U], name: str | None = None, parallelism: int | None = None,
            on_error: str = "fail") -> "Stream[U]":
        """``fn(record)`` for every record. on_error="skip" drops (and reports) records on
        which ``fn`` raises; the default fails the task, naming the record."""
        return Stream(self.flow, self._then(Map(fn, _on_error(on_error)), "map", f"map({_fn_label(fn)})", name,
                                            parallelism))

    def flat_map(
        self, fn: Callable[[T], Iterable[U]], name: str | None = None, parallelism: int | None = None,
        on_error: str = "fail",
    ) -> "Stream[U]":
        """Every record ``fn(record)`` yields; on_error as in map()."""
        return Stream(self.flow, self._then(FlatMap(fn, _on_error(on_error)), "flat_map", f"flat_map({_fn_label(fn)})",
                                            name, parallelism))

    def filter(self, fn: Callable[[T], bool], name: str | None = None, parallelism: int | None = None,
               on_error: str = "fail") -> "Stream[T]":
        """The records for which ``fn(record)`` is true; on_error as in map()."""
        return Stream(self.flow, self._then(Filter(fn, _on_error(on_error)), "filter", f"filter({_fn_label(fn)})",
                                            name, parallelism))

    def apply(self, op: Operator, name: str | None = None, parallelism: int | None = None) -> "Stream[Any]":
        """Any user-defined Operator subclass (operators/base.py: batches in, records out)."""
        return Stream(self.flow, self._then(op, "apply", type(op).__name__, name, parallelism))

    @overload
    def key_by(self, key: None = None, on_error: str = "fail") -> "KeyedStream[T, T]": ...

    @overload
    def key_by(self, key: Callable[[T], K], on_error: str = "fail") -> "KeyedStream[T, K]": ...

    def key_by(self, key: Callable[[T], Any] | None = None, on_error: str = "fail") -> "KeyedStream[T, Any]":
        """Partition by ``key(record)`` (the record itself when key is None): the next
        operator is keyed, and every record of one key goes to the same subtask. A key must
        be msgpack-encodable and hash the same in every process (str, int, bytes, tuples of
        them...); its key group (``max_parallelism``) decides its subtask. A record ``key``
        raises on fails the task naming ``key_by`` and the record (on_error="fail"), or is
        dropped and reported ("skip"), wherever the key is computed (before the shuffle, or
        in the keyed operator); before the shuffle, so is a record whose key is unhashable."""
        return KeyedStream(self.flow, self.node, key, _on_error(on_error))

    def rebalance(self) -> "Stream[T]":
        """Send this stream's batches round robin to the next operator's subtasks."""
        return Stream(self.flow, self.node, Partition.REBALANCE)

    def forward(self) -> "Stream[T]":
        """Send subtask i's records to the next operator's subtask i (equal parallelism)."""
        return Stream(self.flow, self.node, Partition.FORWARD)

    def union(self, *others: "Stream[T]", name: str | None = None,
              parallelism: int | None = None) -> "Stream[T]":
        """The records of this stream and ``others``, interleaved (FIFO per channel)."""
        for o in others:
            if o.flow is not self.flow:
                raise GraphError(GraphErrorReason.FOREIGN_STREAM, "union() of streams from different Dataflows")
        n = self._then(Identity(), "union", "union", name, parallelism)
        for o in others:
            self.flow.graph.edges.append(Edge(o.node, n, o._partition))
        return Stream(self.flow, n)

    def interval_join(self, other: "Stream[U]", key: Callable[[T], Any], other_key: Callable[[U], Any],
                      timestamp: Callable[[T], Any], other_timestamp: Callable[[U], Any], lower: Any, upper: Any,
                      fn: Callable[[T, U], Any], name: str | None = None,
                      parallelism: int | None = None, on_error: str = "fail") -> "Stream[Any]":
        """Every pair of one key with ``ts + lower <= other_ts <= ts + upper``, as ``fn(record,
        other_record)`` (operators/joins.py): an event-time join whose state is bounded by
        the watermark. Records at or behind the watermark are late: reported, not joined.
        ``on_error`` applies to all its functions (keys, timestamps, ``fn``): a record one
        raises on fails the task naming it ("fail"), or is dropped and reported ("skip")."""
        if other.flow is not self.flow:
            raise GraphError(GraphErrorReason.FOREIGN_STREAM, "interval_join() of streams from different Dataflows")
        for what, f in (("key", key), ("other_key", other_key), ("timestamp", timestamp),
                        ("other_timestamp", other_timestamp), ("fn", fn)):
            if not callable(f):
                raise GraphError(GraphErrorReason.BAD_ARGUMENT, f"interval_join(): {what} must be a function")
        if not lower <= upper:
            raise GraphError(GraphErrorReason.BAD_ARGUMENT,
                             f"interval_join(): lower ({lower!r}) must be at most upper ({upper!r})")
        _on_error(on_error)
        base = name or self.flow._name(None, "interval_join")
        left = self.map(_tag_left, name=f"{base}_left")
        right = other.map(_tag_right, name=f"{base}_right")
        op = IntervalJoin(lower, upper, fn, (key, other_key), (timestamp, other_timestamp), on_error)
        tagged = left.union(right, name=f"{base}_inputs")
        key_label = f"{_fn_label(key)}, {_fn_label(other_key)}"
        keyed: KeyedStream[Any, Any] = KeyedStream(self.flow, tagged.node, op._key, on_error, key_label)
        return keyed._keyed(op, "interval_join", base, parallelism)

    def sink(self, sink: Sink, name: str | None = None, parallelism: int | None = None) -> None:
        """End the stream in ``sink`` (FileSink, CapturingSink, ParquetSink...). Sinks that
        publish on checkpoint completion (two-phase commit) give exactly-once output."""
        if not isinstance(sink, Sink):
            raise GraphError(
                GraphErrorReason.BAD_ARGUMENT, f"Stream.sink() takes an operators.Sink, got {type(sink).__name__}"
            )
        existing = {n.name: n.template.outputs() for n in self.flow.graph.nodes.values()
                    if n.kind is NodeKind.SINK and isinstance(n.template, Sink)}
        clash = conflicting(sink.outputs(), existing)
        if clash is not None:
            other, theirs, ours = clash
            shown = f"{ours!r}" if theirs == ours else f"{ours!r} (their output {theirs!r})"
            this = f"the new {type(sink).__name__}" if name is None else f"sink {name!r}"
            raise GraphError(GraphErrorReason.SHARED_OUTPUT,
                             f"{this} would write {shown}, which sink {other!r} "
                             "already writes: two sinks on one output would truncate or roll back each other's "
                             "records; give each sink its own file or directory (or union the streams into one "
                             "sink)", other)
        self._then(sink, "sink", type(sink).__name__, name, parallelism, kind=NodeKind.SINK)


class KeyedStream(Stream[T], Generic[T, K]):
    """A stream of ``T`` whose next operator is keyed by ``K``: its input is partitioned by
    the key's key group. The keyed operators' state lives per key; it is checkpointed,
    split by key group when the job is rescaled, and written incrementally when
    ``incremental_checkpoints`` is on. Their outputs are ``(key, value)`` pairs."""

    def __init__(self, flow: Dataflow, node: str, key_fn: Callable[[T], K] | None, key_on_error: str = "fail",
                 key_name: str | None = None):
        super().__init__(flow, node, Partition.HASH)
        self.key_fn = key_fn
        self.key_on_error = key_on_error  #: key_by's on_error: for the key function, on the edge and in the operator
        self._key_name = key_name  #: how a key failure names the key function (None: its name)

    def _key_label(self) -> str:
        return self._key_name or (_fn_label(self.key_fn) if self.key_fn else "record")

    def _keyed(self, op: Operator, base: str, name: str | None, parallelism: int | None,
               key_label: str | None = None) -> Stream[Any]:
        label = f"{base}(key={key_label or self._key_label()})"
        # The edge's key function carries key_by's on_error (and a name) to the shuffle
        # (runtime/output.py); the operator, which computes keys too, gets the on_error.
        edge_key: Any = self.key_fn
        if self.key_on_error != "fail" or self._key_name is not None:
            edge_key = KeyFunction(self.key_fn, self.key_on_error, self._key_name)
            op.key_on_error = self.key_on_error
        return Stream(self.flow, self._then(op, base, label, name, parallelism, key_fn=edge_key, keyed=True))

    def count(self, name: str | None = None, parallelism: int | None = None) -> Stream[tuple[K, int]]:
        """Running count per key: ``(key, count so far)`` for every record."""
        return self._keyed(Count(self.key_fn), "count", name, parallelism)

    def count_final(self, name: str | None = None, parallelism: int | None = None) -> Stream[tuple[K, int]]:
        """Count per key for bounded input: ``(key, count)`` once per key at the end."""
        return self._keyed(CountFinal(self.key_fn), "count_final", name, parallelism)

    def reduce(self, fn: Callable[[T, T], T], name: str | None = None, parallelism: int | None = None,
               on_error: str = "fail") -> Stream[tuple[K, T]]:
        """Running reduce per key: a key's first record is its accumulator, then ``acc =
        fn(acc, record)``; emits ``(key, acc)`` for every record. ``fn`` combines two values
        of the record's type; for an accumulator of another type use ``aggregate``. If
        ``fn`` raises, the key's state is unchanged; on_error="fail" fails the task naming
        the record, "skip" drops and reports it."""
        return self._keyed(Reduce(fn, self.key_fn, _on_error(on_error)), "reduce", name, parallelism)

    def reduce_final(
        self, fn: Callable[[T, T], T], name: str | None = None, parallelism: int | None = None,
        on_error: str = "fail",
    ) -> Stream[tuple[K, T]]:
        """``reduce`` for bounded input: ``(key, acc)`` once per key at the end."""
        return self._keyed(ReduceFinal(fn, self.key_fn, _on_error(on_error)), "reduce_final", name, parallelism)

    @overload
    def aggregate(self, create: Callable[[], A], add: Callable[[A, T], A], result: None = None,
                  name: str | None = None, parallelism: int | None = None,
                  on_error: str = "fail") -> Stream[tuple[K, A]]: ...

    @overload
    def aggregate(self, create: Callable[[], A], add: Callable[[A, T], A], result: Callable[[A], R],
                  name: str | None = None, parallelism: int | None = None,
                  on_error: str = "fail") -> Stream[tuple[K, R]]: ...

    def aggregate(self, create: Callable[[], A], add: Callable[[A, T], A],
                  result: Callable[[A], Any] | None = None, name: str | None = None,
                  parallelism: int | None = None, on_error: str = "fail") -> Stream[tuple[K, Any]]:
        """Running aggregate per key (Flink's AggregateFunction): ``acc = add(acc, record)``
        from ``create()``; emits ``(key, result(acc))`` (or ``(key, acc)``) for every record.
        E.g. a running mean: ``aggregate(lambda: (0, 0), lambda a, r: (a[0] + 1, a[1] + r[1]),
        lambda a: a[1] / a[0])``. If a function raises, the key's accumulator is unchanged
        and ``on_error`` applies (as in ``reduce``). Accumulators must be msgpack-encodable
        (docs/dataflows.md, "Records between processes"). A running aggregate emits for every record, so it takes no
        ``merge``: pre-aggregation would change its output (``aggregate_final`` takes one)."""
        return self._keyed(Aggregate(create, add, result, self.key_fn, _on_error(on_error)), "aggregate", name,
                           parallelism)

    @overload
    def aggregate_final(self, create: Callable[[], A], add: Callable[[A, T], A], result: None = None,
                        merge: Callable[[A, A], A] | None = None, name: str | None = None,
                        parallelism: int | None = None, on_error: str = "fail") -> Stream[tuple[K, A]]: ...

    @overload
    def aggregate_final(self, create: Callable[[], A], add: Callable[[A, T], A], result: Callable[[A], R],
                        merge: Callable[[A, A], A] | None = None, name: str | None = None,
                        parallelism: int | None = None, on_error: str = "fail") -> Stream[tuple[K, R]]: ...

    def aggregate_final(self, create: Callable[[], A], add: Callable[[A, T], A],
                        result: Callable[[A], Any] | None = None, merge: Callable[[A, A], A] | None = None,
                        name: str | None = None, parallelism: int | None = None,
                        on_error: str = "fail") -> Stream[tuple[K, Any]]:
        """``aggregate`` for bounded input: ``(key, result(acc))`` once per key at the end.

        With ``merge(acc1, acc2)`` the records are pre-aggregated before the shuffle: the
        upstream task folds each batch into one partial accumulator per key and only the
        partials cross to the keyed task, which merges them. Fewer, smaller records travel
        (a count over few keys sends one pair per key per batch). ``merge`` must make the
        same accumulator as adding both parts' records to one (associative, as Flink's
        AggregateFunction.merge); it sees partials as they arrive from another process (a
        list as a tuple). The pre-aggregation step is named ``<name>_pre`` and keeps no state."""
        if merge is None:
            return self._keyed(AggregateFinal(create, add, result, self.key_fn, _on_error(on_error)),
                               "aggregate_final", name, parallelism)
        upstream = self.flow.graph.nodes[self.node]
        pre_op = PreAggregate(create, add, self.key_fn, _on_error(on_error))
        pre_op.key_on_error = self.key_on_error  # the key is computed here, before the shuffle
        pre = Stream(self.flow, self.node, Partition.FORWARD)._then(
            pre_op, "pre_aggregate",
            f"pre_aggregate(key={self._key_label()})",
            None if name is None else f"{name}_pre", upstream.parallelism)
        partials: KeyedStream[tuple[Any, A], Any] = KeyedStream(self.flow, pre, itemgetter(0))
        return partials._keyed(MergeFinal(merge, result, _on_error(on_error)), "aggregate_final", name,
                               parallelism, key_label=f"{self._key_label()}, merge={_fn_label(merge)}")

    def fold_final(self, create: Callable[[], A], fold: Callable[[A, T], A], name: str | None = None,
                   parallelism: int | None = None, on_error: str = "fail") -> Stream[tuple[K, A]]:
        """Fold per key for bounded input (Bytewax's ``fold_final``): ``acc = fold(acc,
        record)`` from ``create()``; ``(key, acc)`` once per key at the end."""
        return self._keyed(FoldFinal(create, fold, self.key_fn, _on_error(on_error)), "fold_final", name,
                           parallelism)

    def stateful_map(self, fn: Callable[[S | None, T], tuple[S | None, U]], name: str | None = None,
                     parallelism: int | None = None, on_error: str = "fail") -> Stream[tuple[K, U]]:
        """Per key (Bytewax's ``stateful_map``): ``state, out = fn(state, record)``, ``state``
        None for a key's first record; emits ``(key, out)``; returning state None drops it.
        The state must be msgpack-encodable (after a restore a tuple comes back as a list)."""
        return self._keyed(StatefulMap(fn, self.key_fn, _on_error(on_error)), "stateful_map", name, parallelism)

    def apply_keyed(self, op: Operator, name: str | None = None, parallelism: int | None = None,
                    timestamp: Callable[[T], Any] | None = None, on_error: str | None = None) -> Stream[Any]:
        """A user-defined keyed operator; it must key its state by the same key. A
        ``KeyedProcess`` (operators/keyed_process.py) gets this stream's key function and
        runtime-owned per-key state (snapshotted, rescaled by key group, incremental). A
        ``KeyedTimedProcess`` (operators/timers.py) also gets timers, and ``timestamp`` (a
        function of the record) for ``ctx.timestamp``. ``on_error`` ("fail" or "skip"; None:
        the operator's own, "fail" unless it sets one) applies to ``timestamp``,
        ``process_key`` and ``on_timer``: skipped, a record's outputs are dropped and the
        key's value is put back as it was (operators/keyed_process.py says what cannot be)."""
        from operators.keyed_process import KeyedProcess

        if on_error is not None:
            op.on_error = _on_error(on_error)

        if isinstance(op, (KeyedProcess, KeyedTimedProcess)) and op.key_fn is None:
            op.key_fn = self.key_fn
        if timestamp is not None:
            if not isinstance(op, KeyedTimedProcess):
                raise GraphError(GraphErrorReason.BAD_ARGUMENT,
                                 "apply_keyed(timestamp=...) is for a KeyedTimedProcess (operators/timers.py)")
            op.timestamp_fn = timestamp
        return self._keyed(op, "keyed", name, parallelism)

    def window(self, windows: Windows, timestamp: Callable[[T], Any],
               allowed_lateness: Any = 0) -> "WindowedStream[T, K]":
        """Event-time windows per key (operators/windows.py): ``windows`` is a
        TumblingWindows, SlidingWindows or SessionWindows; ``timestamp(record)`` the
        record's event time; a window is kept ``allowed_lateness`` after it fires (records
        then fire it again), after which its records go to ``.late``. Then ``reduce``,
        ``aggregate`` or ``process``."""
        if not isinstance(windows, (TumblingWindows, SlidingWindows, SessionWindows)):
            raise GraphError(GraphErrorReason.BAD_ARGUMENT,
                             f"window() takes TumblingWindows, SlidingWindows or SessionWindows, got "
                             f"{type(windows).__name__}")
        if not callable(timestamp):
            raise GraphError(GraphErrorReason.BAD_ARGUMENT, "window(): timestamp must be a function of the record")
        if not isinstance(allowed_lateness, int) or isinstance(allowed_lateness, bool) or allowed_lateness < 0:
            raise GraphError(GraphErrorReason.BAD_ARGUMENT,
                             f"window(): allowed_lateness must be an int >= 0 in timestamp units (milliseconds by "
                             f"convention), got {allowed_lateness!r}")
        return WindowedStream(self, windows, timestamp, allowed_lateness)


def _tag_left(record: Any) -> tuple[int, Any]:
    return (0, record)


def _tag_right(record: Any) -> tuple[int, Any]:
    return (1, record)


class WindowedStream(Generic[T, K]):
    """A keyed stream cut into event-time windows: finish it with ``reduce``, ``aggregate``
    or ``process``; each returns a ``WindowResults`` stream (with its ``.late`` records).
    Their ``on_error`` applies to every function of the window (the timestamp function
    too): a record one raises on fails the task naming it ("fail"), or is dropped and
    reported with its key's windows unchanged ("skip"); a window whose ``result`` or
    ``process`` raises when it fires is named as ``(key, start, end)`` (skipped: no output
    for it)."""

    def __init__(self, keyed: KeyedStream[T, K], windows: Windows, timestamp: Callable[[T], Any],
                 allowed_lateness: Any):
        self.keyed, self.windows, self.timestamp, self.allowed_lateness = keyed, windows, timestamp, allowed_lateness

    def _op(self, kind: str, fn: Callable[..., Any], name: str | None, parallelism: int | None, on_error: str,
            **kw: Any) -> "WindowResults[Any]":
        op = WindowOperator(self.windows, self.timestamp, kind, fn, self.keyed.key_fn, self.allowed_lateness, **kw,
                            on_error=_on_error(on_error))
        w = self.windows
        label = type(w).__name__.replace("Windows", "").lower()
        s = self.keyed._keyed(op, f"window_{kind}", name, parallelism, key_label=f"{self.keyed._key_label()}, {label}")
        return WindowResults(s.flow, s.node, op)

    def reduce(self, fn: Callable[[T, T], T], name: str | None = None,
               parallelism: int | None = None, on_error: str = "fail") -> "WindowResults[tuple[K, Any, Any, T]]":
        """Per key and window, ``fn(acc, record)`` from the window's first record: ``(key,
        start, end, acc)`` when the window fires."""
        return self._op(REDUCE, fn, name, parallelism, on_error)

    def aggregate(self, create: Callable[[], A], add: Callable[[A, T], A], result: Callable[[A], Any] | None = None,
                  merge: Callable[[A, A], A] | None = None, name: str | None = None,
                  parallelism: int | None = None, on_error: str = "fail") -> "WindowResults[tuple[K, Any, Any, Any]]":
        """Per key and window, ``acc = add(acc, record)`` from ``create()``: ``(key, start,
        end, result(acc))`` (or ``acc``) when it fires. Session windows merge accumulators:
        they need ``merge(acc1, acc2)``."""
        if isinstance(self.windows, SessionWindows) and merge is None:
            raise GraphError(GraphErrorReason.BAD_ARGUMENT,
                             "aggregate() over SessionWindows needs merge=(acc1, acc2) -> acc: sessions merge")
        return self._op(AGGREGATE, add, name, parallelism, on_error, create=create, result=result, merge=merge)

    def process(self, fn: Callable[[K, Any, Any, list[T]], Iterable[U] | None], name: str | None = None,
                parallelism: int | None = None, on_error: str = "fail") -> "WindowResults[U]":
        """Per key and window, ``fn(key, start, end, records)`` when it fires: the records it
        returns (the window keeps its records until then)."""
        return self._op(PROCESS, fn, name, parallelism, on_error)


class WindowResults(Stream[T]):
    """A window operator's results; ``late`` is the stream of its late records."""

    def __init__(self, flow: Dataflow, node: str, op: WindowOperator):
        super().__init__(flow, node)
        self._op = op
        self._late: Stream[Any] | None = None

    @property
    def late(self) -> Stream[Any]:
        """The records that came after every window they belong to was purged (a side
        output). Without it they are dropped and reported as skipped records."""
        if self._late is None:
            self._op.late_stream = True
            n = self.flow._name(None, f"{self.node}_late")
            self.flow._add(Node(n, NodeKind.OPERATOR, Identity(), "late", self.flow.graph.nodes[self.node].parallelism))
            self.flow.graph.edges.append(Edge(self.node, n, Partition.FORWARD, side=True))
            self._late = Stream(self.flow, n)
        return self._late


class Feedback(Stream[T]):
    """The head of a loop: records sent to ``connect(stream)`` come back here, on a
    back-edge (records in flight on it at a checkpoint are logged into the snapshot)."""

    def connect(self, stream: Stream[T]) -> None:
        """Close the loop: ``stream``'s records flow back to this feedback (once only)."""
        node = self.flow.graph.nodes[self.node]
        if node.connected:
            raise GraphError(GraphErrorReason.BAD_ARGUMENT, f"feedback {self.node!r} is already connected", self.node)
        node.connected = True
        self.flow.graph.edges.append(Edge(stream.node, self.node, stream._partition))
