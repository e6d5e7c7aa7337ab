"""KeyedStream: a stream whose next operator is keyed, and the keyed operators
(``count``, ``reduce``, ``aggregate``, ``aggregate_final``, ``fold_final``,
``stateful_map``, ``apply_keyed``) and event-time ``window`` it offers. Each adds an
operator on a hash-partitioned edge, whose state lives per key (operators/keyed.py,
operators/aggregate.py).
"""

from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable, Generic, overload

from operators.aggregate import Aggregate, AggregateFinal, FoldFinal, MergeFinal, PreAggregate, StatefulMap
from operators.base import KeyFunction, Operator
from operators.timers import KeyedTimedProcess
from operators.windows import SessionWindows, SlidingWindows, TumblingWindows, Windows
from operators.combiners import PreCount, SumCounts
from operators.keyed import Count, Reduce, ReduceFinal

from .errors import GraphError, GraphErrorReason
from .graph import NodeKind, Partition
from .streams import A, K, R, S, T, U, Stream, _fn_label, _on_error
from .windowed import WindowedStream

if TYPE_CHECKING:
    from .api import Dataflow


class KeyedStream(Stream[T], Generic[T, K]):
    """A stream of ``T`` whose next operator is keyed by ``K``: its input is partitioned by
    the key's key group. The keyed operators' state lives per key; it is checkpointed,
    split by key group when the job is rescaled, and written incrementally when
    ``incremental_checkpoints`` is on. Their outputs are ``(key, value)`` pairs. Every
    method takes ``name`` and ``parallelism`` as ``Stream.map`` does, and those with user
    functions ``on_error`` ("fail" or "skip") for them.

    Made by ``Stream.key_by``: ``flow`` and ``node`` as for a Stream, ``key_fn`` and
    ``key_on_error`` are key_by's ``key`` and ``on_error``, ``key_name`` how errors name the
    key function (None: its ``__name__``)."""

    def __init__(self, flow: Dataflow, node: str, key_fn: Callable[[T], K] | None, key_on_error: str = "fail",
                 key_name: str | None = None):
        super().__init__(flow, node, Partition.HASH)
        self.key_fn = key_fn
        self.key_on_error = key_on_error  #: key_by's on_error: for the key function, on the edge and in the operator
        self._key_name = key_name  #: how a key failure names the key function (None: its name)

    def _key_label(self) -> str:
        return self._key_name or (_fn_label(self.key_fn) if self.key_fn else "record")

    def _edge_key(self) -> Any:
        """The shuffle's key function: key_by's, carrying its on_error (and a name) to the
        edge (runtime/output.py)."""
        if self.key_on_error != "fail" or self._key_name is not None:
            return KeyFunction(self.key_fn, self.key_on_error, self._key_name)
        return self.key_fn

    def _then(self, op: Operator, base: str, label: str, name: str | None, parallelism: int | None,
              key_fn: Callable[[Any], Any] | None = None, keyed: bool = False,
              kind: NodeKind = NodeKind.OPERATOR) -> str:
        # Whatever follows key_by has its input partitioned by the key, keyed state or not:
        # a map or a sink after key_by gets all of a key's records, in order, on one subtask.
        return super()._then(op, base, label, name, parallelism, key_fn=key_fn if key_fn is not None
                             else self._edge_key(), keyed=keyed, kind=kind)

    def _keyed(self, op: Operator, base: str, name: str | None, parallelism: int | None,
               key_label: str | None = None) -> Stream[Any]:
        label = f"{base}(key={key_label or self._key_label()})"
        # The operator computes keys too: it gets key_by's on_error.
        if self.key_on_error != "fail" or self._key_name is not None:
            op.key_on_error = self.key_on_error
        return Stream(self.flow, self._then(op, base, label, name, parallelism, key_fn=self._edge_key(), keyed=True))

    def _before_shuffle(self, pre_op: Operator, base: str, name: str | None,
                        key_name: str | None = None) -> "KeyedStream[tuple[Any, Any], Any]":
        """A combiner ``pre_op`` chained after this stream's operator (``<name>_pre``, at its
        parallelism), computing this stream's keys with key_by's on_error; the stream of its
        ``(key, partial)`` pairs, keyed by the pair's key."""
        pre_op.key_on_error = self.key_on_error  # the key is computed here, before the shuffle
        pre = Stream(self.flow, self.node, Partition.FORWARD)._then(
            pre_op, base, f"{base}(key={self._key_label()})", None if name is None else f"{name}_pre",
            self.flow.graph.nodes[self.node].parallelism)
        return KeyedStream(self.flow, pre, itemgetter(0), key_name=key_name)

    def count(self, name: str | None = None, parallelism: int | None = None) -> Stream[tuple[K, int]]:
        """Running count per key: ``(key, count so far)`` for every record (``name``,
        ``parallelism``: see the class docstring)."""
        return self._keyed(Count(self.key_fn), "count", name, parallelism)

    def count_final(self, name: str | None = None, parallelism: int | None = None) -> Stream[tuple[K, int]]:
        """Count per key for bounded input: ``(key, count)`` once per key at the end.

        A combiner (operators/combiners.py) counts in the upstream task, before the shuffle,
        as Spark's ``reduceByKey`` does: only ``(key, n)`` pairs cross to the keyed task,
        which adds them up. It is named ``<name>_pre`` (``pre_count`` without a name) and
        ``flow.explain()`` shows it in the upstream task's chain. ``name`` and
        ``parallelism`` are the keyed operator's."""
        pre_op = PreCount(self.key_fn)
        # A key that cannot cross (unhashable) is still key_by's, by its name, in the error.
        partials = self._before_shuffle(pre_op, "pre_count", name, key_name=self._key_label())
        counted = partials._keyed(SumCounts(), "count_final", name, parallelism, key_label=self._key_label())
        pre_op.blame = f"key_by({self._key_label()}) of {counted.node!r}"  # (as the shuffle names it)
        return counted

    def reduce(self, fn: Callable[[T, T], T], name: str | None = None, parallelism: int | None = None,
               on_error: str = "fail") -> Stream[tuple[K, T]]:
        """Running reduce per key: a key's first record is its accumulator, then ``acc =
        fn(acc, record)``; emits ``(key, acc)`` for every record. ``fn`` combines two values
        of the record's type; for an accumulator of another type use ``aggregate``. If
        ``fn`` raises, the key's state is unchanged; ``on_error="fail"`` fails the task
        naming the record, "skip" drops and reports it. ``fn`` must return a new value, not
        change ``acc`` in place: a key's first accumulator is its first record itself, and
        every emitted pair holds the accumulator. ``name``, ``parallelism``: see the class."""
        return self._keyed(Reduce(fn, self.key_fn, _on_error(on_error)), "reduce", name, parallelism)

    def reduce_final(
        self, fn: Callable[[T, T], T], name: str | None = None, parallelism: int | None = None,
        on_error: str = "fail",
    ) -> Stream[tuple[K, T]]:
        """``reduce`` for bounded input: ``(key, acc)`` once per key at the end; ``fn``,
        ``name``, ``parallelism`` and ``on_error`` as in ``reduce``."""
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
        from ``create()`` (called for a key's first record); emits ``(key, result(acc))``
        (``(key, acc)`` when ``result`` is None) for every record. E.g. a running mean:
        ``aggregate(lambda: (0, 0), lambda a, r: (a[0] + 1, a[1] + r[1]), lambda a: a[1] / a[0])``.
        If a function raises, the key's accumulator is unchanged and ``on_error`` applies (as
        in ``reduce``). Accumulators must be msgpack-encodable (docs/dataflows.md, "Records
        between processes"). A running aggregate emits for every record, so it takes no
        ``merge``: pre-aggregation would change its output (``aggregate_final`` takes one).

        In place: without ``result``, ``add`` must return a new accumulator, not change its
        argument (each emitted pair holds the accumulator itself: pairs already emitted
        would change too). With a ``result`` that makes a new value, ``add`` may change
        ``acc`` in place and return it if ``create`` returns a new object on every call; but
        then a record ``add`` or ``result`` raises on keeps what ``add`` changed when
        skipped (on_error="skip"). ``name``, ``parallelism``: see the class docstring."""
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
        """``aggregate`` for bounded input: ``(key, result(acc))`` (``(key, acc)`` when
        ``result`` is None) once per key at the end; ``create``, ``add``, ``result``,
        ``name``, ``parallelism`` and ``on_error`` as in ``aggregate``. Nothing is emitted
        before the end, so ``add`` (and ``merge``) may change the accumulator in place and
        return it, if ``create`` returns a new object on every call (what a raising
        function changed in place stays when its record is skipped).

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
        partials = self._before_shuffle(PreAggregate(create, add, self.key_fn, _on_error(on_error)),
                                        "pre_aggregate", name)
        return partials._keyed(MergeFinal(merge, result, _on_error(on_error)), "aggregate_final", name,
                               parallelism, key_label=f"{self._key_label()}, merge={_fn_label(merge)}")

    def fold_final(self, create: Callable[[], A], fold: Callable[[A, T], A], name: str | None = None,
                   parallelism: int | None = None, on_error: str = "fail") -> Stream[tuple[K, A]]:
        """Fold per key for bounded input (Bytewax's ``fold_final``): ``acc = fold(acc,
        record)`` from ``create()``; ``(key, acc)`` once per key at the end. ``fold`` may
        change ``acc`` in place and return it, as in ``aggregate_final``; ``name``,
        ``parallelism`` and ``on_error`` as there."""
        return self._keyed(FoldFinal(create, fold, self.key_fn, _on_error(on_error)), "fold_final", name,
                           parallelism)

    def stateful_map(self, fn: Callable[[S | None, T], tuple[S | None, U]], name: str | None = None,
                     parallelism: int | None = None, on_error: str = "fail") -> Stream[tuple[K, U]]:
        """Per key (Bytewax's ``stateful_map``): ``state, out = fn(state, record)``, ``state``
        None for a key's first record; emits ``(key, out)``; returning state None drops it.
        The state must be msgpack-encodable (after a restore a tuple comes back as a list).
        ``fn`` may change ``state`` in place and return it when ``out`` does not share it
        (an emitted record must not change later); a record it raises on keeps that change
        when skipped. ``name``, ``parallelism`` and ``on_error``: see the class docstring."""
        return self._keyed(StatefulMap(fn, self.key_fn, _on_error(on_error)), "stateful_map", name, parallelism)

    def apply_keyed(self, op: Operator, name: str | None = None, parallelism: int | None = None,
                    timestamp: Callable[[T], Any] | None = None, on_error: str | None = None) -> Stream[Any]:
        """Add ``op``, a user-defined keyed operator; it must key its state by the same key. A
        ``KeyedProcess`` (operators/keyed_process.py) gets this stream's key function and
        runtime-owned per-key state (snapshotted, rescaled by key group, incremental). A
        ``KeyedTimedProcess`` (operators/timers.py) also gets timers, and ``timestamp`` (a
        function of the record) for ``ctx.timestamp``. ``on_error`` ("fail" or "skip"; None:
        the operator's own, "fail" unless it sets one) applies to ``timestamp``,
        ``process_key`` and ``on_timer``: skipped, a record's outputs are dropped and the
        key's value is put back as it was (operators/keyed_process.py says what cannot be).
        ``name``, ``parallelism``: see the class docstring."""
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


Stream._keyed_stream = KeyedStream  # what Stream.key_by makes (streams.py cannot import this module)
