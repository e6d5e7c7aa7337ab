"""The names users give: a dataflow's (its job name) and its operators'.

Invariant: a name is 1 to ``MAX_NAME`` characters of ``[A-Za-z0-9_.-]``, starting with a
letter, digit or underscore. Names become parts of file names (``<operator>#<i>.<tag>.state``
in a checkpoint), object-store keys, metric labels and log lines, and task and channel ids
are built from them with ``#`` and ``->``: so a name holds no path separator, no ``..`` of
its own, no NUL or control character, no ``#`` or ``>``, and is the same string on every
file system. A bad name is refused when it is given (a GraphError naming it and the rule),
never at the first checkpoint.
"""

from __future__ import annotations

import re

from .errors import GraphError, GraphErrorReason

MAX_NAME = 100
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def check_name(name: object, what: str) -> str:
    """``name`` if it is a valid name for ``what`` ("operator", "dataflow"), else GraphError(BAD_NAME)."""
    if not isinstance(name, str):
        raise GraphError(GraphErrorReason.BAD_NAME, f"{what} name must be a str, got {type(name).__name__}")
    if not _NAME.fullmatch(name) or len(name) > MAX_NAME:
        shown = repr(name) if len(name) <= 60 else repr(name[:60]) + "..."
        raise GraphError(
            GraphErrorReason.BAD_NAME,
            f"{what} name {shown} is not allowed: use 1 to {MAX_NAME} letters, digits, '_', '.' or '-', "
            "starting with a letter, digit or '_' (names become parts of checkpoint file names)",
            name if what == "operator" else None,
        )
    return name
