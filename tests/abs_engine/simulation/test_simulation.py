"""The deterministic simulation of the checkpoint protocol (abs_engine/simulation/), over the
production task code: 1,002 seeds over the three topologies pass, the oracle catches each
deliberate bug (mutations of the production code among them), the
same seed gives the same trace (also in another process, with another hash seed), and
the runs exercise what they claim to (crashes, restores, aborts, back-edge logs). The
unaligned modes (every task snapshots at once and logs every input's channel state; or an
aligned checkpoint that turns unaligned after a timeout) run the same seeds, with the cut
checks counting channel state."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from abs_engine import simulation
from abs_engine.checkpoint.storage import CheckpointStorage
from abs_engine.simulation import oracle
from abs_engine.simulation.storage import MemoryStore
from abs_engine.runtime.memory import MemoryLink
from abs_engine.runtime.task import Task
from abs_engine.simulation import BUGS, MODES, MUTATIONS, TOPOLOGIES, Sim, SimFailure, reproduction, run_seed

SEEDS_PER_TOPOLOGY = 334  # 1,002 seeds in all: a few seconds


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_seed_keeps_every_invariant(topology: str) -> None:
    failures = [f"seed={s}: {err}; reproduce: {reproduction(s, topology)}"
                for s in range(SEEDS_PER_TOPOLOGY) if (err := run_seed(s, topology)) is not None]
    assert not failures, "\n".join(failures[:5])


@pytest.mark.parametrize("mode", [m for m in MODES if m != "aligned"])
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_unaligned_checkpoints_keep_every_invariant(mode: str, topology: str) -> None:
    failures = [f"seed={s}: {err}; reproduce: {reproduction(s, topology, mode=mode)}"
                for s in range(SEEDS_PER_TOPOLOGY // 2) if (err := run_seed(s, topology, mode=mode)) is not None]
    assert not failures, "\n".join(failures[:5])


@pytest.mark.parametrize("mode", [m for m in MODES if m != "aligned"])
def test_unaligned_runs_persist_channel_state_and_the_oracle_needs_it(mode: str) -> None:
    total: Counter[str] = Counter()
    for s in range(60):
        sim = Sim(s, TOPOLOGIES[s % 3], mode=mode)
        sim.run()
        total.update(sim.stats)
    # Unaligned snapshots happened, and records in flight on regular channels were persisted.
    assert total["unaligned"] >= 100 and total["channel_state"] >= 100 and total["restored"] >= 5, total
    # Without the regular inputs' channel state the cuts are not consistent.
    caught = [s for s in range(40) if run_seed(s, TOPOLOGIES[s % 3], bug="no-channel-state", mode=mode)]
    assert len(caught) >= 10, caught


def test_the_real_checkpoint_storage_on_disk_too() -> None:
    for s in range(12):
        topology = TOPOLOGIES[s % 3]
        assert run_seed(s, topology, storage="disk") is None, reproduction(s, topology, storage="disk")


#: Every deliberate bug, where it shows: (topology, mode, seeds within which it must be caught).
WHERE = {
    "non-transactional-sink": ("dag", "aligned", 30),  # duplicates after a restore
    "no-align": ("dag3", "aligned", 30),  # records behind a barrier counted in the snapshot
    "no-replay": ("cycle", "aligned", 150),  # tokens in flight round the loop lost at a restore
    "no-channel-state": ("cycle", "unaligned", 30),  # records in flight on regular inputs lost
    "barrier-before-gathered": ("dag", "aligned", 30),  # records before a barrier counted after it
    "retain-one-fewer": ("dag", "aligned", 30),  # the production retention deletes a checkpoint it must keep
}


def test_every_deliberate_bug_has_a_test() -> None:
    assert set(WHERE) == set(BUGS) - {"none"}
    assert set(MUTATIONS) <= set(WHERE)


@pytest.mark.parametrize("bug", sorted(WHERE))
def test_the_oracle_catches_a_deliberate_bug(bug: str) -> None:
    topology, mode, within = WHERE[bug]
    caught = next(((s, err) for s in range(within)
                   if (err := run_seed(s, topology, bug=bug, mode=mode)) is not None), None)
    assert caught is not None, f"bug {bug} went unnoticed for {within} seeds"
    seed, err = caught
    assert ("not exactly once" in err or "consistent cut" in err or "conservation" in err
            or "tokens logged" in err or err.startswith("retention:")), err
    # The failure reproduces, with the same message.
    assert run_seed(seed, topology, bug=bug, mode=mode) == err


def test_a_mutation_lasts_only_as_long_as_its_seed() -> None:
    """The production code is whole again after a mutated seed (and a failed one)."""
    before = {name: getattr(owner, attr) for name, (_, owner, attr, _) in MUTATIONS.items()}
    for bug in MUTATIONS:
        run_seed(0, "dag", bug=bug)
    assert {name: getattr(owner, attr) for name, (_, owner, attr, _) in MUTATIONS.items()} == before
    assert run_seed(0, "dag") is None


def test_the_tasks_are_the_production_tasks() -> None:
    """No mirror: the simulation's tasks are runtime.task.Task, over in-memory links."""
    sim = Sim(3, "cycle")
    assert {type(t) for t in sim.tasks.values()} == {Task}
    assert all(isinstance(ch.wire, MemoryLink) for t in sim.tasks.values() for ch in t.inputs.values())


def test_the_storage_is_the_production_storage() -> None:
    """No mirror: commit, verification, retention and the choice of checkpoint are
    CheckpointStorage's own, over the memory store (or a directory)."""
    sim = Sim(3, "dag")
    assert type(sim.storage) is CheckpointStorage and isinstance(sim.storage.store, MemoryStore)
    assert {"prune", "verify", "latest_valid", "write_metadata"}.isdisjoint(vars(MemoryStore))
    sim.run()
    assert sim.storage.completed_ids() == sim.completed[-sim.storage.retain:]


def test_same_seed_same_trace() -> None:
    for topology in TOPOLOGIES:
        digests = {Sim(7, topology).run() for _ in range(3)}
        assert len(digests) == 1
    assert len({Sim(s, "cycle").run() for s in range(10)}) == 10


def test_same_trace_in_another_process_with_another_hash_seed() -> None:
    """Nothing the tasks write depends on the hash seed (it caught the production task
    writing a state file's channel logs in a set's iteration order)."""
    cases = [(11, "cycle", "aligned"), (5, "dag", "unaligned"), (7, "dag3", "timeout"), (2, "cycle", "unaligned")]
    code = ("from abs_engine.simulation import Sim; "
            f"print(' '.join(Sim(s, t, mode=m).run() for s, t, m in {cases!r}))")
    digests = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": h},
                              capture_output=True, text=True, check=True).stdout.strip() for h in ("1", "2", "12345")}
    assert digests == {" ".join(Sim(s, t, mode=m).run() for s, t, m in cases)}


def test_the_runs_exercise_the_protocol() -> None:
    """Guards against a simulator that passes because it does nothing interesting."""
    total: Counter[str] = Counter()
    for topology in TOPOLOGIES:
        for s in range(60):
            sim = Sim(s, topology)
            sim.run()
            total.update(sim.stats)
            if topology == "cycle":
                total["cycle_logged"] += sim.stats["logged"]
    assert total["crashes"] >= 30 and total["restored"] >= 15  # failovers, many from a checkpoint
    assert total["completed"] >= 3 * 180  # more than the final checkpoint per run on average
    assert total["aborted"] >= 10 and total["discarded"] >= 10  # timeouts, late acks
    assert total["cycle_logged"] >= 20  # back-edge logs hold records in flight
    assert total["markers"] >= 180  # latency markers travel among the records and barriers


def test_cli_prints_a_reproduction_line_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulation.main(["--seeds", "3", "--progress-every", "3"]) == 0
    status = simulation.main(["--seed", "0", "--topology", "dag", "--bug", "non-transactional-sink"])
    out = capsys.readouterr().out
    assert status == 1
    assert out.startswith("FAILED seed=0 topology=dag: sink output is not exactly once")
    assert out.rstrip().endswith(
        "reproduce: python3 -m abs_engine.simulation --seed 0 --topology dag --bug non-transactional-sink")


def test_a_violation_is_a_sim_failure() -> None:
    sim = Sim(0, "dag")
    sim.run()
    sim.output.append((0, 99))
    with pytest.raises(SimFailure, match="not exactly once"):
        oracle.check_final(sim)
