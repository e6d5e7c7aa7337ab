"""The operator library of abs-engine: the ABCs and the built-in operators.

Operators never import the runtime or the executors: they see only an OperatorContext.
Spark operators live in ``operators.spark`` (imported on demand: PySpark is heavy).
"""

from .aggregate import Aggregate, AggregateFinal, FoldFinal, StatefulMap
from .arrow_sources import ArrowTextSource, ParquetSource
from .base import Operator, OperatorContext, Sink, Source
from .basic import Filter, FlatMap, Identity, Map
from .eventtime import BoundedOutOfOrderness, ascending
from .files import FileSink, TextFileSource
from .generators import RangeSource
from .keyed import Count, CountFinal, Reduce, ReduceFinal
from .keyed_process import KeyedProcess, KeyState
from .timers import EVENT, PROCESSING, KeyedTimedProcess, TimerContext
from .windows import LateRecord, SessionWindows, SlidingWindows, TumblingWindows

__all__ = [
    "Operator",
    "OperatorContext",
    "Source",
    "Sink",
    "Map",
    "FlatMap",
    "Filter",
    "Identity",
    "Count",
    "CountFinal",
    "Reduce",
    "ReduceFinal",
    "KeyedProcess",
    "Aggregate",
    "AggregateFinal",
    "FoldFinal",
    "StatefulMap",
    "KeyState",
    "TextFileSource",
    "ArrowTextSource",
    "ParquetSource",
    "RangeSource",
    "FileSink",
    "BoundedOutOfOrderness",
    "ascending",
    "TumblingWindows",
    "SlidingWindows",
    "SessionWindows",
    "LateRecord",
    "KeyedTimedProcess",
    "TimerContext",
    "EVENT",
    "PROCESSING",
]
