"""PostgresCDCSource against a real PostgreSQL server (tests/operators/postgres_server.py),
replicating a table into another through PostgresSink (upsert, deletes applied).

Exactly once: inserts, updates, deletes, key moves and multi-statement transactions made
while the job reads the snapshot and the stream, while its workers are SIGKILLed at random
checkpoints, while its driver is SIGKILLed, and while it is down: after the resume the
replica equals the source table (read back with psycopg), value for value across types.
Bad input (a missing table, no replica identity, a missing publication, a slot this source
did not make, a dropped slot, a slot moved past the checkpoint) is a typed error naming the
fix."""

from __future__ import annotations

import collections
import itertools
import os
import random
from pathlib import Path
from typing import Any

import psycopg
import pytest

from abs_engine import Dataflow
from abs_engine.errors import JobFailed
from abs_engine.testing import CapturingSink, KillOnCheckpoints, fail_at
from operators.base import OperatorContext
from operators.postgres import PostgresSink
from operators.postgres_cdc import ChangeKind, PostgresCDCSource, stop_stream
from operators.postgres_schema import PostgresProblem, PostgresSourceError

from .postgres_server import Server, postgres  # noqa: F401 - the fixture
from .test_postgres import free_port

pytestmark = pytest.mark.slow

_names = itertools.count()
COLUMNS = ["id", "v", "n", "j", "ts", "b", "f", "ok", "tags"]
SCHEMA = ("(id int PRIMARY KEY, v text, n numeric(12, 2), j jsonb, ts timestamptz, b bytea, f float8, ok boolean, "
          "tags int[])")


def audited(pg: Server, table: str) -> str:
    """An audit log of ``table`` kept by a trigger (an oracle independent of replication):
    every row change from now on, as (kind, id, v) in commit order within a transaction."""
    log = f"audit_{table}"
    pg.query(f"CREATE TABLE {log} (seq bigserial, op text, old_id int, new_id int, v text)")
    pg.query(f"CREATE FUNCTION {log}_f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
             f"INSERT INTO {log} (op, old_id, new_id, v) VALUES (TG_OP, CASE WHEN TG_OP <> 'INSERT' THEN OLD.id END, "
             "CASE WHEN TG_OP <> 'DELETE' THEN NEW.id END, CASE WHEN TG_OP <> 'DELETE' THEN NEW.v END); "
             "RETURN NULL; END $$")
    pg.query(f"CREATE TRIGGER {log}_t AFTER INSERT OR UPDATE OR DELETE ON {table} FOR EACH ROW EXECUTE FUNCTION "
             f"{log}_f()")
    return log


def expected_changes(pg: Server, log: str) -> collections.Counter[tuple[str, Any, Any]]:
    """The changes the stream must carry, from the audit log: (kind, key, v); a key move is a
    delete of the old key and an insert of the new."""
    out: collections.Counter[tuple[str, Any, Any]] = collections.Counter()
    for op, old, new, v in pg.query(f"SELECT op, old_id, new_id, v FROM {log}"):
        if op == "UPDATE" and old != new:
            out.update([("delete", old, None), ("insert", new, v)])
        else:
            out[(op.lower(), old if op == "DELETE" else new, v)] += 1
    return out


def tables(pg: Server, rows: int = 3_000) -> tuple[str, str, str]:
    """(source table, replica, a slot name): the source filled with ``rows`` rows."""
    n = f"{os.getpid()}_{next(_names)}"
    src, dst = f"src{n}", f"dst{n}"
    pg.query(f"CREATE TABLE {src} {SCHEMA}")
    pg.query(f"CREATE TABLE {dst} {SCHEMA}")
    pg.query(f"INSERT INTO {src} SELECT g, 'v' || g, g * 1.25, jsonb_build_object('g', g, 'l', jsonb_build_array(g)), "
             f"'2026-01-01'::timestamptz + g * interval '1 minute', int4send(g), g / 7.0, g % 2 = 0, ARRAY[g, -g] "
             f"FROM generate_series(1, {rows}) g")
    return src, dst, f"slot{n}"


def churn(pg: Server, table: str, rng: random.Random, rounds: int, first_id: int) -> int:
    """``rounds`` rounds of changes (each a few transactions: updates, deletes, inserts, a
    key moved, one transaction of several statements); returns the next free id."""
    nxt = first_id
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        for _ in range(rounds):
            ids = [r[0] for r in conn.execute(f"SELECT id FROM {table} ORDER BY random() LIMIT 30").fetchall()]
            if len(ids) < 10:
                ids += [nxt + 1, nxt + 2]
            conn.execute(f"UPDATE {table} SET v = v || '+', n = n + 1, j = j || '{{\"u\": 1}}', ok = NOT ok "
                         "WHERE id = ANY(%s)", (ids[:10],))
            conn.execute(f"DELETE FROM {table} WHERE id = ANY(%s)", (ids[10:15],))
            conn.execute(f"INSERT INTO {table} (id, v, n, ts, f, tags) SELECT g, 'new', 0.5, now(), 'Infinity', '{{}}' "
                         "FROM generate_series(%s::int, %s::int) g", (nxt, nxt + 9))
            nxt += 10
            conn.execute(f"UPDATE {table} SET id = %s WHERE id = %s", (nxt, ids[15]))  # the key moves
            nxt += 1
            with conn.transaction():
                conn.execute(f"UPDATE {table} SET v = NULL, b = NULL WHERE id = ANY(%s)", (ids[16:20],))
                conn.execute(f"DELETE FROM {table} WHERE id = ANY(%s)", (ids[20:22],))
                conn.execute(f"INSERT INTO {table} (id, v) VALUES (%s, 'in a transaction')", (nxt,))
                conn.execute(f"UPDATE {table} SET v = 'changed twice' WHERE id = %s", (nxt,))
            nxt += 1
            if rng.random() < 0.3:
                conn.execute(f"DELETE FROM {table} WHERE id = %s", (nxt - 1,))
    return nxt


def stop(pg: Server, slot: str) -> None:
    """End the stream here, once the job has made its slot (a marker before it is never read)."""
    from tests.abs_engine.executors.procs import wait_for

    wait_for(lambda: pg.query("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)), 60, "the slot")
    stop_stream(pg.dsn(), slot)


def assert_replica(pg: Server, src: str, dst: str) -> None:
    a = pg.query(f"SELECT * FROM {src} ORDER BY id")
    b = pg.query(f"SELECT * FROM {dst} ORDER BY id")
    assert len(a) == len(b) and a == b


def replication(pg: Server, src: str, dst: str, slot: str, staging: Path, name: str, *maps: Any,
                capture: CapturingSink | None = None) -> Dataflow:
    flow = Dataflow(name)
    s = flow.source(PostgresCDCSource(pg.dsn(), [src], slot, staging), "cdc")
    for fn in maps:
        s = s.map(fn)
    if capture is not None:
        s.sink(capture, "every-change")
    s.key_by(lambda c: c.key["id"]).sink(PostgresSink(pg.dsn(), dst, COLUMNS, mode="upsert", key=["id"]), "pg",
                                         parallelism=2)
    return flow


def test_snapshot_and_stream_replicate_exactly_through_a_crash_in_process(postgres: Server, tmp_path: Path) -> None:
    from tests.abs_engine.executors.procs import run_in_thread

    src, dst, slot = tables(postgres)
    flow = replication(postgres, src, dst, slot, tmp_path / "staging", "cdc-inprocess", fail_at(1_800))
    t, box = run_in_thread(lambda: flow.run(executor="inprocess", checkpoint_interval=0.05,
                                            checkpoint_dir=str(tmp_path / "ck")))
    try:
        churn(postgres, src, random.Random(1), 15, 10_000)
    finally:
        stop(postgres, slot)
        t.join(120)
    assert "error" not in box, box.get("error")
    assert box["result"].restarts == 1
    assert_replica(postgres, src, dst)
    # the slot moved on with the checkpoints, past its consistent point: the WAL before may go
    from abs_engine import fs
    from operators import pgoutput
    from operators.postgres_slot import MANIFEST, Manifest

    start = Manifest.unpack(fs.open_dir(str(tmp_path / "staging")).read((MANIFEST,), 1 << 20), "manifest").lsn
    confirmed = postgres.query("SELECT confirmed_flush_lsn > %s::pg_lsn FROM pg_replication_slots WHERE "
                               "slot_name = %s", (pgoutput.lsn_text(start), slot))
    assert confirmed == [(True,)]


@pytest.mark.timeout(240)
def test_sigkills_of_workers_while_tables_change(postgres: Server, tmp_path: Path) -> None:
    from tests.abs_engine.executors.procs import run_in_thread, wait_for

    src, dst, slot = tables(postgres, rows=20_000)
    gate = tmp_path / "kills-done"
    chaos = KillOnCheckpoints([2, 4, 7], seed=5, open_gate=gate)
    capture = CapturingSink(tmp_path / "changes")
    flow = replication(postgres, src, dst, slot, tmp_path / "staging", "cdc-kills", capture=capture)
    t, box = run_in_thread(lambda: flow.run(checkpoint_interval=0.1, checkpoint_dir=str(tmp_path / "ck"),
                                            chaos=chaos, restart_delay=0.1))
    rng = random.Random(2)
    log = audited(postgres, src)
    nxt, rounds = 100_000, 0
    try:
        wait_for(lambda: postgres.query("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)), 60,
                 "the slot")  # (from here on every change is in the stream, none in the snapshot)
        while not gate.exists() and rounds < 400:  # the table changes under every kill
            nxt, rounds = churn(postgres, src, rng, 1, nxt), rounds + 1
        wait_for(gate.exists, 120, "the kills")  # (the stream has no end before stop_stream)
        churn(postgres, src, rng, 3, nxt)
    finally:
        stop(postgres, slot)
        t.join(180)
    assert "error" not in box, box.get("error")
    assert len(chaos.killed) == 3 and box["result"].restarts >= 3
    assert_replica(postgres, src, dst)
    # every change exactly once: the snapshot's rows, and no change of the stream twice
    changes = capture.records()
    assert sum(c.kind is ChangeKind.SNAPSHOT for c in changes) == 20_000
    seen = collections.Counter((c.kind, c.lsn, repr(c.row), repr(c.key)) for c in changes)
    assert max(seen.values()) == 1 and len(changes) > 20_000 + 10 * rounds
    # and the stream's changes are exactly those the audit trigger logged: none lost, none twice
    streamed = collections.Counter((c.kind.value, c.key["id"], (c.row or {}).get("v")) for c in changes
                                   if c.kind is not ChangeKind.SNAPSHOT)
    assert streamed == expected_changes(postgres, log)


@pytest.mark.timeout(240)
def test_changes_while_the_job_is_down_and_driver_kills(postgres: Server, tmp_path: Path) -> None:
    """The job fails (no restarts left) while the table changes; more changes while it is down;
    then a supervised resume whose driver is SIGKILLed twice. The replica equals the table."""
    from tests.abs_engine.executors.procs import run_in_thread
    from tests.abs_engine.executors.test_supervisor import kill_drivers

    src, dst, slot = tables(postgres, rows=5_000)
    ck, staging = str(tmp_path / "ck"), tmp_path / "staging"
    rng = random.Random(3)
    chaos = KillOnCheckpoints([3], seed=1)
    t, box = run_in_thread(lambda: replication(postgres, src, dst, slot, staging, "cdc-down").run(
        checkpoint_interval=0.1, checkpoint_dir=ck, chaos=chaos, restart_attempts=0))
    nxt = 200_000
    while t.is_alive():  # changes while it runs, until the kill brings it down
        nxt = churn(postgres, src, rng, 1, nxt)
    assert isinstance(box.get("error"), JobFailed)
    nxt = churn(postgres, src, rng, 8, nxt)  # down
    t, box = run_in_thread(lambda: replication(postgres, src, dst, slot, staging, "cdc-down").run(
        supervise=True, resume=True, checkpoint_interval=0.05, checkpoint_dir=ck, restart_delay=0.2,
        driver_restarts=3))
    try:
        kill_drivers(ck, 2)
        churn(postgres, src, rng, 4, nxt)
    finally:
        stop(postgres, slot)
        t.join(180)
    assert "error" not in box, box.get("error")
    assert box["result"].driver_crashes == ["killed by signal 9"] * 2
    assert_replica(postgres, src, dst)


def fails(pg: Server, tmp_path: Path, source: PostgresCDCSource) -> PostgresSourceError:
    flow = Dataflow("cdc-bad")
    flow.source(source, "cdc").sink(CapturingSink(tmp_path / f"out{next(_names)}"), "out")
    with pytest.raises(PostgresSourceError) as info:
        flow.run(executor="inprocess", checkpoint_dir=str(tmp_path / f"ck{next(_names)}"))
    assert info.value.fatal and "s3cr" not in str(info.value)
    return info.value


def test_bad_input_is_a_typed_error_naming_the_fix(postgres: Server, tmp_path: Path) -> None:
    src, _, slot = tables(postgres, rows=1)
    staging = tmp_path / "staging"
    e = fails(postgres, tmp_path, PostgresCDCSource(postgres.dsn(), ["no_such_table"], slot, staging))
    assert e.problem is PostgresProblem.MISSING_TABLE and "create it" in str(e)
    postgres.query(f"CREATE TABLE nokey{slot} (a int)")
    e = fails(postgres, tmp_path, PostgresCDCSource(postgres.dsn(), [f"nokey{slot}"], slot, staging))
    assert e.problem is PostgresProblem.NO_REPLICA_IDENTITY and "REPLICA IDENTITY FULL" in str(e)
    e = fails(postgres, tmp_path, PostgresCDCSource(postgres.dsn(), [src], slot, staging, publication="nopub"))
    assert e.problem is PostgresProblem.MISSING_PUBLICATION and "CREATE PUBLICATION nopub" in str(e)
    e = fails(postgres, tmp_path, PostgresCDCSource(postgres.dsn(password="wrong"), [src], slot, staging))
    assert e.problem is PostgresProblem.AUTHENTICATION
    nobody = postgres.dsn().replace(f":{postgres.port}/", f":{free_port()}/")
    e = fails(postgres, tmp_path, PostgresCDCSource(nobody, [src], slot, staging, connect_timeout=2))
    assert e.problem is PostgresProblem.UNREACHABLE and "start the server" in str(e)
    postgres.query(f"CREATE PUBLICATION inserts{slot} FOR TABLE {src} WITH (publish = 'insert')")
    e = fails(postgres, tmp_path, PostgresCDCSource(postgres.dsn(), [src], slot, staging, publication=f"inserts{slot}"))
    assert e.problem is PostgresProblem.MISSING_PUBLICATION and "does not publish updates; it does not publish deletes" in str(e)
    postgres.query(f"CREATE PUBLICATION some{slot} FOR TABLE {src} WHERE (id > 10)")
    e = fails(postgres, tmp_path, PostgresCDCSource(postgres.dsn(), [src], slot, staging, publication=f"some{slot}"))
    assert e.problem is PostgresProblem.MISSING_PUBLICATION and "filters rows or columns" in str(e)
    postgres.query("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    e = fails(postgres, tmp_path, PostgresCDCSource(postgres.dsn(), [src], slot, staging))
    assert e.problem is PostgresProblem.SLOT_EXISTS and "pg_drop_replication_slot" in str(e)
    postgres.query("SELECT pg_drop_replication_slot(%s)", (slot,))


def test_a_dropped_slot_and_a_slot_past_the_checkpoint_are_refused(postgres: Server, tmp_path: Path) -> None:
    src, dst, slot = tables(postgres, rows=100)
    staging = tmp_path / "staging"
    flow = replication(postgres, src, dst, slot, staging, "cdc-slot")
    from tests.abs_engine.executors.procs import run_in_thread

    t, t_box = run_in_thread(lambda: flow.run(executor="inprocess", checkpoint_interval=0.05,
                                              checkpoint_dir=str(tmp_path / "ck")))
    churn(postgres, src, random.Random(4), 2, 1_000)
    stop(postgres, slot)
    t.join(60)
    assert "error" not in t_box, t_box.get("error")
    assert_replica(postgres, src, dst)
    # a reader restoring an offset before the slot's position (an old checkpoint) is refused
    cdc = PostgresCDCSource(postgres.dsn(), [src], slot, staging)
    cdc.open(OperatorContext("cdc", 0, 1, 1, True))
    cdc.restore({"chunk": 99, "row": 0, "lsn": 1, "skip": 0})
    with pytest.raises(PostgresSourceError) as info:
        cdc.read_batch()
    assert info.value.problem is PostgresProblem.SLOT_AHEAD and "Restore the newest checkpoint" in str(info.value)
    cdc.close()
    # the slot dropped: a resume cannot know what it missed
    postgres.query("SELECT pg_drop_replication_slot(%s)", (slot,))
    with pytest.raises(PostgresSourceError) as info:
        replication(postgres, src, dst, slot, staging, "cdc-slot").run(
            executor="inprocess", resume=True, checkpoint_dir=str(tmp_path / "ck"))
    assert info.value.problem is PostgresProblem.SLOT_DROPPED and "start the job afresh" in str(info.value).lower()


def test_toasted_values_replica_identity_full_partitions_and_other_tables(postgres: Server, tmp_path: Path) -> None:
    """An update that leaves a large (TOASTed, not sent) value unchanged; a table under
    REPLICA IDENTITY FULL (its updates stay updates, keyed by the primary key); a partitioned
    table (its changes named as the table, as the snapshot names it); and a publication
    covering tables the source does not read (their changes are not emitted)."""
    from tests.abs_engine.executors.procs import run_in_thread

    n = next(_names)
    big, full, part, other = f"big{n}", f"full{n}", f"part{n}", f"other{n}"
    postgres.query(f"CREATE TABLE {big} (id int PRIMARY KEY, n int, doc text)")
    postgres.query(f"CREATE TABLE {full} (id int PRIMARY KEY, v text)")
    postgres.query(f"ALTER TABLE {full} REPLICA IDENTITY FULL")
    postgres.query(f"CREATE TABLE {part} (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)")
    postgres.query(f"CREATE TABLE {part}_a PARTITION OF {part} FOR VALUES FROM (0) TO (1000)")
    postgres.query(f"CREATE TABLE {part}_b PARTITION OF {part} FOR VALUES FROM (1000) TO (2000)")
    postgres.query(f"CREATE TABLE {other} (id int PRIMARY KEY, v text)")
    for t in (big, full, part):
        postgres.query(f"CREATE TABLE {t}_copy (LIKE {t})")
        postgres.query(f"ALTER TABLE {t}_copy ADD PRIMARY KEY (id)")
    # ~8 KB of incompressible text: stored out of line
    postgres.query(f"INSERT INTO {big} SELECT g, 0, (SELECT string_agg(md5(random()::text || g || s), '') FROM "
                   "generate_series(1, 250) s) FROM generate_series(1, 20) g")
    postgres.query(f"INSERT INTO {full} SELECT g, 'f' || g FROM generate_series(1, 50) g")
    postgres.query(f"INSERT INTO {part} SELECT g, 'p' || g FROM generate_series(0, 1990, 10) g")
    pub = f"pub{n}"
    postgres.query(f"CREATE PUBLICATION {pub} FOR TABLE {big}, {full}, {part}, {other} WITH "
                   "(publish_via_partition_root = true)")
    slot = f"slotx{n}"
    capture = CapturingSink(tmp_path / "changes")
    flow = Dataflow("cdc-awkward")
    s = flow.source(PostgresCDCSource(postgres.dsn(), [big, full, part], slot, tmp_path / "staging",
                                      publication=pub), "cdc")
    s.sink(capture, "every-change")
    for t in (big, full, part):
        cols = ["id", "n", "doc"] if t == big else ["id", "v"]
        (s.filter(lambda c, t=t: c.table == f"public.{t}", f"only-{t}").key_by(lambda c: c.key["id"])
         .sink(PostgresSink(postgres.dsn(), f"{t}_copy", cols, mode="upsert", key=["id"]), f"into-{t}"))
    th, box = run_in_thread(lambda: flow.run(executor="inprocess", checkpoint_interval=0.05,
                                             checkpoint_dir=str(tmp_path / "ck")))
    try:
        from tests.abs_engine.executors.procs import wait_for

        wait_for(lambda: postgres.query("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)), 60,
                 "the slot")
        postgres.query(f"UPDATE {big} SET n = n + 1")  # doc unchanged: not sent
        postgres.query(f"UPDATE {big} SET n = n + 1, doc = 'small now' WHERE id = 3")
        postgres.query(f"UPDATE {full} SET v = v || '!' WHERE id <= 10")
        postgres.query(f"DELETE FROM {full} WHERE id = 20")
        postgres.query(f"UPDATE {part} SET id = id + 1005 WHERE id < 100")  # moves rows across partitions
        postgres.query(f"INSERT INTO {other} VALUES (1, 'not read')")
        postgres.query(f"UPDATE {other} SET v = 'still not read'")
    finally:
        stop(postgres, slot)
        th.join(120)
    assert "error" not in box, box.get("error")
    for t in (big, full, part):
        assert_replica(postgres, t, f"{t}_copy")
    changes = capture.records()
    assert {c.table for c in changes} == {f"public.{big}", f"public.{full}", f"public.{part}"}
    full_kinds = collections.Counter(c.kind for c in changes if c.table == f"public.{full}")
    assert full_kinds == {ChangeKind.SNAPSHOT: 50, ChangeKind.UPDATE: 10, ChangeKind.DELETE: 1}
    assert all(c.key == {"id": c.key["id"]} for c in changes)  # the primary key, never the whole row
    untouched = [c for c in changes if c.table == f"public.{big}" and c.kind is ChangeKind.UPDATE and c.key["id"] != 3]
    assert len(untouched) == 19 and all("doc" not in (c.row or {}) for c in untouched)
