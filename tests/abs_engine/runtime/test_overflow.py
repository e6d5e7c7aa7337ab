"""Back-edge input past loop_memory (runtime/overflow.py): the spill queue against a plain
in-memory FIFO (order across the memory/disk boundary, interleaved pushes and pops, byte
accounting, disk released), the loop_disk limit and its LoopOverflow, an InputChannel that
spills (frames of every kind in exact order, its reader bounded), and a real Task over
socketpairs: the ABS cut is exact with its back-edge spilling on every read, a held
back-edge past loop_disk fails the task with LoopOverflow, and a frame of more records
than a batch may hold is processed in batches of at most GATHER_MAX."""

from __future__ import annotations

import dataclasses
import os
import random
import socket
import threading
from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from abs_engine import codec, messages
from abs_engine.errors import AbsEngineError, LoopOverflow
from abs_engine.plan import ChannelSpec, TaskSpec
from abs_engine.runtime import channel as channel_module
from abs_engine.runtime import overflow
from abs_engine.runtime.channel import InputChannel
from abs_engine.runtime.control import ControlLink
from abs_engine.runtime.overflow import LoopBudget, SpillQueue
from abs_engine.runtime.chain import Chain
from abs_engine.runtime.task import GATHER_MAX, TaskOptions
from abs_engine.runtime.task_loop import ProcessTask
from abs_engine.wire import Wire
from operators.base import Operator, OperatorContext
from tests.abs_engine.runtime.test_channel_state import CapturingWriter, Remember, assert_cut

# ---- the spill queue ---------------------------------------------------------------------


ops = st.lists(st.one_of(st.tuples(st.just("push"), st.binary(min_size=0, max_size=300)),
                         st.tuples(st.just("pop"), st.integers(1, 400))), max_size=120)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(1, 200), st.integers(1, 120))
def test_the_queue_is_a_fifo_of_bytes_across_memory_and_disk(tmp_path_factory, script, segment, write_buffer):
    """Any interleaving of pushes and pops, with segments and a write buffer small enough
    that bytes cross between memory, files and new files all the time: pops return exactly
    the bytes a plain FIFO would, ``bytes`` is what is queued, and the files hold at most
    that plus one segment (and one write)."""
    d = str(tmp_path_factory.mktemp("spill"))
    q = SpillQueue(d, segment=segment, write_buffer=write_buffer)
    fifo = bytearray()
    try:
        for op, arg in script:
            if op == "push":
                q.push(arg)
                fifo += arg
            else:
                got = q.pop(arg)
                assert 0 < len(got) <= arg or (not got and not fifo)
                assert got == bytes(fifo[:len(got)])
                del fifo[:len(got)]
            assert q.bytes == len(q) == len(fifo)
            assert q.disk_bytes <= len(fifo) + segment + write_buffer + 300
            assert os.listdir(d) == []  # created unlinked: nothing to see, nothing left behind
        rest = bytearray()
        while chunk := q.pop(7):
            rest += chunk
        assert rest == fifo and q.bytes == 0
    finally:
        q.close()


def test_bytes_past_the_write_buffer_go_to_disk_and_disk_is_released_as_the_head_passes(tmp_path):
    q = SpillQueue(str(tmp_path), segment=1000, write_buffer=100)
    data = bytes(random.Random(1).randrange(256) for _ in range(5000))
    q.push(data[:50])
    assert q.files == 0 and q.disk_bytes == 0  # under the write buffer: still in memory
    for i in range(50, 5000, 250):
        q.push(data[i:i + 250])
    assert q.files >= 4 and q.disk_bytes >= 4000  # on disk, in segments of about 1000 bytes
    out = bytearray()
    while len(out) < 2600:
        out += q.pop(300)
    assert q.files <= 3 and q.disk_bytes <= q.bytes + 1000  # passed segments are closed
    while chunk := q.pop(1 << 20):
        out += chunk
    assert bytes(out) == data
    assert q.files == 1 and q.disk_bytes == 0  # emptied: the last segment is truncated, kept for reuse
    q.push(b"again")
    assert q.pop(100) == b"again"
    q.close()
    assert q.files == 0 and q.bytes == 0
    with pytest.raises(ValueError):
        q.push(b"x")


def test_a_queue_reads_back_in_bounded_chunks(tmp_path):
    q = SpillQueue(str(tmp_path), segment=1 << 20, write_buffer=1024)
    q.push(b"a" * 100_000)
    sizes = []
    while chunk := q.pop(4096):
        sizes.append(len(chunk))
    assert max(sizes) <= 4096 and sum(sizes) == 100_000
    q.close()


# ---- the task's budget: shares of loop_memory, the loop_disk limit ------------------------


def test_a_back_edge_waits_in_memory_up_to_its_share_then_on_disk_in_order(tmp_path):
    budget = LoopBudget("merge#0", "merge", ["loop#0->merge#0", "loop#1->merge#0"], memory=4096, disk=None,
                        directory=str(tmp_path))
    a = budget.channel("loop#0->merge#0")
    assert a.share == 2048  # loop_memory split over the task's back-edges
    assert not a.wants(0, overflow.READER) and a.wants(1, overflow.READER)  # the reader stays a small window
    a.push(b"1" * 1000)
    assert (a.memory_bytes, budget.spilled, budget.in_memory) == (1000, 0, 1000)  # within its share: memory
    assert a.wants(0, 1)  # anything waiting: what arrives goes behind it, not to the reader
    a.push(b"2" * 2000)  # past the share: disk
    a.push(b"3" * 10)  # fits in memory, but must come after the bytes on disk
    assert (a.memory_bytes, budget.spilled, a.waiting) == (1000, 2010, 3010)
    got = b""
    while chunk := a.pop(700):
        got += chunk
    assert got == b"1" * 1000 + b"2" * 2000 + b"3" * 10
    assert budget.spilled == 0 and a.waiting == 0
    a.push(b"4" * 10)  # the disk part is empty again: memory
    assert a.memory_bytes == 10 and budget.spilled == 0
    budget.close()


def test_loop_disk_is_the_bound_on_what_a_task_spills_over_all_its_back_edges(tmp_path):
    held = [12345]
    budget = LoopBudget("merge#0", "merge", ["loop#0->merge#0", "loop#1->merge#0"], memory=4096, disk=10_000,
                        directory=str(tmp_path), held=lambda: held[0])
    a, b = budget.channel("loop#0->merge#0"), budget.channel("loop#1->merge#0")
    a.push(b"x" * 1000)  # memory
    a.push(b"x" * 6000)  # disk
    b.push(b"y" * 4000)  # disk
    assert budget.spilled == 10_000 and budget.in_memory == 1000
    assert a.pop(1000) == b"x" * 1000  # from memory: the disk total is unchanged
    assert a.pop(1000) == b"x" * 1000  # from disk
    assert budget.spilled == 9_000
    b.push(b"y" * 1000)
    with pytest.raises(LoopOverflow) as info:
        b.push(b"y" * 1)  # 10_001 bytes on disk over both
    e = info.value
    assert isinstance(e, AbsEngineError) and e.fatal
    assert (e.task, e.operator, e.channels) == ("merge#0", "merge", ("loop#0->merge#0", "loop#1->merge#0"))
    assert (e.in_memory, e.on_disk, e.memory_limit, e.disk_limit) == (12345, 10_001, 4096, 10_000)
    text = str(e)
    for part in ("'merge'", "merge#0", "loop#0->merge#0, loop#1->merge#0", "loop_memory=0.0 MiB",
                 "loop_disk=0.0 MiB", "spilled to disk", "raise loop_disk", "consume faster than it produces"):
        assert part in text, part
    budget.close()


def test_no_disk_limit_spills_without_bound_and_small_limits_get_small_segments(tmp_path):
    budget = LoopBudget("t#0", "op", ["b"], memory=1, disk=None, directory=str(tmp_path))
    spill = budget.channel("b")
    for _ in range(40):
        spill.push(b"z" * 100_000)
    assert budget.spilled == 4_000_000
    assert LoopBudget("t#0", "op", ["b"], memory=1 << 20, disk=8 << 20).segment == 2 << 20
    assert LoopBudget("t#0", "op", ["b"], memory=1 << 20, disk=None).segment == overflow.SEGMENT
    with pytest.raises(KeyError):
        budget.channel("not-a-back-edge")
    budget.close()


# ---- an InputChannel that spills ----------------------------------------------------------


def frames_of_every_kind(rng: random.Random, n: int, start: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    for i in range(start, start + n):
        roll = rng.random()
        if roll < 0.8:
            out.append((codec.FrameKind.RECORDS, codec.pack([i, "p" * rng.randrange(0, 3000)])))
        elif roll < 0.9:
            out.append((codec.FrameKind.BARRIER, codec.barrier_payload(i, False)))
        else:
            out.append((codec.FrameKind.WATERMARK, codec.pack(float(i))))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_a_spilling_back_edge_delivers_every_frame_in_order_with_its_reader_bounded(tmp_path, monkeypatch, seed):
    """Rounds of: frames arrive, the channel reads the socket, some frames are processed
    (and some read ahead, as a checkpoint's log does); the reader never holds more than its
    share plus one refill, and the frames come out exactly as sent, END last."""
    monkeypatch.setattr(overflow, "WRITE_BUFFER", 512)  # so that spilled bytes reach the files
    monkeypatch.setattr(overflow, "READER", 2048)
    monkeypatch.setattr(channel_module, "REFILL", 1000)
    monkeypatch.setattr(channel_module, "RECV_SIZE", 1000)  # chunks read (and kept in memory) of 1000 bytes
    rng = random.Random(seed)
    prod, cons = socket.socketpair()
    budget = LoopBudget("t#0", "op", ["b"], memory=4096, disk=None, directory=str(tmp_path))
    ch = InputChannel("b", cons, codec.FrameReader(), back_edge=True)
    ch.spill = budget.channel("b")
    sent: list[tuple[int, bytes]] = []
    got: list[tuple[int, bytes]] = []
    peak_reader = 0
    try:
        for r in range(40):
            batch = frames_of_every_kind(rng, rng.randrange(0, 30), len(sent))
            if r == 39:
                batch.append((codec.FrameKind.END, b""))
            prod.sendall(b"".join(codec.frame(k, p) for k, p in batch))  # fits the socket buffer
            sent += batch
            ch.fill_nowait()
            peak_reader = max(peak_reader, ch.reader.buffered())
            for _ in range(rng.randrange(0, 40)):
                if rng.random() < 0.2:  # read ahead, as a log waiting on this channel would
                    f = ch.read_frame()
                    if f is not None:
                        ch.push_ahead(*f)
                    continue
                nf = ch.next_frame()
                if nf is None:
                    break
                got.append(nf[:2])
                peak_reader = max(peak_reader, ch.reader.buffered())
        assert budget.peak_spilled > 20_000 and budget.spills["b"].queue.pushed > 20_000  # it did spill, a lot
        while ch.has_frames():
            nf = ch.next_frame()
            if nf is None:
                ch.fill_nowait()
                continue
            got.append(nf[:2])
            peak_reader = max(peak_reader, ch.reader.buffered())
        assert got == sent and budget.spilled == 0
        assert peak_reader <= 2048 + 1000 + 3100  # READER + one refill + the frame being completed
        assert os.listdir(tmp_path) == []
    finally:
        budget.close()
        prod.close()
        cons.close()


# ---- a real Task ----------------------------------------------------------------------------


class LoopHarness:
    """A task with one regular and one back-edge input over socketpairs, its back-edge
    bounded by ``loop_memory`` (tiny here: it spills on every read), its snapshots captured."""

    def __init__(self, tmp: str, loop_memory: int, loop_disk: int | None, op: Operator | None = None,
                 back_backlog: bytes = b"") -> None:
        self.reg_prod, reg_cons = socket.socketpair()
        self.back_prod, back_cons = socket.socketpair()
        self.ctl_driver, ctl_worker = socket.socketpair()
        control = ControlLink(Wire(ctl_worker))
        inputs = {"r": InputChannel("r", reg_cons, codec.FrameReader(), back_edge=False),
                  "b": InputChannel("b", back_cons, codec.FrameReader(), back_edge=True)}
        inputs["b"].reader.feed(back_backlog)  # read already: processing it never waits on the socket
        spec = TaskSpec("t#0", "t", 0, 1, (ChannelSpec("r", "x#0", "t#0", 0, False),
                                            ChannelSpec("b", "y#0", "t#0", 1, True)), ())
        self.op = op or Remember()
        self.op.open(OperatorContext("remember", 0, 1, 0, False))
        self.writer = CapturingWriter()
        self.writer.op = self.op if isinstance(self.op, Remember) else None
        self.task = ProcessTask(spec, Chain(["remember"], [self.op]), [], inputs, control, self.writer,
                                TaskOptions(loop_memory=loop_memory, loop_disk=loop_disk, loop_spill_dir=tmp))
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.task.run()
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            self.error = e

    def send(self, sock: socket.socket, *items: Any) -> None:
        data = b""
        for it in items:
            if isinstance(it, tuple) and it[0] == "barrier":
                data += codec.frame(codec.FrameKind.BARRIER, codec.barrier_payload(it[1], False))
            else:
                data += codec.records_frame(list(it))
        sock.sendall(data)

    def close(self) -> None:
        try:
            self.ctl_driver.sendall(messages.encode(messages.Shutdown()))
        except OSError:
            pass
        self.thread.join(timeout=10)
        for s in (self.reg_prod, self.back_prod, self.ctl_driver):
            s.close()


def test_the_cut_is_exact_while_the_back_edge_spills_on_every_read(tmp_path, monkeypatch):
    """The ABS cut of test_channel_state, with the back-edge's reader and spill memory
    allowed 64 bytes each:
    its records and barriers pass through the spill queue (and its files) and still
    come out in order on the right side of each snapshot."""
    monkeypatch.setattr(overflow, "WRITE_BUFFER", 256)
    monkeypatch.setattr(overflow, "READER", 64)
    h = LoopHarness(str(tmp_path), loop_memory=64, loop_disk=None)
    try:
        back1 = [list(range(10 + 40 * i, 50 + 40 * i)) for i in range(30)]  # ~3 KB a frame, 30 frames
        back2 = [list(range(5000 + 40 * i, 5040 + 40 * i)) for i in range(30)]
        h.send(h.reg_prod, [1, 2], ("barrier", 1))
        h.send(h.back_prod, *back1, ("barrier", 1), *back2)
        h.send(h.reg_prod, [3], ("barrier", 2))
        h.send(h.back_prod, ("barrier", 2))
        cid, states, logs = h.writer.next()
        assert cid == 1
        before = {r for f in back1 for r in f}
        assert_cut(states, logs, regular_before={1, 2}, back_before=before, after={3} | {r for f in back2 for r in f})
        cid, states, logs = h.writer.next()
        assert cid == 2
        assert_cut(states, logs, regular_before={1, 2, 3}, back_before=before | {r for f in back2 for r in f},
                   after=set())
        assert h.task.loop_budget is not None and h.task.loop_budget.peak_spilled > 0  # it went through the queue
        assert [r for r in h.op.seen if r >= 10] == [r for f in back1 + back2 for r in f]  # order, each once
    finally:
        h.close()
    assert h.error is None


def test_a_held_back_edge_past_loop_disk_fails_the_task_with_loop_overflow(tmp_path):
    """Barrier 1 comes round the back-edge before the task triggered 1: the back-edge is
    held (not processed) but still read, so what arrives spills; past loop_disk the task
    fails with LoopOverflow naming the back-edge, instead of growing without bound."""
    h = LoopHarness(str(tmp_path), loop_memory=4096, loop_disk=100_000)
    try:
        h.send(h.back_prod, ("barrier", 1))
        payload = ["r" * 1000] * 20  # ~20 KB a frame

        def flood() -> None:
            try:
                for _ in range(200):
                    h.send(h.back_prod, payload)
            except OSError:
                pass  # the task died and its socket was closed: expected

        sender = threading.Thread(target=flood, daemon=True)
        sender.start()  # it may block once the task has died: a daemon, and its socket is closed below
        h.thread.join(timeout=30)
        assert not h.thread.is_alive()
        assert isinstance(h.error, LoopOverflow), h.error
        assert h.error.channels == ("b",) and h.error.operator == "remember" and h.error.on_disk > 100_000
        assert h.op.seen == []  # held: nothing behind the barrier was processed
    finally:
        h.close()


class Sizes(Operator):
    """Remembers the size of every batch it is given, and the records, in order."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.seen: list[Any] = []

    def process(self, batch: list[Any]) -> list[Any]:
        self.sizes.append(len(batch))
        self.seen.extend(batch)
        return []

    def snapshot(self, checkpoint_id: int) -> Any:
        return len(self.seen)


def test_a_frame_of_more_records_than_a_batch_is_processed_in_batches_of_at_most_GATHER_MAX(tmp_path):
    """Round an amplifying loop one frame became one batch became a frame twice as large,
    trip after trip (measured: 800k records in one batch, 400 MB, in 8 s). A frame is now
    cut into batches of at most GATHER_MAX records, in order, none lost."""
    op = Sizes()
    h = LoopHarness(str(tmp_path), loop_memory=1 << 20, loop_disk=None, op=op)
    try:
        n = 3 * GATHER_MAX + 123
        h.send(h.reg_prod, list(range(n)), ("barrier", 1))
        h.send(h.back_prod, ("barrier", 1))
        cid, states, _ = h.writer.next()  # the snapshot: after every record before the barrier
        assert states["remember"] == n
        assert op.seen == list(range(n))
        assert max(op.sizes) <= GATHER_MAX and len(op.sizes) >= 4
    finally:
        h.close()


def test_a_back_edge_that_never_runs_dry_does_not_starve_the_other_inputs(tmp_path):
    """A loop whose backlog is larger than it can hold keeps a back-edge busy for ever: each
    blocked send reads more of it. Its frames are processed TURN seconds at a time, then
    the other inputs (and the control connection) get theirs: here the regular input's
    barrier is taken after a few batches of a 100-batch backlog, not after all of them
    (before, a checkpoint of such a loop waited for a backlog that never ended)."""
    batches = [list(range(10_000 + GATHER_MAX * i, 10_000 + GATHER_MAX * (i + 1))) for i in range(100)]
    backlog = b"".join(codec.records_frame(b) for b in batches) + codec.frame(
        codec.FrameKind.BARRIER, codec.barrier_payload(1, False))
    h = LoopHarness(str(tmp_path), loop_memory=1 << 20, loop_disk=None, op=Remember(delay=0.01),
                    back_backlog=backlog)
    try:
        h.send(h.reg_prod, [1, 2], ("barrier", 1))
        cid, states, logs = h.writer.next()
        assert cid == 1 and {1, 2} <= set(states["remember"])
        back_done = sum(1 for r in states["remember"] if r >= 10_000)
        assert back_done <= 20 * GATHER_MAX, back_done  # a turn is ~5 batches of 10 ms; all 100 without turns
        assert len(logs["b"]) == 100 * GATHER_MAX - back_done  # the rest was in flight: logged
    finally:
        h.close()


def test_deploy_carries_the_loop_limits_and_an_older_drivers_means_no_bound():
    new = messages.Deploy({}, b"", {}, None, False, "/ck", loop_memory=8 << 20, loop_disk=64 << 20,
                          loop_spill_dir="/spill")
    back = messages.decode(messages.encode(new)[codec.HEADER_SIZE:])
    assert isinstance(back, messages.Deploy)
    assert (back.loop_memory, back.loop_disk, back.loop_spill_dir) == (8 << 20, 64 << 20, "/spill")
    # A driver that predates the fields sends none of them: the worker keeps today's behaviour.
    fields = codec.unpack(messages.encode(new)[codec.HEADER_SIZE:])  # [TAG, field, ...]
    first_new = [f.name for f in dataclasses.fields(messages.Deploy)].index("loop_memory")
    old = codec.frame(codec.FrameKind.CONTROL, codec.pack(list(fields[:1 + first_new])))
    back = messages.decode(old[codec.HEADER_SIZE:])
    assert isinstance(back, messages.Deploy)
    assert (back.loop_memory, back.loop_disk, back.loop_spill_dir) == (None, None, "")


def test_a_spill_directory_that_cannot_be_written_is_an_error_naming_it_and_the_fix(tmp_path):
    missing = str(tmp_path / "no-such-dir")
    budget = LoopBudget("t#0", "op", ["b"], memory=1, disk=None, directory=missing)
    spill = budget.channel("b")
    with pytest.raises(OSError) as info:
        spill.push(b"x" * (overflow.WRITE_BUFFER + 1))  # past the write buffer: the first file is created
    text = str(info.value)
    assert missing in text and "back-edge b of task t#0" in text and "loop_spill_dir" in text
    budget.close()
