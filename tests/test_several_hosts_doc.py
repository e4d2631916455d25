"""Every command of docs/several-hosts.md parses with kgpt-train's flags and describes processes that can run.

The guide's commands start processes on other hosts or take minutes, so they
are checked as far as a command runs before it trains: flag names and values
(absl parses them), and the processes they describe (`kgpt.parallel.placement.resolve`).
What they do is tested by tests/test_cluster.py with the same flags on 127.0.0.1.
"""

import json
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from kgpt.parallel import placement

GUIDE = pathlib.Path(__file__).parents[1] / "docs" / "several-hosts.md"
PARSE = """
import json, sys
from absl import flags
from kgpt.cli import train
flags.FLAGS(sys.argv)
print(json.dumps({name: flags.FLAGS[name].value for name in ("coordinator_address", "num_processes", "process_id",
                                                             "task", "distribution")}))
"""


def commands():
    """`(environment, kgpt-train arguments)` of every kgpt-train line in the guide's bash blocks."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), re.S):
        for line in block.splitlines():
            if "kgpt-train" not in line or line.lstrip().startswith("#"):
                continue
            before, _, after = line.partition("kgpt-train")
            # Variables set for the command (NAME=value ...) lead the line; a launcher (srun, gcloud) does not.
            leading = re.match(r"^((?:[A-Z_]+=(?:'[^']*'|\S+)\s+)*)", before).group(1)
            environ = dict(part.split("=", 1) for part in shlex.split(leading))
            args = shlex.split(after.rstrip().rstrip("&").rstrip('"').replace("$JOB_COMPLETION_INDEX", "3"))
            found.append((environ, args))
    return found


def test_the_guide_has_its_commands():
    assert len(commands()) >= 6


@pytest.mark.parametrize(
    "environ, args", commands(), ids=lambda value: " ".join(value)[:60] if isinstance(value, list) else None
)
def test_a_command_of_the_guide_parses_and_its_processes_can_run(environ, args):
    result = subprocess.run([sys.executable, "-c", PARSE, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    values = json.loads(result.stdout.strip().splitlines()[-1])
    backend = "tensorflow" if environ.get("KERAS_BACKEND") == "tensorflow" else "jax"
    found = placement.resolve(
        values["coordinator_address"], values["num_processes"], values["process_id"], environ=environ, backend=backend
    )
    flags_or_environment = environ.get("TF_CONFIG") or values["coordinator_address"]
    if flags_or_environment:  # the line says where the processes are: they are several (or JAX finds them)
        assert found.several or found.coordinator == "auto", found
