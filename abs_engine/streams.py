"""Streams: ``Stream``, the records one operator produces, whose methods add the next
operator (``map``, ``flat_map``, ``filter``, ``key_by``, ``union``, ``interval_join``,
``sink``...), and ``Feedback``, the head of a loop. The type variables of the user API
and the checks its modules share live here too.

The API's modules import each other in one order: ``api`` (Dataflow) -> ``keyed``
(KeyedStream) -> ``windowed`` (WindowedStream, WindowResults) -> ``streams``. A stream
holds its Dataflow, and ``Stream.key_by`` makes a KeyedStream: annotations only here
(under TYPE_CHECKING), and the KeyedStream class is handed over by keyed.py
(``Stream._keyed_stream``).
"""

from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Generic, Iterable, Sequence, TypeVar, overload

from operators.arrow import AGGREGATIONS, FilterBatches, MapBatches, MergeAggregates, PreAggregateBatches, Rows, ToBatches
from operators.base import Operator, Sink
from operators.basic import Filter, FlatMap, Identity, Map
from operators.joins import IntervalJoin

from .errors import GraphError, GraphErrorReason
from .outputs import conflicting
from .graph import Edge, Node, NodeKind, Partition

if TYPE_CHECKING:
    from .api import Dataflow
    from .keyed import KeyedStream

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


def _tag_left(record: Any) -> tuple[int, Any]:
    return (0, record)


def _tag_right(record: Any) -> tuple[int, Any]:
    return (1, record)


class Stream(Generic[T]):
    """A stream of records of type ``T`` produced by one operator. Its methods add the next
    operator and return the stream it produces; ``name`` names that operator (unique in the
    dataflow, the key of its state in checkpoints; None: one is made from the method's
    name, ``map``, ``map_2``...) and ``parallelism`` sets its subtasks (None: the dataflow's).

    Made by ``Dataflow.source`` and the methods here, not by hand: ``flow`` is the Dataflow,
    ``node`` the name of the operator whose output it is, ``partition`` how its records
    reach the next operator (None: forward at equal parallelism, else round robin)."""

    #: The class ``key_by`` makes. A KeyedStream is a Stream, so this module cannot import
    #: keyed.py (the two would import each other); keyed.py sets it where it defines the
    #: class, and the package imports keyed.py (through api.py) before any stream exists.
    _keyed_stream: ClassVar[type[KeyedStream[Any, Any]]]

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
        """``fn(record)`` for every record. ``on_error="skip"`` drops (and reports) records
        on which ``fn`` raises; the default, "fail", fails the task, naming the record.
        ``name`` and ``parallelism``: see the class docstring."""
        return Stream(self.flow, self._then(Map(fn, _on_error(on_error)), "map", f"map({_fn_label(fn)})", name,
                                            parallelism))

    def flat_map(
        self, fn: Callable[[T], Iterable[U]], name: str | None = None, parallelism: int | None = None,
        on_error: str = "fail",
    ) -> "Stream[U]":
        """Every record ``fn(record)`` yields; ``name``, ``parallelism`` and ``on_error`` as
        in ``map``."""
        return Stream(self.flow, self._then(FlatMap(fn, _on_error(on_error)), "flat_map", f"flat_map({_fn_label(fn)})",
                                            name, parallelism))

    def filter(self, fn: Callable[[T], bool], name: str | None = None, parallelism: int | None = None,
               on_error: str = "fail") -> "Stream[T]":
        """The records for which ``fn(record)`` is true; ``name``, ``parallelism`` and
        ``on_error`` as in ``map``."""
        return Stream(self.flow, self._then(Filter(fn, _on_error(on_error)), "filter", f"filter({_fn_label(fn)})",
                                            name, parallelism))

    # ---- columnar streams: records are pyarrow.RecordBatch (operators/arrow.py) ----------

    def map_batches(self, fn: Callable[[Any], Any], name: str | None = None, parallelism: int | None = None,
                    on_error: str = "fail") -> "Stream[Any]":
        """``fn(batch)`` for every ``pyarrow.RecordBatch``: a RecordBatch, a Table (its
        batches) or None (nothing); vectorize it with ``pyarrow.compute``. ``on_error="skip"``
        drops (and reports) a batch ``fn`` raises on; ``name`` and ``parallelism`` as in ``map``."""
        return Stream(self.flow, self._then(MapBatches(fn, _on_error(on_error)), "map_batches",
                                            f"map_batches({_fn_label(fn)})", name, parallelism))

    def filter_batches(self, fn: Callable[[Any], Any], name: str | None = None, parallelism: int | None = None,
                       on_error: str = "fail") -> "Stream[Any]":
        """The rows of each RecordBatch where the mask ``fn(batch)`` (a boolean array or
        expression pyarrow's ``RecordBatch.filter`` takes) is true; ``name``, ``parallelism``
        and ``on_error`` as in ``map_batches``."""
        return Stream(self.flow, self._then(FilterBatches(fn, _on_error(on_error)), "filter_batches",
                                            f"filter_batches({_fn_label(fn)})", name, parallelism))

    def rows(self, name: str | None = None, parallelism: int | None = None) -> "Stream[Any]":
        """Each RecordBatch's rows as tuples (one column: its values), for row operators;
        ``name`` and ``parallelism`` as in ``map``."""
        return Stream(self.flow, self._then(Rows(), "rows", "rows", name, parallelism))

    def to_batches(self, columns: Sequence[str], schema: Any = None, name: str | None = None,
                   parallelism: int | None = None, on_error: str = "fail") -> "Stream[Any]":
        """Tuples of ``len(columns)`` values as RecordBatches (one per engine batch), types
        inferred by pyarrow or given by ``schema`` (a ``pyarrow.Schema``); ``on_error="skip"``
        drops a record that does not fit, reporting it; ``name`` and ``parallelism`` as in
        ``map``. GraphError if ``columns`` is empty."""
        if not columns:
            raise GraphError(GraphErrorReason.BAD_ARGUMENT, "to_batches() needs at least one column name")
        return Stream(self.flow, self._then(ToBatches(columns, schema, _on_error(on_error)), "to_batches",
                                            f"to_batches({', '.join(columns)})", name, parallelism))

    def aggregate_batches(self, by: str | Sequence[str], aggregations: Sequence[tuple[str, str]] | None = None,
                          final: bool = True, name: str | None = None,
                          parallelism: int | None = None) -> "Stream[tuple[Any, Any]]":
        """A keyed aggregation of RecordBatches, vectorized: group by the column(s) ``by``
        and compute ``aggregations``, pairs ``(column, function)`` with function one of
        count, sum, min, max (``("*", "count")`` counts rows: the default). Each batch is
        pre-aggregated with pyarrow before the shuffle (``<name>_pre``), so one partial per
        distinct key and batch crosses it, not a record per row. Emits ``(key, value)``
        (key: the column's value, or a tuple for several columns; value: the aggregate,
        or a tuple of them in order): once per key at the end with ``final`` (bounded
        input), else the key's running value after each batch that had it. Nulls are
        skipped as in SQL; null keys form a group. ``name`` and ``parallelism`` are the keyed
        operator's (as in ``map``); GraphError names a bad ``by`` or aggregation."""
        cols = [by] if isinstance(by, str) else list(by)
        given: list[tuple[Any, ...]] = [("*", "count")] if aggregations is None else [tuple(a) for a in aggregations]
        if not cols or not all(isinstance(c, str) for c in cols):
            raise GraphError(GraphErrorReason.BAD_ARGUMENT, f"aggregate_batches(by={by!r}): name the key column(s)")
        for a in given:
            if len(a) != 2 or not isinstance(a[0], str) or a[1] not in AGGREGATIONS or (a[0] == "*" and a[1] != "count"):
                raise GraphError(GraphErrorReason.BAD_ARGUMENT,
                                 f"aggregate_batches(): {a!r} is not a (column, function) pair with function one of "
                                 f"{', '.join(AGGREGATIONS)} (and column '*' only with count)")
        aggs = [(str(c), str(f)) for c, f in given]
        shown = ", ".join(f"{f}({c})" for c, f in aggs)
        upstream = self.flow.graph.nodes[self.node]
        pre = Stream(self.flow, self.node, Partition.FORWARD)._then(
            PreAggregateBatches(cols, aggs), "pre_aggregate_batches",
            f"pre_aggregate_batches(by={', '.join(cols)}, {shown})",
            None if name is None else f"{name}_pre", upstream.parallelism)
        partials: KeyedStream[Any, Any] = self._keyed_stream(self.flow, pre, itemgetter(0), "fail",
                                                             ", ".join(cols))
        return partials._keyed(MergeAggregates([f for _, f in aggs], final), "aggregate_batches", name,
                               parallelism, key_label=f"{', '.join(cols)}; {shown}{'' if final else '; running'}")

    def apply(self, op: Operator, name: str | None = None, parallelism: int | None = None) -> "Stream[Any]":
        """Add ``op``, any user-defined Operator subclass (operators/base.py: batches in,
        records out); ``name`` and ``parallelism`` as in ``map``."""
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
        raises on fails the task naming ``key_by`` and the record (``on_error="fail"``), or is
        dropped and reported ("skip"), wherever the key is computed (before the shuffle, or
        in the keyed operator); before the shuffle, so is a record whose key is unhashable."""
        return self._keyed_stream(self.flow, self.node, key, _on_error(on_error))

    def rebalance(self) -> "Stream[T]":
        """Send this stream's batches round robin to the next operator's subtasks."""
        return Stream(self.flow, self.node, Partition.REBALANCE)

    def forward(self) -> "Stream[T]":
        """Send subtask i's records to the next operator's subtask i (equal parallelism)."""
        return Stream(self.flow, self.node, Partition.FORWARD)

    def union(self, *others: "Stream[T]", name: str | None = None,
              parallelism: int | None = None) -> "Stream[T]":
        """The records of this stream and ``others``, interleaved (FIFO per channel);
        ``name`` and ``parallelism`` as in ``map``. GraphError if one is of another Dataflow."""
        for o in others:
            if o.flow is not self.flow:
                raise GraphError(GraphErrorReason.FOREIGN_STREAM, "union() of streams from different Dataflows")
        # (Stream's _then even after key_by: the union's input edges are partitioned alike,
        # and one stream's key function cannot read another's records)
        n = Stream._then(self, Identity(), "union", "union", name, parallelism)
        for o in others:
            self.flow.graph.edges.append(Edge(o.node, n, o._partition))
        return Stream(self.flow, n)

    def interval_join(self, other: "Stream[U]", key: Callable[[T], Any], other_key: Callable[[U], Any],
                      timestamp: Callable[[T], Any], other_timestamp: Callable[[U], Any], lower: Any, upper: Any,
                      fn: Callable[[T, U], Any], name: str | None = None,
                      parallelism: int | None = None, on_error: str = "fail") -> "Stream[Any]":
        """Join this stream with ``other`` (of the same Dataflow) on event time
        (operators/joins.py): every pair of one key with ``ts + lower <= other_ts <= ts +
        upper``, as ``fn(record, other_record)``. ``key``/``other_key`` give each side's key,
        ``timestamp``/``other_timestamp`` its event time; ``lower`` and ``upper`` are in
        timestamp units, ``lower <= upper`` (GraphError otherwise). Its state is bounded by
        the watermark: records at or behind it are late, reported, not joined. ``on_error``
        applies to all its functions: a record one raises on fails the task naming it
        ("fail"), or is dropped and reported ("skip"). ``name`` and ``parallelism`` are the
        join's (as in ``map``)."""
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
        keyed = self._keyed_stream(self.flow, tagged.node, op._key, on_error, key_label)
        return keyed._keyed(op, "interval_join", base, parallelism)

    def sink(self, sink: Sink, name: str | None = None, parallelism: int | None = None) -> None:
        """End the stream in ``sink`` (FileSink, CapturingSink, ParquetSink...). Sinks that
        publish on checkpoint completion (two-phase commit) give exactly-once output.
        ``name`` and ``parallelism`` as in ``map``. GraphError if another sink of the
        dataflow writes the same output."""
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


class Feedback(Stream[T]):
    """The head of a loop: records sent to ``connect(stream)`` come back here, on a
    back-edge (records in flight on it at a checkpoint are logged into the snapshot).
    Made by ``Dataflow.feedback``: ``flow``, ``node`` and ``partition`` as for a Stream."""

    def connect(self, stream: Stream[T]) -> None:
        """Close the loop: ``stream``'s records flow back to this feedback (once only)."""
        node = self.flow.graph.nodes[self.node]
        if node.connected:
            raise GraphError(GraphErrorReason.BAD_ARGUMENT, f"feedback {self.node!r} is already connected", self.node)
        node.connected = True
        self.flow.graph.edges.append(Edge(stream.node, self.node, stream._partition))
