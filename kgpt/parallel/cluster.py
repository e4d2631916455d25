"""Several processes, one run: joining them, checking they agree, and what they exchange.

A run on several hosts is the same command started once per process (the
hosts of a TPU pod slice, `srun` under SLURM, a Kubernetes indexed Job, or by
hand):

    kgpt-train --task lm ... --coordinator_address 10.0.0.1:1234 --num_processes 2 --process_id 0   # host 0
    kgpt-train --task lm ... --coordinator_address 10.0.0.1:1234 --num_processes 2 --process_id 1   # host 1

Without those flags the environment decides (`kgpt.parallel.placement`): on JAX, SLURM's,
Open MPI's and Cloud TPU's variables (`--coordinator_address auto` hands the
detection to `jax.distributed`, which also knows Kubernetes and mpi4py); on
TensorFlow, `TF_CONFIG`. Nothing found means one process.

The processes are joined by the backend's own runtime, never by kgpt's code:
JAX through `jax.distributed.initialize` (gloo collectives on CPUs),
TensorFlow through `tf.distribute.MultiWorkerMirroredStrategy`. `start()`
must run before the backend computes anything: the commands call it first,
and `kgpt.jobs` call it when a config names several processes.

Process 0 (the chief) writes the outputs; every process trains on its slice
of each global batch (`kgpt.parallel.distribute.local_rows`).

Example (two processes on one machine, each in its own terminal):
```python
from kgpt.parallel import cluster, placement

cluster.start(placement.resolve("127.0.0.1:8476", num_processes=2, process_id=0))   # 1 in the other
cluster.check_agreement({"settings": {...}})   # a process started differently stops every one, by name
```
"""

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import re
import sys
import threading
import time

from kgpt import _quiet
from kgpt.errors import ClusterError, ConfigError
from kgpt.parallel import multi_worker, placement

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 300  # seconds every process waits for the others to join (JAX's own default)
PROG = "kgpt"  # how messages name the command; kgpt.cli.common sets it (kgpt-train, ...)


_current = placement.Cluster()
_strategy = None  # TensorFlow's MultiWorkerMirroredStrategy, once started
_tf_gather = None  # its compiled all-gather
_started = False


def current():
    """The `kgpt.parallel.placement.Cluster` this process joined (`Cluster()` until `start`)."""
    return _current


def strategy():
    """TensorFlow's `MultiWorkerMirroredStrategy` of the run, or None (JAX, or one process)."""
    return _strategy


def is_chief():
    return _current.chief


# --- joining them -------------------------------------------------------------------------------------


def fail(message, code=1):
    """Prints `kgpt: error: message` and ends this process now.

    Used where the runtime cannot be left to unwind: a process whose peers are
    gone would otherwise wait for them at exit (JAX's shutdown barrier) or in
    a collective that never completes.
    """
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os.write(2, f"{PROG}: error: {message}\n".encode("utf-8", "replace"))
    os._exit(code)


def end_now(code=0):
    """Ends this process of a run of several at once, its work done; nothing for one process.

    After the exit handlers (JAX's shutdown waits there for every process, so
    process 0's coordinator outlives the others' last call) the interpreter's
    own teardown took 10-60 s on JAX with another process's devices attached:
    each process stays alive that long after its last line. Nothing is left
    to write by then (kgpt's files are closed as written).
    """
    if not (_started and _current.several):
        return
    import atexit

    atexit._run_exitfuncs()  # logging's flush, JAX's shutdown, TensorBoard's writers
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)


# A watchdog child: prints the message if its parent has not closed the pipe after the given seconds.
_WATCHDOG = r"""
import os, runpy, select, signal, sys
try:
    runpy.run_path(sys.argv[1])["die_with_parent"](int(sys.argv[2]))
except Exception:  # without it the child still ends when the pipe does
    pass
if not select.select([0], [], [], float(sys.argv[3]))[0]:
    os.write(2, sys.argv[4].encode("utf-8", "replace"))
"""


class deadline:  # noqa: N801 - a context manager used like a function
    """Ends the process with `message` and exit code 1 if the block has not finished after `seconds`.

    The runtimes' start-up blocks in C++ holding the interpreter (TensorFlow
    waits for every worker forever), so neither a thread nor a signal
    handler of this process could act: a watchdog child prints the message,
    and `faulthandler`'s own C thread ends this process a second later.
    """

    def __init__(self, seconds, message):
        self.seconds, self.message = seconds, message
        self._child = self._devnull = None

    def __enter__(self):
        import faulthandler
        import subprocess

        from kgpt import _children

        line = f"{PROG}: error: {self.message}\n"
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG, _children.__file__, str(os.getpid()), str(self.seconds), line],
                stdin=subprocess.PIPE,
            )
        except OSError:
            self._child = None
        self._devnull = open(os.devnull, "w")
        faulthandler.dump_traceback_later(self.seconds + 1, exit=True, file=self._devnull)
        return self

    def __exit__(self, *exc):
        import faulthandler

        faulthandler.cancel_dump_traceback_later()
        self._devnull.close()
        if self._child is not None:
            self._child.stdin.close()  # the watchdog sees the end of its input and exits
            self._child.wait()


def start(cluster, timeout=DEFAULT_TIMEOUT):
    """Joins the run's processes through the backend's runtime; nothing to do for one process.

    Must run before the backend computes anything. Once joined, the same
    place again (however it was found: flags, `auto`, the environment) does
    nothing; another one is an error (a runtime joins once).
    """
    global _current, _strategy, _started
    if _started:
        place = (cluster.num_processes, cluster.process_id)
        if cluster.several and cluster.coordinator != "auto" and place != (_current.num_processes, _current.process_id):
            raise ConfigError(
                f"This process already joined a run as {_current.describe()}; it cannot join another "
                f"({cluster.describe()})."
            )
        return _current
    if not cluster.several and cluster.coordinator != "auto":
        return _current
    import keras

    backend = keras.config.backend()
    where = (
        cluster.coordinator
        if cluster.coordinator not in (None, "auto")
        else f"the address jax.distributed finds from {cluster.found_by}"
    )
    waiting = (
        f"the {cluster.num_processes or 'detected'} processes did not all join within {timeout} s (process "
        f"{cluster.process_id}, coordinator {where}): check that every process was started with the same "
        f"--coordinator_address and --num_processes, that the address is reachable, and that no process "
        f"stopped before joining (its log says why) (--startup_timeout)."
    )
    with deadline(timeout, waiting):
        if backend == "jax":
            cluster = _start_jax(cluster, timeout + 60, where)  # JAX's own limit aborts the process: ours comes first
        elif backend == "tensorflow":
            _strategy = _start_tensorflow(cluster)
        else:
            raise ConfigError(f"Several processes run on the jax and tensorflow backends, not {backend!r}.")
    _current, _started = cluster, True
    logger.info(
        f"Joined a run of {cluster.num_processes} processes as process {cluster.process_id} "
        f"({cluster.found_by}{f', coordinator {cluster.coordinator}' if cluster.coordinator else ''})"
        + ("." if cluster.chief else "; process 0 reports the progress, this one only its warnings.")
    )
    if not cluster.chief:
        logging.getLogger("kgpt").setLevel(logging.WARNING)
        if backend == "jax":  # JAX aborts this process when process 0 dies: the filter names it instead
            cause = (
                f"the coordination service it held at {where} stopped answering, so JAX aborted this process: "
                f"exit code 134"
            )
            _quiet.note_lost_coordinator(
                f"{PROG}: error: " + _lost_message(f"process 0 of {cluster.num_processes}", cause, cluster.process_id)
            )
    return cluster


def _start_jax(cluster, timeout, where):
    import jax

    if "JAX_CPU_COLLECTIVES_IMPLEMENTATION" not in os.environ:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices of other hosts
    kwargs = (
        {}
        if cluster.coordinator == "auto" or cluster.found_by not in ("flags",)
        else dict(
            coordinator_address=cluster.coordinator, num_processes=cluster.num_processes, process_id=cluster.process_id
        )
    )
    try:
        jax.distributed.initialize(**kwargs, initialization_timeout=timeout)
    except Exception as e:  # noqa: BLE001 - the runtime raises RuntimeError/XlaRuntimeError/ValueError
        raise ClusterError(
            f"Process {cluster.process_id} could not join the run at {where}: {_first_line(e)}"
        ) from None
    if cluster.coordinator == "auto" or cluster.found_by != "flags":
        cluster = dataclasses.replace(cluster, num_processes=jax.process_count(), process_id=jax.process_index())
    return cluster


def _start_tensorflow(cluster):
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": list(cluster.addresses)}),
        task_type="worker",
        task_id=cluster.process_id,
        rpc_layer="grpc",
    )
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    except Exception as e:  # noqa: BLE001 - gRPC and TensorFlow raise several types
        raise ClusterError(
            f"Process {cluster.process_id} could not join the run ({', '.join(cluster.addresses)}): {_first_line(e)}"
        ) from None
    multi_worker.apply()
    return strategy


def _first_line(error):
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


# --- what the processes exchange ------------------------------------------------------------------------


def allgather(data):
    """Every process's `data` (bytes), in process order; `[data]` with one process.

    A collective of the backend's runtime: every process must call it at the same point.
    """
    if not _current.several:
        return [bytes(data)]
    import numpy as np

    sizes = _allgather_array(np.asarray([len(data)], np.int32)).reshape(-1)
    width = max(1, int(sizes.max()))  # an empty collective crashes TensorFlow's
    padded = np.zeros(width, np.int32)  # TensorFlow's collectives take no 8-bit integers
    padded[: len(data)] = np.frombuffer(bytes(data), np.uint8)
    rows = _allgather_array(padded).reshape(_current.num_processes, width).astype(np.uint8)
    return [rows[i, : int(sizes[i])].tobytes() for i in range(_current.num_processes)]


def on_chief(fn, what):
    """Runs `fn()` on process 0 alone; every process gets its result (JSON-able), or stops with its error.

    For what one process must do for all of them, such as claiming the
    output directory or writing a task's embedded data.
    """
    if not _current.several:
        return fn()
    result = error = None
    if is_chief():
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - told to the other processes, then raised here
            error = e
    value = None if error is not None or not isinstance(result, (str, int, float, list, dict, type(None))) else result
    told = json.loads(allgather(json.dumps([value, None if error is None else str(error)]).encode())[0])
    if error is not None:
        raise error
    if told[1] is not None:
        raise ClusterError(f"Process 0 stopped while {what}: {told[1]}")
    return result if is_chief() else told[0]


def _allgather_array(array):
    """`[num_processes * len(array)]`: every process's 1-D int32 `array`, in process order."""
    import numpy as np

    if _strategy is None:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(array)).reshape(-1)
    global _tf_gather
    import tensorflow as tf

    if _tf_gather is None:  # compiled: eagerly, each collective costs ~50 ms; inside a tf.function ~2 ms

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])  # one trace for every length
        def gather(value):
            return _strategy.gather(_strategy.run(tf.identity, (value,)), axis=0)

        _tf_gather = gather
    gathered = _tf_gather(tf.constant(array, tf.int32)).numpy()
    # Each process may hold several replicas (GPUs), each with the same value: keep one per process.
    return gathered.reshape(_current.num_processes, -1, len(array))[:, 0].reshape(-1)


def barrier():
    """Returns once every process has reached it (a collective)."""
    allgather(b"")


def any_process(flag):
    """Whether `flag` is true on any process (each contributes its own): one small collective."""
    if not _current.several:
        return bool(flag)
    import numpy as np

    return bool(_allgather_array(np.asarray([1 if flag else 0], np.int32)).any())


def source_fingerprint():
    """kgpt's version and a hash of its source files: processes running different code disagree on it."""
    from kgpt import __version__

    digest = hashlib.sha256()
    root = pathlib.Path(__file__).resolve().parents[1]
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return f"{__version__} (source {digest.hexdigest()[:12]})"


def check_agreement(what, hint="Start every process with the same command (only --process_id differs)."):
    """Raises `ClusterError` unless every process passes the same `what` (a JSON-able dict); names who differs.

    Called by each job before it reads or writes anything, with its settings,
    so a process started with another flag or another kgpt stops every process.
    """
    if not _current.several:
        return
    mine = {"kgpt": source_fingerprint(), **what}
    others = [json.loads(b) for b in allgather(json.dumps(mine, sort_keys=True, default=str).encode())]
    chief = others[0]
    for index, theirs in enumerate(others[1:], start=1):
        if theirs == chief:
            continue
        lines = _differences(chief, theirs)
        error = ClusterError(
            f"Process {index} was started with other settings than process 0: {'; '.join(lines[:5])}"
            f"{' ...' if len(lines) > 5 else ''}. {hint}"
        )
        # Every process found this in the same gathered data. One more collective before any exits: a process
        # whose gather had returned could otherwise exit while another was still receiving it (TensorFlow's
        # ring then reports only "Socket closed" there). A process gone after this point was done reading.
        try:
            any_process(True)
        except Exception:  # noqa: BLE001 - the other process stopped first: it had the data; this error stands
            pass
        raise error


def _differences(a, b, prefix=""):
    lines = []
    for key in sorted(set(a) | set(b), key=str):
        x, y = a.get(key), b.get(key)
        if x == y:
            continue
        if isinstance(x, dict) and isinstance(y, dict):
            lines += _differences(x, y, f"{prefix}{key}.")
        else:
            name = f"--{key}" if prefix == "settings." else f"{prefix}{key}"
            lines.append(f"{name} is {x!r} on process 0, {y!r} there")
    return lines


# What the runtimes' errors say when another process of the run went away (gloo on CPUs, gRPC, the coordination
# service), in lower case.
_LOST = (
    "gloo",
    "connection reset by peer",
    "connection closed by peer",
    "heartbeat",
    "collective ops is aborted",
    "socket closed",
    "failed to connect to all addresses",
    "stopped sending heartbeats",
)


def lost_process(error):
    """Whether `error`, raised by the JAX or TensorFlow runtime in a collective, means another process stopped.

    Only the runtimes' own errors count (never one of kgpt's, whatever its
    text says): an error in a process's own work keeps its message.
    """
    if not _current.several:
        return False
    kind = type(error)
    if kind.__module__.startswith("kgpt") or not (
        kind.__module__.split(".")[0] in ("jax", "jaxlib", "tensorflow") or kind in (ValueError, RuntimeError)
    ):
        return False
    text = str(error).lower()
    return any(marker in text for marker in _LOST)


def stop_lost(error):
    """Ends this process with one line naming the process that stopped, after another process of the run did.

    Exiting normally would wait for the lost process at the runtime's shutdown
    barrier (minutes on JAX, forever on TensorFlow), so this process ends at
    once (`fail`); the last checkpoint is what a rerun resumes from.
    """
    lost, count = lost_processes(error), _current.num_processes
    if not lost:
        who = f"another of the {count} processes"
    else:
        who = f"process{'es' if len(lost) > 1 else ''} {', '.join(map(str, lost))} of {count}"
    fail(_lost_message(who, _cause(error), _current.process_id))


def _lost_message(who, cause, me):
    return (
        f"{who} stopped ({cause}); process {me} stopped too. "
        f"Rerun every process with the same command to resume from the last checkpoint."
    )


def lost_processes(error):
    """The processes `error` says went away: the task the runtime names, else the other of two, else those that
    missed the `roll_call`; empty if unknown.

    TensorFlow's errors name the peer as `/job:worker/replica:0/task:N` or by
    its address; JAX's heartbeat errors as `task:N`; gloo's name only the
    peer's socket, which maps to no process.
    """
    text, me = str(error), _current.process_id
    named = {int(n) for n in re.findall(r"/task:(\d+)", text)} | {
        i for i, address in enumerate(_current.addresses or ()) if address in text
    }
    named.discard(me)
    if len(named) == 1:
        return list(named)
    others = [i for i in range(_current.num_processes or 0) if i != me]
    return others if len(others) == 1 else roll_call(_current.num_processes, me) or []


ROLL_CALL_SECONDS = 10  # how long the survivors of a JAX run wait for each other's answer


def roll_call(count, me, seconds=ROLL_CALL_SECONDS):
    """The processes of a JAX run of `count` that do not answer in `seconds`, asked after a failed collective.

    Gloo's error names only a socket. Every survivor saw the same collective
    fail, so each writes its id to the coordination service's key-value store
    and reads the others'; the store is process 0's, so one that cannot be
    reached means process 0 is gone. None when this is no JAX run or the
    runtime says something else.
    """
    if "jax" not in sys.modules:  # a TensorFlow run: importing JAX now would only cost its start-up
        return None
    try:
        from jax._src import distributed  # the client jax.distributed.initialize made; JAX has no public handle

        client = distributed.global_state.client
    except (ImportError, AttributeError):
        return None
    if client is None:
        return None
    answer, seen = {}, set()

    def ask():
        deadline = time.monotonic() + seconds
        try:
            client.key_value_set(f"kgpt/alive/{me}", "1", allow_overwrite=True)
            while True:
                seen.update(int(key.rsplit("/", 1)[-1]) for key, _ in client.key_value_dir_get("kgpt/alive/"))
                if len(seen) >= count - 1 or time.monotonic() > deadline:
                    answer["missing"] = sorted(set(range(count)) - seen)
                    break
                time.sleep(0.2)
        except Exception as e:  # noqa: BLE001 - the runtime's error types vary by version
            # Process 0 answered, then ended (its store with it): who else is gone is not known.
            if 0 not in seen and any(m in str(e).lower() for m in ("unavailable", "connection", "socket closed")):
                answer["missing"] = [0]
            return
        if me == 0:  # the store ends with this process: the others may not have read every answer yet
            time.sleep(2)

    thread = threading.Thread(target=ask, daemon=True)  # a store that never answers must not hold this process
    thread.start()
    thread.join(seconds + 5)
    return answer.get("missing")


def _cause(error):
    """What the runtime's error says happened to the other process, in a few words."""
    text = str(error).lower()
    if "heartbeat" in text:
        return "it stopped sending heartbeats"
    if any(marker in text for marker in ("connection reset", "connection closed", "socket closed")):
        return "its connection closed"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0][:160] if lines else type(error).__name__
