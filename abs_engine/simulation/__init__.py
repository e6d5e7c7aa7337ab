"""Deterministic simulation of the checkpoint protocol (in the spirit of FoundationDB's),
over the production task code. Run ``python3 -m abs_engine.simulation --seeds 100000``.

What runs is what a worker runs: every task is a ``runtime.task.Task`` -- frame handling,
barrier alignment, back-edge and unaligned channel-state logging, read-ahead, gathering,
snapshots in the production state-file format, control messages encoded and decoded as
over a socket -- with its channels and control link in memory (runtime/memory.py), a
manual clock and a writer that writes at once. Around it, the real CheckpointCoordinator,
the real CheckpointStorage (commit, verify, latest_valid, prune, remove_orphans_after,
read_snapshot) over a store in memory, and the production replay of a restore. No processes, sockets, threads, sleeps or wall clock: a scheduler
seeded with ``random.Random(seed)`` picks every step, so the same seed gives the same trace.

Model. Each step the scheduler picks one enabled event: a task takes the next frame of an
input it may read (not blocked by alignment, not held by the back-edge log), and sometimes
then processes what it gathered (the end of a worker's turn); a source reads a batch (or
ends); the head of a control connection is delivered (which reorders messages of
different tasks at random); the driver takes a task's message; the fake clock advances and
the coordinator polls (and each task looks at its aligned timeout); or a crash (also, in
some seeds, right after a checkpoint completes, like chaos.on_checkpoint). Half the seeds
weight channels and connections unevenly (buggify: barriers overtake, checkpoints pile up,
acks come late); each seed also draws its input, batch sizes, how often a task flushes
what it gathered, checkpoint interval, timeout, max in flight, retained checkpoints and up
to 3 crashes. A crash is a global failover: everything in flight and every task's memory
is lost; the newest checkpoint latest_valid() returns is restored (state, source offsets,
channel state replayed before new input), orphans are removed and a new coordinator
starts with the next id after those on disk. A sink's output (the "file") survives
crashes; the sink commits by two-phase commit like operators/files.py.

Invariants checked (a violation raises SimFailure; the CLI prints a reproduction line):
- at the end, the sink's committed output equals a batch computation of the same input, as
  a multiset (exactly once): for ``dag*`` every (key, running count) once; for ``cycle``
  every token once, leaving the loop with its initial amount;
- in every completed checkpoint: it has an acknowledgement of this attempt from every task
  and verifies in storage; ids complete in increasing order; storage then holds exactly
  the newest ``retain`` completed checkpoints (retention); the cut is consistent --
  dag: the counters' counts are exactly the records below the sources' offsets and the
  sink holds one record per count; cycle (conservation): money in the step tasks'
  balances + money of the records in back-edge logs == money of the records below the
  source's offset, and tokens logged + tokens staged or published by the sink == tokens
  emitted (channel state of every input counts too in the unaligned modes);
- the coordinator answers no acknowledgement UNKNOWN or DUPLICATE; no record arrives on a
  back-edge after EndLoop (the task's own LoopNotQuiet);
- recovery restores the newest checkpoint ever completed;
- the run terminates (a step budget) and never gets stuck with nothing to do. When
  nothing is enabled the clock jumps to coordinator.deadline(), at most 0.1 s, as the
  real driver's select timeout does.

Simplifications versus a job: a task is one operator and one subtask (no chains); channels
are unbounded (a worker always reads back-edges, so bounded ones cannot deadlock); a
snapshot file is written and acknowledged at once; no stop-the-world mode, no generation
fencing (stale messages die with the crash), no corrupt files; the driver routes messages
to the coordinator with checkpoint/routing.py, as the job's attempt driver does. Storage
(``--storage``, simulation/storage.py): the real CheckpointStorage over ``memory`` (the
default: the memory store, a CheckpointStore of bytes in a dict) or ``disk`` (the local
store, in a temporary directory).

Modes (``--mode``): ``aligned`` (ABS), ``unaligned`` (every task triggered at once,
snapshots at the trigger or the first barrier, logs every input until its barrier:
Chandy-Lamport), ``timeout`` (aligned, but a task whose alignment lasts longer than a
drawn aligned timeout snapshots unaligned; its barrier makes its consumers do the same).

Deliberate bugs (``--bug``), to prove the oracle can fail: ``non-transactional-sink``
(the sink appends at once and restores without truncating), and mutations of the
production code (simulation/mutations.py): ``no-align`` (inputs blocked by alignment are
read), ``no-replay`` (a restore forgets its channel state), ``no-channel-state``
(unaligned snapshots log back-edges only), ``barrier-before-gathered`` (a barrier is
handled before the records gathered ahead of it are processed), ``retain-one-fewer``
(retention keeps one checkpoint fewer than it must, the newest always: only the
retention check sees it).
"""

from .mutations import BUGS, MUTATIONS
from .oracle import SimFailure
from .seeds import main, reproduction, run_seed, topology_for
from .sim import MAX_STEPS, MODES, Sim
from .topology import TOPOLOGIES

__all__ = ["BUGS", "MAX_STEPS", "MODES", "MUTATIONS", "Sim", "SimFailure", "TOPOLOGIES", "main", "reproduction",
           "run_seed", "topology_for"]
