"""Every command of docs/performance.md parses: kgpt-train's with its flags, the benchmark's with the benchmark's.

The commands train or measure for minutes, so they are checked as far as a
command runs before it trains; what the cache and the plan do is tested by
tests/test_compilation_cache.py and tests/test_batching.py.
"""

import json
import pathlib
import re
import shlex
import subprocess
import sys

from kgpt.jobs import run

ROOT = pathlib.Path(__file__).parents[1]
PARSE = """
import json, sys
from absl import flags
from kgpt.cli import train
values = []
for args in json.loads(sys.argv[1]):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["kgpt-train", *args])
    values.append(flags.FLAGS["compilation_cache"].value)
print(json.dumps(values))
"""


def commands():
    """`(environment, program, arguments)` of every command in the page's bash blocks."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / "docs" / "performance.md").read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            environ = dict(w.split("=", 1) for w in words if re.match(r"^[A-Z_]+=", w))
            words = [w for w in words if not re.match(r"^[A-Z_]+=", w)]
            if words[:1] == ["python"]:
                words = words[1:]
            found.append((environ, words[0], words[1:]))
    return found


def defined_flags(script):
    """The flags a benchmark script defines, with those of the benchmark modules it imports (execution.py:
    finetune.py's split and model flags)."""
    source = (ROOT / "benchmarks" / script).read_text()
    defined = set(re.findall(r'flags\.DEFINE_\w+\("(\w+)"', source))
    for module in re.findall(r"^import (\w+)", source, re.M):
        if (ROOT / "benchmarks" / f"{module}.py").exists():
            defined |= defined_flags(f"{module}.py")
    return defined


def test_the_benchmark_commands_use_their_flags():
    benchmarks = [(program, args) for _, program, args in commands() if program.startswith("benchmarks/")]
    assert {program for program, _ in benchmarks} == {"benchmarks/finetune.py", "benchmarks/execution.py"}
    assert sum(program == "benchmarks/finetune.py" for program, _ in benchmarks) >= 4
    assert sum(program == "benchmarks/execution.py" for program, _ in benchmarks) >= 4
    for program, args in benchmarks:
        defined = defined_flags(program.split("/")[1])
        for word in args:
            if word.startswith("--"):
                name = word[2:].split("=", 1)[0]
                assert name in defined or (name.startswith("no") and name[2:] in defined), (program, word)


def test_the_cache_commands_parse_and_pick_their_folder(tmp_path):
    train = [(environ, args) for environ, program, args in commands() if program == "kgpt-train"]
    assert len(train) == 4
    out = subprocess.run([sys.executable, "-c", PARSE, json.dumps([args for _, args in train])], capture_output=True,
                         text=True, check=True, cwd=ROOT)
    values = json.loads(out.stdout.splitlines()[-1])
    assert values == [None, "xla-cache", "none", None]
    assert [environ for environ, _ in train] == [{}, {}, {}, {"KGPT_COMPILATION_CACHE": "xla-cache"}]
    assert run.compilation_cache_dir(None, {"XDG_CACHE_HOME": str(tmp_path)}) == str(tmp_path / "kgpt" / "xla")
    assert run.compilation_cache_dir("none", {"KGPT_COMPILATION_CACHE": str(tmp_path)}) is None  # the flag wins
