"""What watching a job costs: word-count throughput with the dashboard off, on but not
looked at, and on with a client polling it as the page does (api/job, api/checkpoints and
the selected checkpoint's details every second) plus a Prometheus scrape of /metrics every
second. Beside the wall clock, which on two busy cores spreads more from round to round
than the dashboard costs, it reports CPU time: the driver's (this process: its dashboard
thread serves the polls) and the poller's.

    python benchmarks/dashboard_bench.py                    # 30M words, parallelism 2, 5 rounds
    python benchmarks/dashboard_bench.py --words 2000000 --rounds 1   # quick

The poller is a separate process (a browser is one). Variants run interleaved (A B C, A B C,
...); the report gives medians, the spread and per-round ratios against "off" taken in the
same round. Results: benchmarks/results/dashboard.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from abs_engine import Dataflow, JobResult
from abs_engine.testing import write_zipf_corpus
from operators import FileSink, TextFileSource

HERE = os.path.dirname(os.path.abspath(__file__))

#: The printed address is http://HOST:PORT/?token=T; the poller sends T as a Bearer header,
#: as Prometheus does. A refusal (HTTP 4xx/5xx) fails the benchmark: only a connection that
#: no longer opens means the job ended.
POLLER = r"""
import json, sys, time, urllib.error, urllib.parse, urllib.request
parts = urllib.parse.urlsplit(sys.argv[1])
url = f"{parts.scheme}://{parts.netloc}/"
auth = {"Authorization": "Bearer " + urllib.parse.parse_qs(parts.query)["token"][0]}
n = 0
def get(path):
    with urllib.request.urlopen(urllib.request.Request(url + path, headers=auth), timeout=10) as r:
        return r.read()
while True:
    try:
        cps = json.loads(get("api/checkpoints"))
        get("api/job")
        if cps["history"]:
            get(f"api/checkpoints/{cps['history'][0]['id']}")
        get("metrics")
        n += 1
    except urllib.error.HTTPError as e:
        sys.exit(f"the dashboard refused the poller: HTTP {e.code} {e.reason}")
    except OSError:
        break  # the job ended
    time.sleep(1.0)  # the page's polling period
import resource
r = resource.getrusage(resource.RUSAGE_SELF)
print(n, r.ru_utime + r.ru_stime)
"""


def engine(path: str, out: str, parallelism: int, interval: float, dashboard: bool, poll: bool) -> dict[str, Any]:
    flow = Dataflow("wordcount", parallelism=parallelism)
    flow.source(TextFileSource(path)).flat_map(str.split).key_by().count_final().sink(FileSink(out), parallelism=1)
    poller: list[subprocess.Popen[str]] = []

    def start_poller(res: JobResult) -> bool:
        if poll and not poller and res.dashboard_url:
            poller.append(subprocess.Popen([sys.executable, "-c", POLLER, res.dashboard_url], stdout=subprocess.PIPE,
                                           text=True))
        return False

    t0, c0 = time.perf_counter(), _cpu()
    res = flow.run(mode="aligned", checkpoint_interval=interval, dashboard=0 if dashboard else None,
                   stop_when=start_poller)
    secs, driver_cpu = time.perf_counter() - t0, _cpu() - c0
    polls, poller_cpu = 0, 0.0
    if poller:
        counted = poller[0].communicate(timeout=60)[0]
        if poller[0].returncode != 0:
            raise SystemExit(f"the dashboard poller failed (exit {poller[0].returncode}); see its error above")
        n, cpu = counted.split()
        polls, poller_cpu = int(n), float(cpu)
    total = 0
    with open(out, encoding="utf-8") as f:
        for line in f:
            total += int(line.rsplit("\t", 1)[1])
    return {"seconds": secs, "words": total, "checkpoints": len([c for c in res.checkpoints if not c.final]),
            "polls": polls, "driver_cpu_s": driver_cpu, "poller_cpu_s": poller_cpu}


def _cpu() -> float:
    """CPU seconds this process (the driver, with its dashboard thread) has used."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return float(r.ru_utime + r.ru_stime)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--words", type=int, default=30_000_000)
    ap.add_argument("--vocabulary", type=int, default=10_000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)

    corpus = os.path.join(tempfile.gettempdir(), f"abs-engine-zipf-{args.words}-{args.vocabulary}.txt")
    if not os.path.exists(corpus):
        print(f"generating {corpus} ...", file=sys.stderr)
        write_zipf_corpus(corpus + ".tmp", args.words, args.vocabulary, seed=7)
        os.replace(corpus + ".tmp", corpus)
    out = os.path.join(tempfile.gettempdir(), "abs-engine-dashboard-bench-out.tsv")
    variants = {
        "off": (False, False),
        "on, not polled": (True, False),
        "on, polled 1/s + /metrics": (True, True),
    }
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in variants}
    for r in range(args.rounds):
        for name, (dash, poll) in variants.items():
            run = engine(corpus, out, args.parallelism, args.interval, dash, poll)
            if run["words"] != args.words:
                raise SystemExit(f"{name} counted {run['words']} words, expected {args.words}: wrong output")
            run["words_per_s"] = run["words"] / run["seconds"]
            runs[name].append(run)
            print(f"round {r + 1} {name:28} {run['seconds']:6.2f}s {run['words_per_s'] / 1e6:5.2f} M words/s "
                  f"checkpoints {run['checkpoints']} polls {run['polls']}", file=sys.stderr)

    def ratio(name: str) -> list[float]:
        return [a["seconds"] / b["seconds"] - 1 for a, b in zip(runs[name], runs["off"])]

    summary = {
        "command": "python benchmarks/dashboard_bench.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "params": vars(args) | {"out": None},
        "median_words_per_s": {k: statistics.median(x["words_per_s"] for x in v) for k, v in runs.items()},
        "overhead_per_round": {k: ratio(k) for k in runs if k != "off"},
        "overhead_median": {k: statistics.median(ratio(k)) for k in runs if k != "off"},
        # the driver's extra CPU per run against "off" in the same round, and the poller's
        "driver_cpu_extra_median_s": {k: statistics.median(a["driver_cpu_s"] - b["driver_cpu_s"]
                                                           for a, b in zip(runs[k], runs["off"]))
                                      for k in runs if k != "off"},
        "runs": runs,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dashboard.json"), "w") as f:
        json.dump(summary, f, indent=2)
    lines = [
        "# Dashboard and metrics overhead (word count)",
        "",
        f"Command: `{summary['command']}`  ",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}; {summary['when']}  ",
        f"{args.words:,} words (Zipf, {args.vocabulary:,}-word vocabulary), parallelism {args.parallelism}, aligned "
        f"checkpoints every {args.interval}s, {args.rounds} interleaved rounds (median, [min-max]).",
        "",
        "| variant | M words/s | seconds | overhead vs off (median of rounds) | driver CPU s | poller CPU s | "
        "checkpoints | polls |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, v in runs.items():
        w = [x["words_per_s"] / 1e6 for x in v]
        over = "" if k == "off" else f"{summary['overhead_median'][k]:+.1%} ({', '.join(f'{o:+.1%}' for o in ratio(k))})"
        lines.append(f"| {k} | {statistics.median(w):.2f} [{min(w):.2f}-{max(w):.2f}] | "
                     f"{statistics.median(x['seconds'] for x in v):.2f} | {over} | "
                     f"{statistics.median(x['driver_cpu_s'] for x in v):.2f} | "
                     f"{statistics.median(x['poller_cpu_s'] for x in v):.2f} | "
                     f"{statistics.median(x['checkpoints'] for x in v):.0f} | "
                     f"{statistics.median(x['polls'] for x in v):.0f} |")
    off_s = statistics.median(x["seconds"] for x in runs["off"])
    lines += ["", f"CPU, which the rounds' noise does not blur: the driver's beyond \"off\" in the same round "
              f"(median per run of about {off_s:.1f} s on {args.parallelism} workers): " + ", ".join(
                  f"{k} {v:+.3f} s" for k, v in summary["driver_cpu_extra_median_s"].items())
              + f"; the poller's own: {statistics.median(x['poller_cpu_s'] for x in runs[list(runs)[-1]]):.2f} s."]
    with open(os.path.join(args.out, "dashboard.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
