"""The task's environment in memory (runtime/memory.py): links are FIFO, unbounded and
report a closed peer; the control link carries messages through the real encoding; the
inline writer writes spills before the state file that lists them and acknowledges each
state file with its size and checksum."""

from __future__ import annotations

import hashlib

import pytest

from abs_engine import codec, messages
from abs_engine.runtime.channel import ChannelClosed, InputChannel, OutputChannel
from abs_engine.runtime.clock import ManualClock
from abs_engine.runtime.memory import InlineWriter, MemoryLink, memory_control
from abs_engine.runtime.writer import Job, SpillJob


def test_a_link_is_fifo_and_bounded_reads_take_part_of_a_chunk() -> None:
    a, b = MemoryLink.pair()
    a.sendall(b"abc")
    a.sendall(memoryview(b"defgh"))
    a.sendall(b"")  # nothing to send: nothing queued
    got, closed = b.read_nowait(2, limit=3)
    assert got == [b"ab", b"c"] and not closed
    assert b.pending() == 5
    assert b.recv(100) == b"defgh"
    with pytest.raises(BlockingIOError):
        b.recv(1)  # an empty open link would block for ever: the caller's error, said at once
    b.sendall(b"back")
    assert a.read_nowait(10) == ([b"back"], False)


def test_a_closed_link_reports_it_once_its_bytes_are_read() -> None:
    a, b = MemoryLink.pair()
    a.sendall(b"last")
    b.close()  # the reading end learns its peer went away
    assert b.read_nowait(100) == ([b"last"], True)
    assert b.recv(10) == b""


def test_channels_over_memory_carry_frames_in_order_and_a_dead_producer_is_named() -> None:
    prod, cons = MemoryLink.pair()
    out = OutputChannel("p#0->c#0", prod)
    inp = InputChannel("p#0->c#0", cons, codec.FrameReader(), back_edge=False)
    out.send(codec.records_frame([1, 2]))
    out.send(codec.frame(codec.FrameKind.BARRIER, codec.barrier_payload(7, False)))
    inp.fill_nowait()
    kinds = [inp.next_frame(), inp.next_frame(), inp.next_frame()]
    assert [k[0] if k else None for k in kinds] == [codec.FrameKind.RECORDS, codec.FrameKind.BARRIER, None]
    assert codec.unpack(kinds[0][1]) == (1, 2)  # type: ignore[index]
    cons.close()
    with pytest.raises(ChannelClosed) as e:
        inp.fill_nowait()
    assert e.value.producer == "p#0"


def test_control_messages_travel_encoded_both_ways() -> None:
    control, driver = memory_control()
    driver.send(messages.Trigger(3, unaligned=True))
    assert control.poll() == [messages.Trigger(3, unaligned=True)]
    assert driver.receive_one() is None and not driver.waiting()
    control.send(messages.InputsEnded("t#0"))
    control.send(messages.Committed("t#0"))
    assert driver.waiting()
    assert [driver.receive_one(), driver.receive_one(), driver.receive_one()] == [
        messages.InputsEnded("t#0"), messages.Committed("t#0"), None]


def test_the_inline_writer_writes_spills_first_and_acks_with_size_and_checksum() -> None:
    control, driver = memory_control()
    files: list[tuple[int, str, bytes]] = []
    clock = ManualClock(10.0)
    writer = InlineWriter(control, "t#0", lambda cid, name, blob: files.append((cid, name, blob)), clock.perf_counter)
    refs: list[tuple[str, int, str]] = []
    writer.spill(SpillJob(4, "t#0.state.spill-0", lambda: b"logged", refs, 6))
    assert refs == [("t#0.state.spill-0", 6, hashlib.sha256(b"logged").hexdigest())]
    assert driver.receive_one() is None  # a spill is not acknowledged
    clock.now = 10.25
    writer.submit(Job(4, "t#0.state", lambda: b"state", 1.5, 2, False, 0.5, 10.0))
    assert [(c, n) for c, n, _ in files] == [(4, "t#0.state.spill-0"), (4, "t#0.state")]
    ack = driver.receive_one()
    assert isinstance(ack, messages.Ack)
    assert (ack.checkpoint_id, ack.task, ack.file, ack.size) == (4, "t#0", "t#0.state", 5)
    assert ack.sha256 == hashlib.sha256(b"state").hexdigest() and ack.async_ms == pytest.approx(250.0)
