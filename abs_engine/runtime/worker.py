"""Worker process entry point:
``python -m abs_engine.runtime.worker HOST PORT TASK GENERATION [BIND_HOST]``.

HOST:PORT is the driver; BIND_HOST is the address of this worker's own machine, where its
data listener binds and which it publishes to its peers (default: HOST, when the driver
and the workers share a machine).

The attempt's secret arrives as one hex line on stdin (never on the command line, which
every local user can read); the control connection and every data connection are
authenticated with it before anything else is read. A second line, when the job has
``tls`` on, holds the attempt's TLS material (tls.Material.encode: base64 of msgpack);
an empty or missing second line means no TLS.

Life of a worker: open a data listener -> connect to the driver and say Hello -> receive
Deploy (plan as data, operators as cloudpickled code) -> build the chain -> restore its
state from the checkpoint named in Deploy (checksum verified) -> connect output channels,
accept input channels -> Running -> run the task until the job's final commit or until
the driver goes away. Any failure is reported as Failed (with the user's traceback and the
operator's name) before the process exits with status 1.
"""

from __future__ import annotations

import faulthandler
import hashlib
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any

from operators.base import RecordError

from .. import codec, codeship, messages
from ..tls import Material
from ..checkpoint.fence import Fence
from ..errors import CheckpointError, FencedOut, LoopOverflow, ProtocolError, RescaleError
from ..plan import Plan
from .channel import ChannelClosed, OutputChannel, accept_inputs
from .control import ControlLink, DriverGone
from .output import OperatorFailure, Output
from .chain import Chain, record_repr
from .task import LoopNotQuiet, TaskOptions
from .task_loop import ProcessTask
from .watchdog import Activity, Watchdog
from . import restore
from .writer import SnapshotWriter



def _run(control: ControlLink, listener: socket.socket, task_id: str, generation: int, secret: bytes,
         material: Material | None) -> None:
    deploy = control.receive()
    if not isinstance(deploy, messages.Deploy):
        raise RuntimeError(f"expected Deploy, got {deploy!r}")
    from operators.base import OperatorContext

    plan = Plan.from_dict(deploy.plan)
    spec = plan.task(task_id)
    chain = plan.chain(spec.chain)
    code = codeship.load(deploy.code)  # user code from the authenticated driver, never data
    templates, key_fns = code["ops"], code["keys"]
    restored = deploy.restore is not None
    fence = Fence(deploy.fence_dir or deploy.checkpoint_dir, deploy.fence) if deploy.fence else None
    activity = Activity()
    watchdog = Watchdog(control, task_id, activity, deploy.heartbeat_interval, deploy.task_timeout)
    watchdog.start()

    def ctx(name: str) -> Any:
        return OperatorContext(name, spec.index, spec.parallelism, generation, restored, fence,
                               max_parallelism=plan.max_parallelism,
                               tls=material is not None)

    names = list(chain.operators)
    source: Any = None
    source_name: str | None = None
    if chain.is_source:
        source_name = names.pop(0)
        source = templates[source_name]
    ops = [templates[n] for n in names]
    current: str = source_name or (names[0] if names else task_id)
    head: list[tuple[str, Any]] = [(source_name, source)] if source_name is not None else []
    try:
        if source_name is not None:
            current = source_name
            source.open(ctx(source_name))
        for n, op in zip(names, ops):
            current = n
            op.open(ctx(n))
        replay: list[tuple[int, list[Any]]] = []
        restored_finished = False
        if deploy.restore is not None:
            snap = restore.load(deploy.restore, plan, spec, dict(head + list(zip(names, ops))), key_fns)
            states, restored_finished = snap.states, snap.finished
            replay = restore.replay(snap, names, "rescale" in deploy.restore)
            for n, op in head + list(zip(names, ops)):
                current = n
                if n in states:
                    op.restore(states[n])
            if deploy.restore_final:
                # The final checkpoint completed: commit what it holds (idempotent) and stop.
                for n, op in head + list(zip(names, ops)):
                    current = n
                    op.notify_checkpoint_complete(deploy.restore["checkpoint_id"])
                control.send(messages.Committed(task_id))
                return
    except (CheckpointError, FencedOut):
        raise
    except RescaleError as e:
        raise OperatorFailure(e.operator or current, fatal=True) from e
    except Exception as e:
        raise OperatorFailure(current) from e

    tail = names[-1] if names else (source_name or task_id)
    outputs: list[Output] = []
    connect_error: list[BaseException] = []

    def connect_outputs() -> None:
        try:
            for o in spec.outputs:
                chans = []
                for cid in o.channels:
                    consumer = cid.split("->", 1)[1]
                    chans.append(OutputChannel.connect(cid, deploy.peers[consumer], secret, deploy.connect_timeout, material,
                                               deploy.channel_buffer))
                outputs.append(Output(o, chans, key_fns.get(o.key_operator), tail, plan.max_parallelism))
        except BaseException as e:  # noqa: BLE001 - re-raised on the task thread below
            connect_error.append(e)

    # Outputs connect (and authenticate: the consumer must answer) while this task accepts
    # its own inputs: on a cycle each task is the other's consumer, so doing one after the
    # other would deadlock.
    connector = threading.Thread(target=connect_outputs, name="connect-outputs", daemon=True)
    connector.start()
    inputs = accept_inputs(listener, {c.id: c.back_edge for c in spec.inputs}, secret, deploy.connect_timeout,
                           material, deploy.channel_buffer)
    listener.close()
    connector.join()
    if connect_error:
        raise connect_error[0]

    def writer_failed(e: BaseException) -> None:
        if isinstance(e, OperatorFailure):  # a state a forked encoder could not encode
            _report(control, task_id, e.operator, "".join(traceback.format_exception(e.__cause__ or e)), e.fatal)
        else:
            _report(control, task_id, "<checkpoint writer>", "".join(traceback.format_exception(e)), False)
        os._exit(1)

    writer = SnapshotWriter(control, task_id, deploy.checkpoint_dir, writer_failed)
    options = TaskOptions(
        snapshot_encoding=deploy.snapshot_encoding, incremental=deploy.incremental,
        aligned_timeout=deploy.aligned_timeout if deploy.aligned_timeout >= 0 else None,
        unaligned=deploy.unaligned,
        channel_state_memory=deploy.channel_state_memory if deploy.channel_state_memory >= 0 else None,
        loop_memory=deploy.loop_memory if deploy.loop_memory >= 0 else None,
        loop_disk=deploy.loop_disk if deploy.loop_disk >= 0 else None,
        loop_spill_dir=deploy.loop_spill_dir or None, file_tag=_file_tag(deploy.fence, generation))
    task = ProcessTask(spec, Chain(names, ops, source, source_name, activity), outputs, inputs, control, writer,
                       options, replay=replay, restored_finished=restored_finished)
    channels = [ch for out in outputs for ch in out.channels]
    watchdog.counters = lambda: (task.records_in, task.records_out,
                                 sum(ch.send_seconds(time.perf_counter()) for ch in channels))
    control.send(messages.Running(task_id))
    task.run()
    writer.flush()


def _file_tag(fence: str, generation: int) -> str:
    """A short tag unique to this attempt of this driver run, for state file names."""
    return hashlib.sha256(f"{fence}/{generation}".encode()).hexdigest()[:12]


def _report(control: ControlLink, task: str, operator: str, tb: str, fatal: bool,
            record: str = "", digest: str = "", error_type: str = "") -> None:
    try:
        control.send(messages.Failed(task, operator, tb, fatal, record, digest, error_type))
    except OSError:
        pass


def _type_name(e: BaseException) -> str:
    """``ValueError``, or ``module.Class`` for an exception not built in."""
    t = type(e)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _record_digest(record: Any) -> str:
    try:
        blob = codec.pack(record)
    except Exception:  # noqa: BLE001 - not encodable: identify it by its repr
        blob = repr(record).encode("utf-8", "replace")
    return hashlib.sha256(blob).hexdigest()[:32]


TLS_LINE_MAX = 16 << 10  #: the material is about 1 KB of base64


def _read_secret() -> tuple[bytes, Material | None]:
    """The attempt's secret (first line) and its TLS material (second line, if any)."""
    line = sys.stdin.readline(256).strip()
    try:
        secret = bytes.fromhex(line)
    except ValueError:
        secret = b""
    if len(secret) < 16:
        raise SystemExit("abs-engine worker: no job secret on stdin (workers are started by an executor)")
    tls_line = sys.stdin.readline(TLS_LINE_MAX).strip()
    if not tls_line:
        return secret, None
    try:
        return secret, Material.decode(tls_line)
    except ValueError as e:  # binascii.Error is a ValueError; so are msgpack's decoding errors
        raise SystemExit(f"abs-engine worker: the TLS material on stdin is malformed ({e})") from None


def main(argv: list[str] | None = None) -> int:
    args = (argv or sys.argv[1:])
    host, port, task_id, generation = args[:4]
    bind_host = args[4] if len(args) > 4 else host
    secret, material = _read_secret()
    # A stuck worker's Python stacks, on request of the driver (SIGUSR1), even if the GIL
    # is held: to stderr, which the driver's console shows.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # A terminal's Ctrl-C reaches the whole process group: the driver decides what it means
    # (a savepoint, then a clean stop), and tells the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        control = ControlLink.connect((host, int(port)), secret, material)
    except (OSError, ProtocolError) as e:
        print(f"abs-engine worker {task_id}: cannot reach the driver: {e}", file=sys.stderr)
        return 1
    if os.environ.get("PYTHONHASHSEED") in (None, "", "random"):
        _report(control, task_id, "<worker>", "PYTHONHASHSEED is not fixed: user code that iterates sets or dicts "
                "of strings would behave differently in each worker and restart (keys are placed by key group, "
                "not by hash()). Start workers through an abs-engine executor (it sets it).", True)
        return 1
    os.environ["ABS_ENGINE_ATTEMPT"] = generation  # read by abs_engine.testing.fail_at
    listener = socket.create_server((bind_host, 0), backlog=256)
    control.send(messages.Hello(task_id, int(generation), bind_host, listener.getsockname()[1], os.getpid()))
    try:
        _run(control, listener, task_id, int(generation), secret, material)
        return 0
    except (DriverGone, FencedOut):
        return 1  # nobody to report to, or a newer attempt owns the job now
    except OperatorFailure as e:
        cause = e.__cause__ or e
        fatal = e.fatal or bool(getattr(cause, "fatal", False))  # e.g. a source that changed under us
        record, digest = (record_repr(e.record), _record_digest(e.record)) if e.has_record else ("", "")
        if isinstance(cause, OSError):
            digest = ""  # I/O, connection and timeout errors may pass on a retry: never a poison record
        _report(control, task_id, e.operator, "".join(traceback.format_exception(cause)), fatal, record, digest,
                _type_name(cause.__cause__ if isinstance(cause, RecordError) and cause.__cause__ else cause))
        return 1
    except LoopNotQuiet as e:
        _report(control, task_id, "<loop>", str(e), True)
        return 1
    except LoopOverflow as e:
        # Fatal: the same loop replayed from a checkpoint overflows the same way. Reported
        # with the operator the loop feeds; the driver fails the job with this message.
        _report(control, task_id, e.operator, "".join(traceback.format_exception(e)), True,
                error_type=_type_name(e))
        return 1
    except ChannelClosed as e:
        # Collateral damage: the driver attributes the failure to the producer that died.
        _report(control, task_id, f"<upstream:{e.producer}>", str(e), False)
        return 1
    except (BrokenPipeError, ConnectionResetError) as e:
        _report(control, task_id, "<downstream>", str(e), False)
        return 1
    except CheckpointError as e:
        _report(control, task_id, "<restore>", "".join(traceback.format_exception(e)), False)
        return 1
    except BaseException as e:  # noqa: BLE001 - anything else is reported, then we die
        _report(control, task_id, "<runtime>", "".join(traceback.format_exception(e)), False)
        return 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
