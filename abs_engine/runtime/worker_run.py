"""One worker's life, in its own process (runtime/worker.py starts it, or the fork server
forks it: runtime/fork_server.py).

The control connection and every data connection are authenticated with the attempt's
secret before anything else is read.

Life of a worker: open a data listener -> connect to the driver and say Hello -> receive
Deploy (plan as data, operators as cloudpickled code) -> build the chain -> restore its
state from the checkpoint named in Deploy (checksum verified) -> connect output channels,
accept input channels -> Running -> run the task until the job's final commit or until
the driver goes away. Any failure is reported as Failed (with the user's traceback and the
operator's name) before the process exits with status 1.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import threading
import time
import traceback

from .. import ids, messages
from ..tls import Material
from ..errors import ProtocolError
from ..wire import give_up_after, server_socket
from . import build
from .channel import OutputChannel, accept_inputs
from .control import ControlLink
from .failure import failed_message
from .output import OperatorFailure, Output
from .task_health import measure
from .task_loop import ProcessTask
from .watchdog import Activity, Watchdog
from .writer import SnapshotWriter


def _run(control: ControlLink, listener: socket.socket, task_id: str, generation: int, secret: bytes,
         material: Material | None) -> None:
    deploy = control.receive()
    if not isinstance(deploy, messages.Deploy):
        raise RuntimeError(f"expected Deploy, got {deploy!r}")
    if control.sock is not None:
        # Self-fencing: cut off from the driver, this worker exits (its watchdog's next
        # heartbeat fails) before the driver, which waits the whole timeout, replaces it.
        give_up_after(control.sock, deploy.heartbeat_timeout / 2)
    activity = Activity()
    watchdog = Watchdog(control, task_id, activity, deploy.heartbeat_interval, deploy.task_timeout)
    watchdog.start()
    ready = build.prepare(deploy, task_id, generation, activity, tls=material is not None)
    if ready.final_committed:
        control.send(messages.Committed(task_id))
        return
    spec, chain, plan = ready.spec, ready.chain, ready.plan
    tail = chain.names[-1] if chain.names else (chain.source_name or task_id)
    outputs: list[Output] = []
    connect_error: list[BaseException] = []

    def connect_outputs() -> None:
        try:
            for o in spec.outputs:
                chans = []
                for cid in o.channels:
                    consumer = ids.consumer_of(cid)
                    chans.append(OutputChannel.connect(cid, deploy.peers[consumer], secret, deploy.connect_timeout,
                                                       material, deploy.channel_buffer))
                outputs.append(Output(o, chans, ready.key_fns.get(o.key_operator), tail, plan.max_parallelism))
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
            _report(control, messages.Failed(task_id, messages.FailureCause.OPERATOR, e.operator,
                                             "".join(traceback.format_exception(e.__cause__ or e)), e.fatal))
        else:
            _report(control, messages.Failed(task_id, messages.FailureCause.WRITER, None,
                                             "".join(traceback.format_exception(e)), False))
        os._exit(1)

    writer = SnapshotWriter(control, task_id, deploy.checkpoint_dir, writer_failed)
    task = ProcessTask(spec, chain, outputs, inputs, control, writer, ready.options, replay=ready.replay,
                       restored_finished=ready.restored_finished)
    channels = [ch for out in outputs for ch in out.channels]
    watchdog.counters = lambda: (task.records_in, task.records_out,
                                 sum(ch.send_seconds(time.perf_counter()) for ch in channels), *measure(task))
    control.send(messages.Running(task_id))
    task.run()
    writer.flush()
    chain.close()  # (a failing task exits without: the process going frees what it held)


def _report(control: ControlLink, failed: messages.Failed | None) -> None:
    if failed is None:
        return
    try:
        control.send(failed)
    except OSError:
        pass


TLS_LINE_MAX = 16 << 10  #: the material is about 1 KB of base64


def parse_secret(line: str, tls_line: str) -> tuple[bytes, Material | None]:
    """The attempt's secret (first stdin line) and its TLS material (second line, if any)."""
    try:
        secret = bytes.fromhex(line.strip())
    except ValueError:
        secret = b""
    if len(secret) < 16:
        raise SystemExit("abs-engine worker: no job secret on stdin (workers are started by an executor)")
    tls_line = tls_line.strip()
    if not tls_line:
        return secret, None
    try:
        return secret, Material.decode(tls_line)
    except ValueError as e:  # binascii.Error is a ValueError; so are msgpack's decoding errors
        raise SystemExit(f"abs-engine worker: the TLS material on stdin is malformed ({e})") from None


#: Set by the driver for the workers of a region restarted alone (executors/regions.py).
REGION_ATTEMPT_ENV = "ABS_ENGINE_REGION_ATTEMPT"


def run_worker(host: str, port: int, task_id: str, generation: int, bind_host: str, secret: bytes,
               material: Material | None) -> int:
    """One worker's life, from connecting to its driver to its exit status."""
    # A stuck worker's Python stacks, on request of the driver (SIGUSR1), even if the GIL
    # is held: to stderr, which the driver's console shows.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # A terminal's Ctrl-C reaches the whole process group: the driver decides what it means
    # (a savepoint, then a clean stop), and tells the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        control = ControlLink.connect((host, port), secret, material)
    except (OSError, ProtocolError) as e:
        print(f"abs-engine worker {task_id}: cannot reach the driver: {e}", file=sys.stderr)
        return 1
    if os.environ.get("PYTHONHASHSEED") in (None, "", "random"):
        _report(control, messages.Failed(
            task_id, messages.FailureCause.SETUP, None, "PYTHONHASHSEED is not fixed: user code that iterates sets or dicts of strings "
            "would behave differently in each worker and restart (keys are placed by key group, not by hash()). "
            "Start workers through an abs-engine executor (it sets it).", True))
        return 1
    # How many failovers came before this start (read by abs_engine.testing.fail_at): the
    # attempt's number, or the job's restarts for a region restarted alone (REGION_ATTEMPT_ENV).
    os.environ["ABS_ENGINE_ATTEMPT"] = os.environ.pop(REGION_ATTEMPT_ENV, str(generation))
    listener = server_socket(bind_host, backlog=256)
    control.send(messages.Hello(task_id, generation, bind_host, listener.getsockname()[1], os.getpid()))
    try:
        _run(control, listener, task_id, generation, secret, material)
        return 0
    except BaseException as e:  # noqa: BLE001 - reported (runtime/failure.py), then we die
        _report(control, failed_message(task_id, e))
        return 1
