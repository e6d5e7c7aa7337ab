"""Channel state: the records in flight on a task's input channels at a snapshot (Chandy
and Lamport's channel state), logged until each channel's barrier arrives. One mechanism
serves both places it is needed:

- **Back-edges** (the ABS paper's algorithm for cycles). A task aligns barriers on its
  regular inputs only. When it triggers checkpoint n it snapshots its state and forwards
  the barrier; from then on every record arriving on a back-edge is processed *and*
  logged, until barrier n comes round that back-edge.
- **Unaligned checkpoints** (Chandy-Lamport; Flink's FLIP-76). The task snapshots at once,
  at the first barrier n on any input or at the coordinator's trigger, forwards barrier n,
  and logs the records on *every* input that has not delivered barrier n yet, until it does.

The snapshot for n is the state plus those logs: exactly the records in flight at the cut.
It is complete (may be written and acknowledged) when barrier n has arrived on every input
it waits on. Restore replays the logs before any new input.

The other order on a back-edge in an aligned checkpoint: barrier n arrives *before* the
task has triggered n (it came round through another path). Records behind it belong after
the snapshot, so that back-edge is HELD (its frames are not processed; its bytes are still
read, so the loop cannot deadlock) until the task triggers n; it has nothing to log for n.

Logs hold the records as they travelled: raw msgpack payloads of whole frames (one per
batch), never decoded to be logged, so logging costs a reference, not a copy per record.
Invariant: for every session and every channel it waits on, its log is every record of
that channel not processed when the session started or arrived after, up to barrier n, in
order, each exactly once. No I/O here: the task asks ``is_held`` and ``waiting_on``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..codec import array_length


class LogOutcome(enum.Enum):
    LOGGING = "logging"  #: counted towards a pending session; wait for more barriers
    COMPLETE = "complete"  #: the session for this checkpoint has all its logs
    HELD = "held"  #: back-edge barrier before the task triggered it: hold this channel
    IGNORED = "ignored"  #: a stale or duplicate barrier
    UNKNOWN_CHANNEL = "unknown_channel"


@dataclass
class Session:
    checkpoint_id: int
    payload: Any  #: what the task captured at the trigger (its encoded state)
    waiting: set[str]
    logs: dict[str, list[bytes]] = field(default_factory=dict)  #: channel -> frame payloads
    unaligned: bool = False  #: it logs regular inputs too
    logged: int = 0  #: records in the logs
    logged_bytes: int = 0
    #: Records logged on regular inputs (unaligned): the metadata records which tasks hold
    #: such channel state (Metadata.channel_state).
    regular_logged: int = 0
    memory: int = 0  #: bytes of ``logs`` (what is held in memory, not spilled)
    #: Spill files written for it, in order (appended by the writer thread): the older part
    #: of its logs (checkpoint/spill.py); ``spills`` counts those handed to the writer.
    spilled: list[tuple[str, int, str]] = field(default_factory=list)
    spills: int = 0


@dataclass(frozen=True)
class Step:
    outcome: LogOutcome
    completed: tuple[Session, ...] = ()
    released: tuple[str, ...] = ()  #: channels no longer held


class ChannelStateLog:
    def __init__(self, back_edges: Iterable[str], regular: Iterable[str] = (), memory_limit: int | None = None):
        #: A session holding more bytes of logs than this is due to spill (None: never):
        #: the task asks ``due_to_spill`` and hands what ``take`` returns to its writer.
        self.memory_limit = memory_limit
        self.due: list[Session] = []
        self.back: set[str] = set(back_edges)  #: live back-edge inputs
        self.back_edges = frozenset(self.back)  #: every back-edge input, live or ended
        self.regular: set[str] = set(regular)  #: live regular inputs
        self.sessions: dict[int, Session] = {}
        self.held: dict[str, int] = {}  #: back-edge -> id of the barrier it is held behind
        self.last_started = 0

    def is_held(self, channel: str) -> bool:
        return channel in self.held

    @property
    def logging(self) -> bool:
        return bool(self.sessions)

    def waiting_on(self, channel: str) -> int:
        """The newest checkpoint still logging ``channel`` (0: none): frames up to that
        barrier on it are channel state and may be read ahead."""
        return max((cid for cid, s in self.sessions.items() if channel in s.waiting), default=0)

    def start(self, checkpoint_id: int, payload: Any, unaligned: bool = False,
              arrived: Iterable[str] = ()) -> Step:
        """The task triggered ``checkpoint_id`` (aligned its regular inputs, was triggered
        directly, or unaligned). ``arrived``: inputs that already delivered this barrier
        (an unaligned trigger's channel, or those an abandoned alignment had collected)."""
        self.last_started = max(self.last_started, checkpoint_id)
        released = tuple(ch for ch, cid in self.held.items() if cid <= checkpoint_id)
        # A back-edge held behind exactly this barrier has nothing in flight for it. One held
        # behind an *older* barrier (a checkpoint this task skipped) has not delivered this
        # barrier yet: what follows the old barrier is in flight for this one, and logged.
        done = {ch for ch in released if self.held[ch] == checkpoint_id} | set(arrived)
        for ch in released:
            del self.held[ch]
        inputs = self.back | self.regular if unaligned else self.back
        waiting = {ch for ch in inputs if ch not in done}
        s = Session(checkpoint_id, payload, waiting, {ch: [] for ch in waiting}, unaligned)
        if not waiting:
            return Step(LogOutcome.COMPLETE, (s,), released)
        self.sessions[checkpoint_id] = s
        return Step(LogOutcome.LOGGING, (), released)

    def on_records(self, channel: str, payload: bytes) -> None:
        """A frame of records on ``channel`` that the task had not processed at the start of
        any session still waiting on it (the task calls this once per frame)."""
        count = 0
        for s in self.sessions.values():
            if channel in s.waiting:
                if not count:
                    count = array_length(payload)
                self._log(s, channel, payload, count)

    def log_into(self, checkpoint_id: int, channel: str, payload: bytes) -> None:
        """Log a frame into one session only: one read ahead for older sessions that the
        task had not processed when this one started."""
        s = self.sessions.get(checkpoint_id)
        if s is not None and channel in s.waiting:
            self._log(s, channel, payload, array_length(payload))

    def _log(self, s: Session, channel: str, payload: bytes, count: int) -> None:
        s.logs[channel].append(payload)
        s.logged += count
        s.logged_bytes += len(payload)
        s.memory += len(payload)
        if channel not in self.back_edges:
            s.regular_logged += count
        if self.memory_limit is not None and s.memory > self.memory_limit and s not in self.due:
            self.due.append(s)

    def due_to_spill(self) -> list[Session]:
        """Sessions past the memory limit that are still logging (emptied by the call)."""
        due, self.due = [s for s in self.due if self.sessions.get(s.checkpoint_id) is s], []
        return due

    def take(self, s: Session) -> dict[str, list[bytes]]:
        """What ``s`` has logged so far, moved out of it (to be spilled): its logs start
        again empty, so the spilled part precedes whatever it logs next."""
        logs = {ch: frames for ch, frames in s.logs.items() if frames}
        s.logs = {ch: [] for ch in s.logs}
        s.memory = 0
        s.spills += 1
        return logs

    def on_barrier(self, channel: str, checkpoint_id: int) -> Step:
        if channel not in self.back and channel not in self.regular:
            return Step(LogOutcome.UNKNOWN_CHANNEL)
        # Barriers on a channel come in order: an older session still waiting for this
        # channel will never get its barrier (upstream skipped it); it cannot complete.
        for old in [c for c, s in self.sessions.items() if c < checkpoint_id and channel in s.waiting]:
            del self.sessions[old]
        s = self.sessions.get(checkpoint_id)
        if s is not None:
            if channel not in s.waiting:
                return Step(LogOutcome.IGNORED)
            s.waiting.discard(channel)
            if s.waiting:
                return Step(LogOutcome.LOGGING)
            del self.sessions[checkpoint_id]
            return Step(LogOutcome.COMPLETE, (s,))
        if channel in self.back and checkpoint_id > self.last_started:
            self.held[channel] = checkpoint_id
            return Step(LogOutcome.HELD)
        return Step(LogOutcome.IGNORED)

    def end_ahead(self, channel: str) -> Step:
        """End of stream on ``channel`` was *read ahead*: the sessions waiting on it have its
        whole log (no barrier will come), but the channel stays live: frames before the end
        are not processed yet, and a session that starts before they are logs them."""
        done = []
        for cid, s in list(self.sessions.items()):
            if channel in s.waiting:
                s.waiting.discard(channel)
                if not s.waiting:
                    done.append(self.sessions.pop(cid))
        return Step(LogOutcome.COMPLETE if done else LogOutcome.IGNORED, tuple(done))

    def on_end_of_stream(self, channel: str) -> Step:
        """An input ended: it has nothing more to log; sessions may complete. Idempotent."""
        self.back.discard(channel)
        self.regular.discard(channel)
        self.held.pop(channel, None)
        done = []
        for cid, s in list(self.sessions.items()):
            s.waiting.discard(channel)
            if not s.waiting:
                done.append(self.sessions.pop(cid))
        return Step(LogOutcome.COMPLETE if done else LogOutcome.IGNORED, tuple(done))
