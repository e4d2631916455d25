"""Where this process stands in a run of several: the flags, or else the environment, read into a `Cluster`.

Nothing here joins the processes (`kgpt.parallel.cluster.start` does) or
imports a backend: a command decides from this whether it runs on several
processes before TensorFlow or JAX starts.

Example:
```python
from kgpt.parallel import placement

placement.resolve("10.0.0.1:8476", num_processes=2, process_id=1)   # Cluster(2, 1, "10.0.0.1:8476", ...)
placement.resolve()                                                 # from SLURM, Open MPI, TF_CONFIG, ...
```
"""

import dataclasses
import json
import os

from kgpt import checks
from kgpt.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Where this process stands in a run: `process_id` of `num_processes`.

    Attributes:
        num_processes: processes in the run (1: a run on one host).
        process_id: this process, from 0 (the chief, which writes the outputs).
        coordinator: JAX's coordinator `HOST:PORT`, `"auto"` (JAX detects it), or None.
        addresses: TensorFlow's worker addresses, one per process, in process order.
        found_by: what set it up: "flags", "TF_CONFIG", "SLURM", "Open MPI", "Cloud TPU", or "" (one process).
    """

    num_processes: int = 1
    process_id: int = 0
    coordinator: str | None = None
    addresses: tuple = ()
    found_by: str = ""

    @property
    def chief(self):
        """Whether this process writes the run's outputs (process 0)."""
        return self.process_id == 0

    @property
    def several(self):
        return self.num_processes > 1

    def describe(self):
        if not self.several:
            return "one process"
        return f"process {self.process_id} of {self.num_processes} ({self.found_by})"


def _address(value, flag="--coordinator_address"):
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{flag}: expected HOST:PORT (e.g. 10.0.0.1:8476), got {value!r}.")
    return f"{host}:{int(port)}"


def _int(text, name):
    """The integer an environment variable's `text` spells (as `kgpt.checks.number_text` reads numbers)."""
    number = checks.number_text(str(text))
    if not number.is_integer():  # NaN and infinity are not
        raise ConfigError(f"{name} must be an integer, got {text!r}.")
    return int(number)


def _place(value, name, minimum):
    try:
        return checks.positive_int(value, name, minimum)
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None


def _environment(environ, backend):
    """`(found_by, num_processes, process_id, addresses)` the environment describes, or None."""
    if backend == "tensorflow":
        if environ.get("TF_CONFIG"):
            return _tf_config(environ["TF_CONFIG"])
        return None
    slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
    if all(k in environ for k in slurm):
        return "SLURM", _int(environ["SLURM_NTASKS"], "SLURM_NTASKS"), _int(environ["SLURM_PROCID"], "SLURM_PROCID"), ()
    if "OMPI_MCA_orte_hnp_uri" in environ and "OMPI_COMM_WORLD_SIZE" in environ:
        return (
            "Open MPI",
            _int(environ["OMPI_COMM_WORLD_SIZE"], "OMPI_COMM_WORLD_SIZE"),
            _int(environ.get("OMPI_COMM_WORLD_RANK", 0), "OMPI_COMM_WORLD_RANK"),
            (),
        )
    hosts = environ.get("TPU_WORKER_HOSTNAMES") or environ.get("TPU_PROCESS_ADDRESSES")
    if hosts and "," in hosts:
        return "Cloud TPU", len(hosts.split(",")), _int(environ.get("TPU_WORKER_ID", 0), "TPU_WORKER_ID"), ()
    return None


def _tf_config(text):
    try:
        config = json.loads(text)
        cluster, task = config["cluster"], config["task"]
        jobs = [*cluster.get("chief", []), *cluster.get("worker", [])]
        index = int(task["index"]) + (len(cluster.get("chief", [])) if task["type"] == "worker" else 0)
        if task["type"] not in ("chief", "worker") or not jobs:
            raise ValueError(f"task type {task['type']!r} (kgpt runs chief and worker tasks)")
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f'TF_CONFIG cannot be read ({e}): expected {{"cluster": {{"worker": ["HOST:PORT", ...]}}, '
            f'"task": {{"type": "worker", "index": I}}}}.'
        ) from None
    return "TF_CONFIG", len(jobs), index, tuple(_address(a, "TF_CONFIG") for a in jobs)


def resolve(coordinator_address=None, num_processes=None, process_id=None, environ=None, backend=None):
    """The `Cluster` the flags (or else the environment) describe; a `ConfigError` naming the flag if they cannot run.

    Args:
        coordinator_address: `HOST:PORT` of process 0's coordinator (JAX), or
            `"auto"` for `jax.distributed`'s own detection. On TensorFlow one
            address puts process i at PORT + i of that host (one machine);
            several hosts need every process's address, comma-separated, in
            process order (or `TF_CONFIG`).
        num_processes, process_id: this process's place; all three flags go together.
        environ: the environment to read (default `os.environ`).
        backend: `"jax"` or `"tensorflow"` (default: Keras').
    """
    environ = os.environ if environ is None else environ
    if backend is None:
        import keras

        backend = keras.config.backend()
    given = {"--coordinator_address": coordinator_address, "--num_processes": num_processes, "--process_id": process_id}
    if coordinator_address == "auto":
        if backend != "jax":
            raise ConfigError(
                "--coordinator_address auto asks jax.distributed to find the processes; on TensorFlow "
                "pass every process's address, or set TF_CONFIG."
            )
        return Cluster(num_processes or 0, process_id or 0, "auto", (), "jax.distributed")
    if any(v is not None for v in given.values()):
        missing = [k for k, v in given.items() if v is None]
        if missing:
            raise ConfigError(
                f"{', '.join(missing)} missing: a run on several processes takes --coordinator_address, "
                f"--num_processes and --process_id together."
            )
        return _from_flags(coordinator_address, num_processes, process_id, backend)
    found = _environment(environ, backend)
    if found is None or found[1] <= 1:
        return Cluster()
    found_by, count, index, addresses = found
    _check_place(count, index, found_by)
    return Cluster(count, index, None, addresses, found_by)


def _check_place(count, index, what="--num_processes"):
    """Refuses a process outside `0..count - 1`; `count` >= 1 (the flag's `_place`; the environment's is > 1)."""
    if not 0 <= index < count:
        raise ConfigError(
            f"{'--process_id' if what == '--num_processes' else what}: process {index} is not one of "
            f"the {count} processes (0..{count - 1})."
        )


def _from_flags(address, count, index, backend):
    count, index = _place(count, "--num_processes", 1), _place(index, "--process_id", 0)
    _check_place(count, index)
    addresses = [_address(a.strip()) for a in str(address).split(",")]
    if len(addresses) not in (1, count):
        raise ConfigError(
            f"--coordinator_address: {len(addresses)} addresses for {count} processes; give one (process "
            f"0's) or one per process."
        )
    if count == 1:
        return Cluster()
    if backend == "tensorflow" and len(addresses) == 1:
        host, port = addresses[0].rsplit(":", 1)
        if int(port) + count - 1 > 65535:
            raise ConfigError(
                f"--coordinator_address {addresses[0]}: ports {port}..{int(port) + count - 1} do not fit."
            )
        addresses = [f"{host}:{int(port) + i}" for i in range(count)]
    return Cluster(count, index, addresses[0], tuple(addresses) if backend == "tensorflow" else (), "flags")
