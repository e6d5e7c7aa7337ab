"""Event-time windows per key: ``WindowedStream`` (``KeyedStream.window``), finished by
``reduce``, ``aggregate`` or ``process`` into ``WindowResults``, the stream of the
windows' results with its ``late`` side output (operators/windows.py runs them).
"""

from __future__ import annotations

import dataclasses

from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable

from operators.basic import Identity
from operators.windows import AGGREGATE, PROCESS, REDUCE, SessionWindows, WindowOperator, Windows

from .errors import GraphError, GraphErrorReason
from .graph import Edge, Node, NodeKind, Partition
from .streams import A, K, T, U, Stream, _on_error

if TYPE_CHECKING:
    from .api import Dataflow
    from .keyed import KeyedStream


class WindowedStream(Generic[T, K]):
    """A keyed stream cut into event-time windows: finish it with ``reduce``, ``aggregate``
    or ``process``; each returns a ``WindowResults`` stream (with its ``.late`` records).
    Their ``on_error`` applies to every function of the window (the timestamp function
    too): a record one raises on fails the task naming it ("fail"), or is dropped and
    reported with its key's windows unchanged ("skip"); a window whose ``result`` or
    ``process`` raises when it fires is named as ``(key, start, end)`` (skipped: no output
    for it). ``name`` and ``parallelism`` are the window operator's, as in ``Stream.map``.

    Made by ``KeyedStream.window``: ``keyed`` is that stream, ``windows``, ``timestamp`` and
    ``allowed_lateness`` its arguments."""

    def __init__(self, keyed: KeyedStream[T, K], windows: Windows, timestamp: Callable[[T], Any],
                 allowed_lateness: Any):
        self.keyed, self.windows, self.timestamp, self.allowed_lateness = keyed, windows, timestamp, allowed_lateness

    def _op(self, kind: str, fn: Callable[..., Any], name: str | None, parallelism: int | None, on_error: str,
            **kw: Any) -> "WindowResults[Any]":
        op = WindowOperator(self.windows, self.timestamp, kind, fn, self.keyed.key_fn, self.allowed_lateness, **kw,
                            on_error=_on_error(on_error))
        w = self.windows
        # (every parameter that decides what it emits: the plan's text shows them)
        shown = ", ".join(f"{f.name}={getattr(w, f.name)}" for f in dataclasses.fields(w)
                          if not (f.name == "offset" and not getattr(w, f.name)))
        label = f"{type(w).__name__.replace('Windows', '').lower()}({shown})"
        if self.allowed_lateness:
            label += f", allowed_lateness={self.allowed_lateness}"
        s = self.keyed._keyed(op, f"window_{kind}", name, parallelism, key_label=f"{self.keyed._key_label()}, {label}")
        return WindowResults(s.flow, s.node, op)

    def reduce(self, fn: Callable[[T, T], T], name: str | None = None,
               parallelism: int | None = None, on_error: str = "fail") -> "WindowResults[tuple[K, Any, Any, T]]":
        """Per key and window, ``fn(acc, record)`` from the window's first record: ``(key,
        start, end, acc)`` when the window fires. ``name``, ``parallelism``, ``on_error``:
        see the class docstring."""
        return self._op(REDUCE, fn, name, parallelism, on_error)

    def aggregate(self, create: Callable[[], A], add: Callable[[A, T], A], result: Callable[[A], Any] | None = None,
                  merge: Callable[[A, A], A] | None = None, name: str | None = None,
                  parallelism: int | None = None, on_error: str = "fail") -> "WindowResults[tuple[K, Any, Any, Any]]":
        """Per key and window, ``acc = add(acc, record)`` from ``create()``: ``(key, start,
        end, result(acc))`` (``acc`` when ``result`` is None) when it fires. Session windows
        merge accumulators: they need ``merge(acc1, acc2)`` (GraphError without); with it,
        sliding windows whose size is a multiple of the slide are kept as panes of one
        slide (operators.windows). ``add`` and ``merge`` may change the accumulator
        in place and return it when ``create`` returns a new object on every call and
        ``result`` makes a new value (without ``result`` the output holds the accumulator,
        which a late record would change again); what a function changed in place before it
        raised stays (operators.windows). ``name``, ``parallelism``, ``on_error``: see the
        class docstring."""
        if isinstance(self.windows, SessionWindows) and merge is None:
            raise GraphError(GraphErrorReason.BAD_ARGUMENT,
                             "aggregate() over SessionWindows needs merge=(acc1, acc2) -> acc: sessions merge")
        return self._op(AGGREGATE, add, name, parallelism, on_error, create=create, result=result, merge=merge)

    def process(self, fn: Callable[[K, Any, Any, list[T]], Iterable[U] | None], name: str | None = None,
                parallelism: int | None = None, on_error: str = "fail") -> "WindowResults[U]":
        """Per key and window, ``fn(key, start, end, records)`` when it fires: the records it
        returns (the window keeps its records until then). ``name``, ``parallelism``,
        ``on_error``: see the class docstring."""
        return self._op(PROCESS, fn, name, parallelism, on_error)


class WindowResults(Stream[T]):
    """A window operator's results; ``late`` is the stream of its late records. Made by
    WindowedStream: ``flow`` and ``node`` as for a Stream, ``op`` the window operator."""

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
