"""What ``abs-engine checkpoints show`` says about an operator's state, read by the shape the
operator declared (operators/state_layout.py, stored in the checkpoint's layout): keyed state
as keys per key group (open windows for a window operator, buffered records for a join),
timers as a count, a watermark as its value, anything else (source offsets, a sink's
pending epochs) as its size; and the sizes per kind of state (``by_kind``), in-flight
channel state (back-edge logs, unaligned checkpoints' channel state) among them.

Invariant: only the checkpoint is read, never the job's code: a checkpoint of an unknown
or older layout is shown by size, never misread (a window's fields were once counted as
its keys).
"""

from __future__ import annotations

from typing import Any

from . import codec, keygroups
from .errors import AbsEngineError


def key_groups_of(state: Any, max_parallelism: int) -> dict[int, list[int]] | None:
    """For keyed state (a map key -> value): key group -> [keys, encoded bytes]; None for
    any other state (or keys that cannot be placed)."""
    if not isinstance(state, dict):
        return None
    groups: dict[int, dict[Any, Any]] = {}
    try:
        for k, v in state.items():
            groups.setdefault(keygroups.key_group(k, max_parallelism), {})[k] = v
    except (AbsEngineError, TypeError):
        return None
    return {g: [len(kv), len(codec.pack(kv))] for g, kv in sorted(groups.items())}


#: The kinds ``by_kind`` sums, in the order they are shown.
KINDS = ("keyed", "windows", "joins", "timers", "watermarks", "sources", "sinks", "operators", "channel state")


def kind_of(kind: str, part: str) -> str:
    """Which of KINDS a part of an operator's state is (``kind``: plan.operator_kind's)."""
    if part == "keyed":
        return "joins" if "join" in kind else "windows" if "window" in kind else "keyed"
    if part in ("keyed timers", "lowest"):
        return "timers" if part == "keyed timers" else "watermarks"
    return {"source": "sources", "sink": "sinks"}.get(kind.split(" ", 1)[0], "operators")


def by_kind(summaries: list[dict[str, Any]], channel_bytes: int) -> dict[str, int]:
    """Bytes per kind of state over ``summary`` results (each part says its kind), plus the
    in-flight channel state's; kinds with nothing are left out."""
    out = dict.fromkeys(KINDS, 0)
    for parts in summaries:
        for e in parts.values():
            out[e["kind"]] += int(e["bytes"])
    out["channel state"] += channel_bytes
    return {k: v for k, v in out.items() if v}


def summary(state: Any, parts: list[list[str]], kind: str, max_parallelism: int) -> dict[str, Any]:
    """Per part of ``state`` (by its declared ``parts``): what it holds, its size in bytes
    and its kind (KINDS)."""
    out: dict[str, Any] = {}
    for field, part in parts:
        value = state if field == "" else state.get(field) if isinstance(state, dict) else None
        name = field or "keys"
        size = len(codec.pack(value))
        groups = key_groups_of(value, max_parallelism) if part == "keyed" else None
        if groups is not None and isinstance(value, dict):
            entry: dict[str, Any] = {"keys": sum(n for n, _ in groups.values()), "key_groups": len(groups),
                                     "bytes": size, "groups": groups}
            if groups:
                big = max(groups.items(), key=lambda item: item[1][1])
                entry["largest_group"] = {"group": big[0], "keys": big[1][0], "bytes": big[1][1]}
            if "window" in kind and all(isinstance(v, dict) for v in value.values()):
                entry["windows"] = sum(len(v) for v in value.values())  # key -> start -> window
            if "join" in kind and all(_two_lists(v) for v in value.values()):  # key -> [left, right]
                entry["buffered"] = [sum(len(v[0]) for v in value.values()), sum(len(v[1]) for v in value.values())]
            out[name] = entry
        elif part == "keyed timers" and isinstance(value, list):
            out[name] = {"timers": sum(len(row[2]) for row in value if isinstance(row, list) and len(row) == 3),
                         "bytes": size}
        elif part == "lowest":
            out[name] = {"value": value, "bytes": size}
        else:
            out[name] = {"bytes": size}
        out[name]["kind"] = kind_of(kind, part)
    if not parts:
        out["state"] = {"bytes": len(codec.pack(state)), "kind": kind_of(kind, "")}
    return out


def _two_lists(v: Any) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(isinstance(x, list) for x in v)


def text(name: str, parts: dict[str, Any]) -> str:
    """One line of ``summary``'s result: ``count: keys 3,000 in 128 key groups (1.2 MB)...``."""
    said = []
    for field, e in parts.items():
        if "keys" in e:
            line = f"{field}: {e['keys']:,} keys in {e['key_groups']:,} key groups"
            if "windows" in e:
                line += f", {e['windows']:,} open windows"
            if "buffered" in e:
                line += f", {e['buffered'][0]:,} left and {e['buffered'][1]:,} right records buffered"
            line += f", {e['bytes']:,} bytes"
            if "largest_group" in e:
                g = e["largest_group"]
                line += f" (largest: group {g['group']}, {g['keys']:,} keys, {g['bytes']:,} bytes)"
        elif "timers" in e:
            line = f"{field}: {e['timers']:,} timers, {e['bytes']:,} bytes"
        elif "value" in e:
            line = f"{field}: {e['value']}"
        else:
            line = f"{field}: {e['bytes']:,} bytes"
            if e.get("kind") in ("sources", "sinks"):
                line = f"{field}: {'offsets' if e['kind'] == 'sources' else 'pending output'}, {e['bytes']:,} bytes"
        said.append(line)
    return f"{name}: " + "; ".join(said)
