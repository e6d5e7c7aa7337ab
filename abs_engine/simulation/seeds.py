"""Running seeds: one seed with its failure as a value, a reproduction line, the CLI."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from .mutations import BUGS, mutated
from .oracle import SimFailure
from .sim import MODES, Sim
from .topology import TOPOLOGIES


def topology_for(seed: int, topology: str) -> str:
    return TOPOLOGIES[seed % len(TOPOLOGIES)] if topology == "all" else topology


def reproduction(seed: int, topology: str, bug: str = "none", storage: str = "memory", mode: str = "aligned") -> str:
    extra = (f" --bug {bug}" if bug != "none" else "") + (f" --storage {storage}" if storage != "memory" else "")
    extra += f" --mode {mode}" if mode != "aligned" else ""
    return f"python3 -m abs_engine.simulation --seed {seed} --topology {topology}{extra}"


def run_seed(seed: int, topology: str, bug: str = "none", storage: str = "memory",
             trace: list[str] | None = None, mode: str = "aligned") -> str | None:
    """None if every invariant held, else what went wrong (an exception from the protocol
    code counts as a failure too)."""
    root = None
    if storage == "disk":
        root = tempfile.mkdtemp(prefix="abs-sim-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    sim: Sim | None = None
    try:
        with mutated(bug):
            sim = Sim(seed, topology, bug, storage, root, trace=trace is not None, mode=mode)
            sim.run()
        return None
    except SimFailure as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - a crash of the code under test is a finding
        return f"{type(e).__name__}: {e}"
    finally:
        if trace is not None and sim is not None and sim.trace is not None:
            trace.extend(sim.trace)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


DESCRIPTION = "Deterministic simulation of the checkpoint protocol, over the production task code."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m abs_engine.simulation", description=DESCRIPTION)
    ap.add_argument("--seeds", type=int, default=1000, help="how many seeds to run")
    ap.add_argument("--start", type=int, default=0, help="the first seed")
    ap.add_argument("--seed", type=int, help="run this one seed (overrides --seeds/--start)")
    ap.add_argument("--topology", choices=("all", *TOPOLOGIES), default="all",
                    help="all: seed s runs TOPOLOGIES[s %% 3]")
    ap.add_argument("--bug", choices=BUGS, default="none", help="inject a deliberate bug")
    ap.add_argument("--storage", choices=("memory", "disk"), default="memory")
    ap.add_argument("--mode", choices=MODES, default="aligned", help="how checkpoints are taken")
    ap.add_argument("--trace", action="store_true", help="print the event log (with --seed)")
    ap.add_argument("--progress-every", type=int, default=5000)
    args = ap.parse_args(argv)
    seeds = range(args.seed, args.seed + 1) if args.seed is not None else range(args.start, args.start + args.seeds)
    failed = 0
    started = time.perf_counter()
    for i, seed in enumerate(seeds, 1):
        topo = topology_for(seed, args.topology)
        trace: list[str] | None = [] if args.trace else None
        err = run_seed(seed, topo, args.bug, args.storage, trace, args.mode)
        if trace:
            print("\n".join(trace))
        if err is not None:
            failed += 1
            print(f"FAILED seed={seed} topology={topo}: {err}; reproduce: "
                  f"{reproduction(seed, topo, args.bug, args.storage, args.mode)}", flush=True)
        if i % args.progress_every == 0 or i == len(seeds):
            rate = i / max(time.perf_counter() - started, 1e-9)
            print(f"{i}/{len(seeds)} seeds, {failed} failed ({rate:.0f} seeds/s)", file=sys.stderr, flush=True)
    return 1 if failed else 0
