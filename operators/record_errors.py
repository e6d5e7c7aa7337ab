"""What happens when a user function raises on a record: ``RecordError`` (naming the
function and the record), the ``on_error`` policy ("fail" or "skip") that every operator,
source and key function follows through ``Guarded``, and ``KeyFunction``, a key function
with its own policy.

Part of the operator interface (operators/base.py re-exports every name): the runtime and
the operator library meet here too.

Invariant: a record is skipped only before the operator changed any state for it (compute
first, then commit), and every skipped record is kept in ``skipped`` until the runtime
takes it (``take_skipped``) and reports it.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["MESSAGE_MAX", "ON_ERROR", "Guarded", "KeyFunction", "RecordError", "check_on_error", "function_label",
           "raised_in"]

ON_ERROR = ("fail", "skip")
MESSAGE_MAX = 200  #: characters of the user's exception a RecordError's message shows


class RecordError(Exception):
    """``record`` made the user function ``function`` raise (the user's exception is the
    cause). ``function`` is a label such as ``"timestamps function 'parse_ts'"``
    (``function_label``); for a window that fails when it fires, ``record`` is the window
    ``(key, start, end)``, for a timer ``(key, timestamp)``. The runtime turns it into a
    failure that names the operator, the function, the exception and the record, and the
    driver fails the job at once if the same record fails the same operator again after a
    restart (a poison record)."""

    def __init__(self, record: Any, function: str = ""):
        super().__init__(record, function)
        self.record = record
        self.function = function
        #: The operator the failure is blamed on, when not the one that raised it (a
        #: combiner computes key_by's keys: ``"key_by(fn) of 'count'"``); None: that one.
        self.operator: str | None = None

    def __str__(self) -> str:
        what = f"the {self.function}" if self.function else "the operator's function"
        cause = self.__cause__
        if cause is None:
            return f"a record made {what} raise"
        try:
            text = f"{type(cause).__name__}: {cause}"
        except Exception:  # noqa: BLE001 - a broken __str__ must not hide the failure
            text = type(cause).__name__
        if len(text) > MESSAGE_MAX:
            text = text[:MESSAGE_MAX] + "..."
        return f"{what} raised {text}"


def check_on_error(on_error: str) -> str:
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    return on_error


def function_label(role: str, fn: Any) -> str:
    """How a failure names a user function: ``function_label("key", user)`` is
    ``"key function 'user'"`` (a callable without a name: its type's)."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return f"{role} function {name!r}"


def raised_in(e: BaseException, fn: Any) -> bool:
    """Whether ``e`` was raised inside ``fn`` (a frame of its code is in the traceback):
    which of two functions called one right after the other raised (``create`` or
    ``add``). Looked at on a failure only; a function without Python code never matches."""
    code = getattr(fn, "__code__", None)
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False


class Guarded:
    """The one rule for a user function that raises on a record, shared by every operator
    and source (and, through ``KeyFunction``, by key functions on the edges into keyed
    operators).

    An operator or source that calls user code per record catches what the call raises
    and calls ``record_failed(record, function, error)`` before it has changed any state
    for that record (compute first, then commit):

    - ``on_error="fail"`` (the default) raises ``RecordError(record, function)`` from the
      error: the task fails naming the operator, the function, the exception and the
      record, and the job fails at once if the record fails again after a restart;
    - ``on_error="skip"`` appends ``(record, error)`` to ``skipped`` and returns: the
      caller drops the record (its state and output stay as they were), and the runtime
      reports it (``JobResult.skipped_records``, one log line per record).

    ``on_error`` is the operator's; a key function has its own (``key_by(key,
    on_error=...)``: ``key_on_error``), passed as ``on_error`` to ``record_failed``."""

    #: "fail" or "skip": what a record that makes one of this operator's functions raise does.
    on_error: str = "fail"
    #: The same for the key function (``key_by(key, on_error=...)``) of a keyed operator.
    key_on_error: str = "fail"

    def record_failed(self, record: Any, function: str, error: BaseException, on_error: str | None = None) -> None:
        """``record`` made the user function ``function`` (a ``function_label``) raise
        ``error``: raise RecordError, or (skip) note it in ``skipped`` and return."""
        if (on_error or self.on_error) == "skip":
            skipped: list[tuple[Any, BaseException]] | None = getattr(self, "skipped", None)
            if skipped is None:
                skipped = []
                self.skipped = skipped  # (an operator whose __init__ made none)
            skipped.append((record, error))
            return
        raise RecordError(record, function) from error

    @property
    def reports_skipped(self) -> bool:
        """Whether the runtime looks at ``skipped`` after each call: an operator that skips
        records (or, like a window's late records, drops records it must report)."""
        return self.on_error == "skip" or self.key_on_error == "skip"

    def take_skipped(self) -> list[tuple[Any, BaseException]]:
        """The records skipped since the last call, with their exceptions (then none)."""
        skipped: list[tuple[Any, BaseException]] | None = getattr(self, "skipped", None)
        if not skipped:
            return []
        taken = list(skipped)
        skipped.clear()
        return taken


class KeyFunction:
    """A key function with its ``on_error`` (``key_by(key, on_error="skip")``) and the name
    failures give it: what the hash edge into a keyed operator applies (the runtime's
    ``Output`` unwraps it; it routes by ``fn``). Called, it is the key of a record."""

    __slots__ = ("fn", "on_error", "name")

    def __init__(self, fn: Callable[[Any], Any] | None, on_error: str = "fail", name: str | None = None):
        self.fn = fn
        self.on_error = check_on_error(on_error)
        self.name = name or (getattr(fn, "__name__", None) or type(fn).__name__ if fn is not None else "record")

    def __call__(self, record: Any) -> Any:
        return record if self.fn is None else self.fn(record)

    def __getstate__(self) -> tuple[Any, str, str]:
        return self.fn, self.on_error, self.name

    def __setstate__(self, state: tuple[Any, str, str]) -> None:
        self.fn, self.on_error, self.name = state
