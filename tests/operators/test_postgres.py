"""PostgresSink against a real PostgreSQL server (tests/operators/postgres_server.py).

Exactly once: append and upsert tables equal the batch oracle after restores in process,
after SIGKILLs of workers at random moments, and after a SIGKILL at each step of a commit
(before its transaction, inside it before COMMIT, after it); a replayed epoch is skipped; a
sink of an older attempt cannot commit. Bad input (an unreachable server, wrong credentials,
a missing table or column, an upsert without a unique key) fails before the job starts,
with the problem named. Every check reads the table with psycopg, not with the sink."""

from __future__ import annotations

import collections
import itertools
import os
from pathlib import Path
from typing import Any

import pytest

from abs_engine import Dataflow
from abs_engine.errors import FencedOut
from abs_engine.testing import GatedSource, KillOnCheckpoints, TestingSource, fail_at
from operators.base import OperatorContext
from operators.postgres import PostgresProblem, PostgresSink, PostgresSinkError

from .postgres_server import Server, postgres  # noqa: F401 - the fixture
from .sink_kills import KillAtStep, run_killing_drivers

_names = itertools.count()

#: Real external systems (a server, a table format): the whole suite runs them, not the fast tier.
pytestmark = pytest.mark.slow


def fresh_table(pg: Server, upsert: bool = False) -> str:
    name = f"t{os.getpid()}_{next(_names)}"
    pg.query(f"CREATE TABLE {name} (k text {'PRIMARY KEY' if upsert else ''}, n bigint, label text)")
    return name


def events(n: int, keys: int = 50) -> list[tuple[str, int, str]]:
    return [(f"k{i % keys}", i, f"e{i}") for i in range(n)]


def appended(pg: Server, table: str) -> collections.Counter[tuple[Any, ...]]:
    return collections.Counter(pg.query(f"SELECT k, n, label FROM {table}"))


def flow_into(sink: PostgresSink, items: list[Any], *maps: Any, parallelism: int = 2, name: str = "pgjob",
              batch_size: int = 100) -> Dataflow:
    flow = Dataflow(name)
    s = flow.source(TestingSource(items, batch_size=batch_size), "read", parallelism=parallelism)
    for fn in maps:
        s = s.map(fn)
    s.key_by(lambda r: r[0]).map(lambda r: r, "route", parallelism=2).sink(sink, "pg", parallelism=2)
    return flow


def test_append_in_process_with_a_crash_equals_the_oracle(postgres: Server, tmp_path: Path) -> None:
    table = fresh_table(postgres)
    items = events(3_000)
    res = flow_into(PostgresSink(postgres.dsn(), table, ["k", "n", "label"]), items, fail_at(1_200)).run(
        executor="inprocess", checkpoint_interval=0.01, checkpoint_dir=str(tmp_path / "ck"))
    assert res.restarts == 1
    assert appended(postgres, table) == collections.Counter(items)
    # the progress table: one row per sink subtask, at the job's last checkpoint
    rows = postgres.query("SELECT subtask, checkpoint FROM abs_engine_sink_progress WHERE target = %s", (table,))
    assert sorted(r[0] for r in rows) == [0, 1] and all(r[1] > 0 for r in rows)


def test_upsert_keeps_the_last_row_of_each_key(postgres: Server, tmp_path: Path) -> None:
    table = fresh_table(postgres, upsert=True)
    items = events(2_000, keys=37)
    sink = PostgresSink(postgres.dsn(), table, ["k", "n", "label"], mode="upsert", key=["k"])
    flow_into(sink, items, fail_at(900), parallelism=1).run(
        executor="inprocess", checkpoint_interval=0.01, checkpoint_dir=str(tmp_path / "ck"))
    last = {k: (k, n, label) for k, n, label in items}
    assert sorted(postgres.query(f"SELECT k, n, label FROM {table}")) == sorted(last.values())


def test_dict_records_and_to_row(postgres: Server, tmp_path: Path) -> None:
    table = fresh_table(postgres)
    items = [{"k": f"k{i}", "n": i, "label": None} for i in range(300)]
    flow = Dataflow("dicts")
    flow.source(TestingSource(items), "read").sink(PostgresSink(postgres.dsn(), table, ["k", "n", "label"]), "pg")
    flow.run(executor="inprocess", checkpoint_dir=str(tmp_path / "ck"))
    assert sorted(postgres.query(f"SELECT k, n, label FROM {table}")) == sorted((f"k{i}", i, None) for i in range(300))


def ctx(attempt: int, restored: bool, job: str = "fence") -> OperatorContext:
    return OperatorContext("pg", 0, 1, attempt, restored, job=job)


def test_an_older_attempt_cannot_commit_and_a_replay_is_skipped(postgres: Server) -> None:
    table = fresh_table(postgres)
    cols = ["k", "n", "label"]
    old = PostgresSink(postgres.dsn(), table, cols)
    old.check()
    old.open(ctx(0, False))
    old.process([("a", 1, "x"), ("b", 2, "y")])
    state = old.snapshot(1)
    old.notify_checkpoint_complete(1)
    old.process([("c", 3, "z")])
    state2 = old.snapshot(2)  # checkpoint 2 completes, but this worker is lost before its commit
    # the next attempt restores checkpoint 2: epoch 1 is committed already (skipped), epoch 2 is not
    new = PostgresSink(postgres.dsn(), table, cols)
    new.open(ctx(1, True))
    new.restore(state2)
    assert appended(postgres, table) == collections.Counter([("a", 1, "x"), ("b", 2, "y"), ("c", 3, "z")])
    # the old worker wakes up: its commit of epoch 2 is refused, nothing written twice
    with pytest.raises(FencedOut, match="no longer owns"):
        old.notify_checkpoint_complete(2)
    # restoring checkpoint 1 (an older checkpoint or savepoint) into a table that holds
    # checkpoint 2 would lose or repeat rows: refused, nothing written
    again = PostgresSink(postgres.dsn(), table, cols)
    again.open(ctx(2, True))
    with pytest.raises(PostgresSinkError) as info:
        again.restore(state)
    assert info.value.problem is PostgresProblem.AHEAD_OF_CHECKPOINT and "newer than the checkpoint restored" in str(
        info.value)
    assert sum(appended(postgres, table).values()) == 3
    for s in (old, new, again):
        s.close()


def test_a_record_that_is_not_a_row_fails_naming_it(postgres: Server, tmp_path: Path) -> None:
    table = fresh_table(postgres)
    flow = Dataflow("bad-row")
    flow.source(TestingSource([("a", 1, "x"), ("b", 2)]), "read").sink(
        PostgresSink(postgres.dsn(), table, ["k", "n", "label"]), "pg")
    with pytest.raises(Exception, match=r"\('b', 2\)") as info:
        flow.run(executor="inprocess", checkpoint_dir=str(tmp_path / "ck"))
    assert "2 values for the 3 columns" in str(info.value)


def test_a_late_open_of_an_older_attempt_cannot_take_the_progress_row_back(postgres: Server,
                                                                           tmp_path: Path) -> None:
    """A worker of a replaced attempt that reaches open() late (stopped, slow) is fenced there:
    it neither takes ownership back nor resets the count (a fresh start's open would)."""
    from abs_engine.checkpoint.fence import Fence, advance

    table, cols = fresh_table(postgres), ["k", "n", "label"]
    advance(str(tmp_path), "attempt-1")
    new = PostgresSink(postgres.dsn(), table, cols)
    new.check()
    new.open(OperatorContext("pg", 0, 1, 1, False, fence=Fence(str(tmp_path), "attempt-1"), job="late"))
    new.process([("a", 1, "x")])
    new.snapshot(1)
    new.notify_checkpoint_complete(1)
    late = PostgresSink(postgres.dsn(), table, cols)
    with pytest.raises(FencedOut):
        late.open(OperatorContext("pg", 0, 1, 0, False, fence=Fence(str(tmp_path), "attempt-0"), job="late"))
    assert postgres.query("SELECT checkpoint, owner FROM abs_engine_sink_progress WHERE target = %s",
                          (table,)) == [(1, "attempt-1")]
    new.process([("b", 2, "y")])
    new.snapshot(2)
    new.notify_checkpoint_complete(2)  # still the owner: it commits
    assert sum(appended(postgres, table).values()) == 2
    new.close()
    late.close()


def test_json_values_and_an_identity_key_and_a_refused_row(postgres: Server, tmp_path: Path) -> None:
    """A dict value goes into a jsonb column; an upsert fills a table whose identity id it
    does not carry; a row the server refuses fails the job at once, naming the table, the
    checkpoint and the server's words, instead of failing every restart the same way."""
    table = f"j{os.getpid()}_{next(_names)}"
    postgres.query(f"CREATE TABLE {table} (id bigint GENERATED ALWAYS AS IDENTITY, k text UNIQUE, n bigint, doc jsonb)")
    items = [(f"k{i % 5}", i, {"i": i, "tags": ["a", "b"]}) for i in range(50)]
    flow = Dataflow("json")
    flow.source(TestingSource(items), "read").sink(
        PostgresSink(postgres.dsn(), table, ["k", "n", "doc"], mode="upsert", key=["k"]), "pg")
    flow.run(executor="inprocess", checkpoint_dir=str(tmp_path / "ck"))
    last = {k: (k, n, doc) for k, n, doc in items}
    assert sorted(postgres.query(f"SELECT k, n, doc FROM {table}")) == sorted(last.values())
    bad = Dataflow("refused")
    bad.source(TestingSource([("a", 1, None), ("b", "not a number", None)]), "read").sink(
        PostgresSink(postgres.dsn(), table, ["k", "n", "doc"]), "pg")
    with pytest.raises(Exception) as info:
        bad.run(executor="inprocess", checkpoint_dir=str(tmp_path / "ck2"), restart_attempts=3)
    text = str(info.value)
    assert "refused a row" in text and table in text and "not a number" in text


@pytest.mark.parametrize("problem,make", [
    (PostgresProblem.UNREACHABLE, lambda pg, t: (pg.dsn().replace(str(pg.port), str(free_port())), t, ["k"], {})),
    (PostgresProblem.UNREACHABLE, lambda pg, t: (pg.dsn(password="s3cr%zzet") + "&x", t, ["k"], {})),
    (PostgresProblem.AUTHENTICATION, lambda pg, t: (pg.dsn(password="wrong"), t, ["k"], {})),
    (PostgresProblem.MISSING_TABLE, lambda pg, t: (pg.dsn(), "no_such_table", ["k"], {})),
    (PostgresProblem.SCHEMA_MISMATCH, lambda pg, t: (pg.dsn(), t, ["k", "price"], {})),
    (PostgresProblem.NO_UNIQUE_KEY, lambda pg, t: (pg.dsn(), t, ["k", "n"], {"mode": "upsert", "key": ["n"]})),
])
def test_bad_input_fails_before_the_job_starts_naming_the_fix(postgres: Server, tmp_path: Path,
                                                             problem: PostgresProblem, make: Any) -> None:
    table = fresh_table(postgres, upsert=True)
    dsn, target, columns, kw = make(postgres, table)
    flow = Dataflow("bad")
    flow.source(TestingSource([("a", 1)]), "read").sink(PostgresSink(dsn, target, columns, connect_timeout=3, **kw), "pg")
    with pytest.raises(PostgresSinkError) as info:
        flow.run(executor="inprocess", checkpoint_dir=str(tmp_path / "ck"))
    assert info.value.problem is problem and info.value.fatal
    text = str(info.value)
    assert "wrong" not in text and "s3cr" not in text and "zzet" not in text  # no password in messages
    assert any(w in text for w in ("start the server", "fix the user", "create it", "fix columns",
                                   "add a primary key", "give a libpq string"))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KillingPostgresSink(KillAtStep, PostgresSink):
    pass


def gated_flow(sink: PostgresSink, items: list[Any], gate: Path, hold_after: int, parallelism: int,
               name: str) -> Dataflow:
    flow = Dataflow(name)
    (flow.source(GatedSource(TestingSource(items, batch_size=500), gate, after=hold_after), "read",
                 parallelism=parallelism)
     .key_by(lambda r: r[0]).map(lambda r: r, "route", parallelism=2).sink(sink, "pg", parallelism=2))
    return flow


@pytest.mark.parametrize("step", ["before", "inside", "after"])
def test_a_sigkill_at_each_step_of_a_commit_loses_and_duplicates_nothing(postgres: Server, tmp_path: Path,
                                                                        step: str) -> None:
    table = fresh_table(postgres)
    items = events(20_000)
    gate = tmp_path / "gate"
    sink = KillingPostgresSink(postgres.dsn(), table, ["k", "n", "label"], step=step, gate=str(gate))
    res = gated_flow(sink, items, gate, 4_000, 2, f"step-{step}").run(
        checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"))
    assert res.restarts >= 1 and gate.exists()
    assert appended(postgres, table) == collections.Counter(items)


@pytest.mark.parametrize("upsert", [False, True])
def test_sigkills_of_workers_leave_the_table_equal_to_the_oracle(postgres: Server, tmp_path: Path,
                                                                upsert: bool) -> None:
    table = fresh_table(postgres, upsert=upsert)
    items = events(40_000, keys=500)
    kw: dict[str, Any] = {"mode": "upsert", "key": ["k"]} if upsert else {}
    chaos = KillOnCheckpoints([2, 5], seed=11, open_gate=tmp_path / "gate")
    # (upsert: one source subtask, so that a key's rows reach its sink subtask in the list's order)
    res = gated_flow(PostgresSink(postgres.dsn(), table, ["k", "n", "label"], **kw), items, tmp_path / "gate",
                     5_000, 1 if upsert else 2, "kills").run(
        checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"), chaos=chaos)
    assert len(chaos.killed) == 2 and res.restarts == 2
    if upsert:
        last = {k: (k, n, label) for k, n, label in items}
        assert sorted(postgres.query(f"SELECT k, n, label FROM {table}")) == sorted(last.values())
    else:
        assert appended(postgres, table) == collections.Counter(items)


@pytest.mark.timeout(180)
def test_sigkills_of_the_supervised_driver_leave_the_table_equal_to_the_oracle(postgres: Server,
                                                                              tmp_path: Path) -> None:
    """The driver SIGKILLed twice, each time once a newer checkpoint completed (the source
    held by its gate meanwhile); its workers go with it, a new driver resumes, and a worker
    of a dead driver that still commits is fenced. The table equals the input."""
    table = fresh_table(postgres)
    items = events(30_000)
    gate, ck = tmp_path / "gate", str(tmp_path / "ck")
    flow = gated_flow(PostgresSink(postgres.dsn(), table, ["k", "n", "label"]), items, gate, 4_000, 2, "driver")
    run_killing_drivers(flow, ck, gate)
    assert appended(postgres, table) == collections.Counter(items)
