"""The ``abs-engine`` command line.

    abs-engine plan FILE.py                      print the compiled plan, back-edges marked
    abs-engine run FILE.py [--supervise] ...     run its job (a supervisor restarts a crashed driver)
    abs-engine checkpoints list DIR              list the checkpoints stored in DIR
    abs-engine checkpoints show DIR [ID] --json  one checkpoint (default: newest), state decoded

The checkpoint directory is distrusted (anyone who can write it can plant files): both
commands read it only through ``CheckpointStorage``, which refuses names that leave the
directory, symlinks, FIFOs and devices, and bounds every read, so they never hang, never
print a file from outside the directory, and report a tampered checkpoint as INVALID with
its reason (``list``; details on stderr) or as an error (``show``).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
from typing import Any

from . import codec, fs
from . import state_summary
from .api import Dataflow
from .checkpoint.remote import open_storage
from .errors import AbsEngineError, CheckpointError, CheckpointErrorReason, ConfigError


def load_flow(path: str) -> Dataflow:
    """A Dataflow from a Python file: its ``build_flow()`` function, else a module-level
    Dataflow, else the one the file runs. Never runs a job: ``Dataflow.run`` only captures
    its flow while the file loads (api.PlanOnly)."""
    return load_job(path)[0]


def load_job(path: str, keep_path: bool = False, script_args: list[str] | None = None
             ) -> tuple[Dataflow, dict[str, Any]]:
    """``load_flow``, with the options the file runs its job with (none for a
    ``build_flow()``); ``keep_path`` leaves the file's directory importable (a job about to
    run needs its sibling modules). The file sees ``sys.argv`` as ``python FILE ARGS...``
    would give it: its own arguments (``script_args``, what follows ``--``), never ours."""
    import inspect

    from .api import PlanOnly

    # Like `python FILE.py ARGS`: the file's directory is importable (sibling modules), and
    # its argv is its own (an argparse in it must not see `plan FILE`).
    here = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, here)
    argv, sys.argv = sys.argv, [path, *(script_args or [])]
    PlanOnly.active = True
    try:
        try:
            ns = runpy.run_path(path, run_name="__abs_engine_plan__")
        except PlanOnly as ran:
            return ran.flow, ran.config  # the file runs its job at import: that job is the plan
        build = ns.get("build_flow")
        if callable(build):
            required = [p.name for p in inspect.signature(build).parameters.values()
                        if p.default is inspect.Parameter.empty
                        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
            if required:
                raise SystemExit(f"{path}: build_flow() needs arguments ({', '.join(required)}) that `abs-engine "
                                 "plan` cannot give: give them defaults, or add a build_flow() without required "
                                 "arguments that builds the job as you would run it")
            try:
                flow = build()
            except PlanOnly as ran:
                return ran.flow, ran.config
            if isinstance(flow, Dataflow):
                return flow, {}
    finally:
        PlanOnly.active = False
        if not keep_path:  # (a job about to run keeps its argv and path: it runs as the file)
            sys.path.remove(here)
            sys.argv = argv
    flows = [v for v in ns.values() if isinstance(v, Dataflow)]
    if len(flows) != 1:
        raise SystemExit(
            f"{path}: define build_flow() returning a Dataflow, or exactly one module-level Dataflow "
            f"(found {len(flows)})"
        )
    return flows[0], {}


def jsonable(obj: Any) -> Any:
    """msgpack-decoded state as JSON: tuples become lists, bytes become text (or hex)."""
    if isinstance(obj, dict):
        return {k if isinstance(k, str) else json.dumps(jsonable(k)): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, bytes):
        try:
            return {"$text": obj.decode("utf-8")}
        except UnicodeDecodeError:
            return {"$hex": obj.hex()}
    return obj


def cmd_plan(args: argparse.Namespace) -> int:
    from . import spark_session

    spark_session.planning_only = True  # (no cluster is started to print a plan)
    try:
        print(load_job(args.file, script_args=args.script_args)[0].explain())
    finally:
        spark_session.planning_only = False
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run the job a file defines, with the options it runs it with (none for a
    ``build_flow()``) and those given here; under a supervisor with --supervise."""
    if args.driver_restarts is not None and not args.supervise:
        raise ConfigError("driver_restarts", "--driver-restarts counts the drivers --supervise restarts: "
                                             "give --supervise too")
    flow, config = load_job(args.file, keep_path=True, script_args=args.script_args)
    given = {"checkpoint_dir": args.checkpoint_dir, "checkpoint_interval": args.checkpoint_interval,
             "driver_restarts": args.driver_restarts}
    config.update({k: v for k, v in given.items() if v is not None})
    if args.resume:
        config["resume"] = args.resume  # True, or "if-present"
    if args.supervise:
        config["supervise"] = True
    if args.progress:
        config["progress"] = True
    res = flow.run(**config)
    print(f"{res.job}: {res.source_records:,} source records in {res.duration_s:.1f} s, "
          f"{res.checkpoints_completed} checkpoint(s), {res.restarts} restart(s)"
          + (f", checkpoints in {res.checkpoint_dir}" if config.get("checkpoint_dir") else ""))
    return 0


def pipeline_dirs(location: str) -> list[str]:
    """The ``pipeline-<name>`` directories of a job run pipeline by pipeline (none for a job
    run as one), local or remote."""
    from .executors.job_storage import pipeline_dirs as dirs

    if not fs.is_remote(location) and not os.path.isdir(fs.local_path(location)):
        return []
    return sorted(dirs(location))


def cmd_list(args: argparse.Namespace) -> int:
    pipelines = pipeline_dirs(args.dir)
    if pipelines and not open_storage(args.dir).ids_on_disk():
        for i, name in enumerate(pipelines):  # each pipeline's checkpoints, apart (their own ids)
            if i:
                print()
            print(f"{name}:")
            list_checkpoints(open_storage(fs.join(args.dir, name)))
        return 0
    return list_checkpoints(open_storage(args.dir))


def list_checkpoints(storage: Any) -> int:
    ids = storage.ids_on_disk()
    if not ids:
        print(f"no checkpoints in {storage.root}")
        return 0
    print(f"{'id':>6}  {'created':19}  {'final':5}  {'tasks':>5}  {'bytes':>12}  {'took ms':>8}  status")
    rows: dict[int, str] = {}
    shared: dict[int, list[int]] = {}  #: a retired checkpoint's id -> the checkpoints that use its files
    for cid in ids:
        try:
            meta = storage.verify(cid)
            d = storage.describe(cid)
            on = f" (incremental on {', '.join(map(str, d['builds_on']))})" if d["builds_on"] else ""
            rows[cid] = (f"{cid:>6}  {d['created']:19}  {str(d['final']):5}  {d['tasks']:>5}  {d['bytes']:>12,}  "
                         f"{d['duration_ms']:>8}  ok{on}")
            for ref in {r.checkpoint_id for refs in meta.chains.values() for r in refs}:
                shared.setdefault(ref, []).append(cid)
        except CheckpointError as e:
            rows[cid] = f"{cid:>6}  {'':19}  {'':5}  {'':>5}  {'':>12}  {'':>8}  INVALID: {e.reason.value}"
            if not (e.reason is CheckpointErrorReason.MISSING_METADATA):
                print(f"checkpoint {cid}: {e}", file=sys.stderr)
    for cid in ids:
        if rows[cid].endswith("INVALID: missing_metadata") and cid in shared:
            # Retired by retention, kept for the files later checkpoints build on.
            rows[cid] = (f"{cid:>6}  {'':19}  {'':5}  {'':>5}  {'':>12}  {'':>8}  "
                         f"shared: files used by {', '.join(map(str, sorted(shared[cid])))}")
        elif rows[cid].endswith("INVALID: missing_metadata"):
            print(f"checkpoint {cid}: no metadata (incomplete, or being written)", file=sys.stderr)
        print(rows[cid])
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    storage = open_storage(args.dir)
    if (pipelines := pipeline_dirs(args.dir)) and not storage.ids_on_disk():
        raise CheckpointError(CheckpointErrorReason.NOT_FOUND,
                              f"{storage.root} holds a checkpoint directory per pipeline ({', '.join(pipelines)}): "
                              f"show one of them, e.g. abs-engine checkpoints show {os.path.join(args.dir, pipelines[0])}")
    cid = args.id
    if cid is None:
        meta, _ = storage.latest_valid()
        if meta is None:
            raise CheckpointError(CheckpointErrorReason.NOT_FOUND, f"no valid checkpoint in {storage.root}")
        cid = meta.checkpoint_id
    meta = storage.verify(cid)
    max_p = int(meta.layout.get("max_parallelism", 128))
    keyed = set(meta.layout.get("keyed", []))
    kinds, parts = meta.layout.get("kinds", {}), dict(meta.layout.get("parts", {}))
    for op in keyed - set(parts):
        parts[op] = [["", "keyed"]]  # (a checkpoint from before layouts were recorded: keyed, whole)
    snapshots = {t: storage.read_snapshot(cid, t, meta) for t in meta.tasks}
    states = {t: s.states for t, s in snapshots.items()}
    doc = {
        **storage.describe(cid),
        "job": meta.job,
        "fingerprint": meta.fingerprint,
        "tasks": {
            t: {"file": e.file, "bytes": e.size, "sha256": e.sha256,
                "alignment_ms": round(meta.alignment_ms.get(t, 0.0), 3),
                "state": jsonable(states[t]),
                "summary": {op: state_summary.summary(st, parts.get(op, []), kinds.get(op, ""), max_p)
                            for op, st in states[t].items()},
                "back_edge_logs": jsonable(snapshots[t].logs)}
            for t, e in sorted(meta.tasks.items())
        },
    }
    # (the channels' in-flight records: back-edge logs, and an unaligned checkpoint's channel state)
    doc["by_kind"] = state_summary.by_kind(
        [s for info in doc["tasks"].values() for s in info["summary"].values()],
        sum(len(codec.pack(records)) for s in snapshots.values() for records in s.logs.values()))
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(f"checkpoint {cid} of job {meta.job!r}: {doc['created']}, final={meta.final}, {doc['bytes']:,} bytes")
        print("  by kind: " + ("; ".join(f"{k} {n:,} bytes" for k, n in doc["by_kind"].items()) or "no state"))
        for t, info in doc["tasks"].items():
            print(f"  {t}: {info['bytes']:,} bytes, alignment {info['alignment_ms']} ms")
            for op, state in info["state"].items():
                text = json.dumps(state)
                print(f"    {op}: {text[:200]}{'...' if len(text) > 200 else ''}")
                print(f"      {state_summary.text(kinds.get(op, op), info['summary'][op])}")
            for ch, records in info["back_edge_logs"].items():
                text = json.dumps(records)
                print(f"    channel {ch}: {len(records)} record(s) in flight (a back-edge log or channel state): "
                      f"{text[:160]}{'...' if len(text) > 160 else ''}")
    return 0


def cmd_savepoint(args: argparse.Namespace) -> int:
    """Ask the driver of the job running on DIR for a savepoint (and, with --stop, a stop
    after it) over its authenticated control endpoint, and print where it was written.
    No process is signalled: see executors/job_control.py for who is trusted and why."""
    from .checkpoint.remote import control_dir
    from .executors.job_control import request

    print(request(control_dir(args.dir), "stop" if args.stop else "savepoint", args.timeout))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from . import fs
    from .monitor.report import write_report
    from .monitor.store import STATS_FILE, read_stats
    from .pipelines import DIR_PREFIX

    if (pipelines := pipeline_dirs(args.dir)) and not os.path.exists(os.path.join(args.dir, STATS_FILE)):
        # A job of several pipelines: one report, a tab per pipeline (as its dashboard had). A
        # pipeline with no statistics (one restored finished from a savepoint is not run
        # again) is said and left out; none at all is the error a single job's would be.
        parts, missing = [], []
        for d in sorted(pipelines):
            try:
                parts.append({**read_stats(fs.join(args.dir, d)), "name": d[len(DIR_PREFIX):]})
            except CheckpointError as e:
                if e.reason is not CheckpointErrorReason.NOT_FOUND:
                    raise
                missing.append(d)
        if not parts:
            raise CheckpointError(CheckpointErrorReason.NOT_FOUND,
                                  f"no job statistics in any pipeline of {args.dir} ({', '.join(missing)})")
        if missing:
            print(f"no statistics for {', '.join(missing)} (not run in this directory): left out of the report",
                  file=sys.stderr)
        # in the plan's order, as the live dashboard has them (by name where a file does not say)
        parts.sort(key=lambda d: (d.get("pipeline_id") if isinstance(d.get("pipeline_id"), int) else 1 << 30,
                                  d["name"]))
        doc = {"version": 1, "pipelines": parts}
    else:
        doc = read_stats(args.dir)
    out = args.output or (os.path.join(fs.local_path(args.dir), "report.html") if not fs.is_remote(args.dir)
                          else "report.html")
    write_report(doc, out)
    print(out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="abs-engine", description="abs-engine: stream dataflows with ABS checkpoints")
    sub = p.add_subparsers(dest="command", required=True)
    pp = sub.add_parser("plan", help="print the compiled plan of a dataflow file (its own arguments after --)")
    pp.add_argument("file", help="a Python file defining build_flow() or a module-level Dataflow")
    pp.set_defaults(fn=cmd_plan)
    rn = sub.add_parser("run", help="run the job a dataflow file defines (its build_flow(), or the job it runs; "
                                    "its own arguments after --)")
    rn.add_argument("file", help="a Python file defining build_flow(), a module-level Dataflow, or running one")
    rn.add_argument("--checkpoint-dir", help="where its checkpoints go (needed by --supervise and --resume)")
    rn.add_argument("--checkpoint-interval", type=float, help="seconds between checkpoints")
    rn.add_argument("--resume", nargs="?", const=True, choices=[True, "if-present"],
                    help="continue from the newest checkpoint in --checkpoint-dir ('if-present': if there is one)")
    rn.add_argument("--supervise", action="store_true",
                    help="run the driver under a supervisor that restarts it from the latest checkpoint if it "
                         "crashes (executors/supervisor.py)")
    rn.add_argument("--driver-restarts", type=int, help="how many crashed drivers --supervise restarts (default 3)")
    rn.add_argument("--progress", action="store_true", help="a progress line about once a second")
    rn.set_defaults(fn=cmd_run)
    cp = sub.add_parser("checkpoints", help="inspect stored checkpoints")
    csub = cp.add_subparsers(dest="action", required=True)
    cl = csub.add_parser("list", help="list checkpoints in DIR")
    cl.add_argument("dir")
    cl.set_defaults(fn=cmd_list)
    cs = csub.add_parser("show", help="show one checkpoint (default: the newest valid one)")
    cs.add_argument("dir")
    cs.add_argument("id", nargs="?", type=int)
    cs.add_argument("--json", action="store_true", help="machine-readable output")
    cs.set_defaults(fn=cmd_show)
    sp = sub.add_parser("savepoint", help="take a savepoint of the job running on DIR (and stop it with --stop)")
    sp.add_argument("dir", help="the job's checkpoint directory")
    sp.add_argument("--stop", action="store_true", help="stop the job after the savepoint, its sinks committed")
    sp.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the savepoint")
    sp.set_defaults(fn=cmd_savepoint)
    rp = sub.add_parser("report", help="write a self-contained HTML report of the job whose checkpoints are in DIR")
    rp.add_argument("dir", help="the job's checkpoint directory (it holds _job_stats.json, or a job of pipelines "
                                "one per pipeline-<name>/: a tab each)")
    rp.add_argument("-o", "--output", help="the HTML file to write (default: DIR/report.html for a local DIR, "
                                           "else ./report.html)")
    rp.set_defaults(fn=cmd_report)
    return p


def main(argv: list[str] | None = None) -> int:
    """``abs-engine COMMAND ... [-- SCRIPT ARGS]``: what follows ``--`` is the script's own
    command line (``plan`` and ``run``), passed to it as its ``sys.argv[1:]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, script_args = argv[:at], argv[at + 1:]
    args = build_parser().parse_args(argv)
    args.script_args = script_args
    try:
        return int(args.fn(args))
    except AbsEngineError as e:
        print(f"abs-engine: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # e.g. the directory cannot be listed
        print(f"abs-engine: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
