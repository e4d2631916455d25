"""Every command of docs/performance.md parses: kgpt-train's with its flags, the benchmark's with the benchmark's.

The commands train or measure for minutes, so they are checked as far as a
command runs before it trains; what the cache and the plan do is tested by
tests/test_compilation_cache.py and tests/test_batching.py.
"""

import importlib.util
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import keras
import pytest

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
    defined = set(re.findall(r'flags\.DEFINE_\w+\(\s*"(\w+)"', source))  # the name may start the next line
    for module in re.findall(r"^import (\w+)", source, re.M):
        if (ROOT / "benchmarks" / f"{module}.py").exists():
            defined |= defined_flags(f"{module}.py")
    return defined


def test_the_benchmark_commands_use_their_flags():
    benchmarks = [(program, args) for _, program, args in commands() if program.startswith("benchmarks/")]
    assert {program for program, _ in benchmarks} == {
        "benchmarks/finetune.py",
        "benchmarks/execution.py",
        "benchmarks/profile_step.py",
        "benchmarks/backends.py",
        "benchmarks/model.py",
    }
    assert sum(program == "benchmarks/finetune.py" for program, _ in benchmarks) >= 4
    assert sum(program == "benchmarks/execution.py" for program, _ in benchmarks) >= 4
    # backends.py passes its --finetune_args and --pretrain_args on to finetune.py and model.py: theirs are checked too.
    inner = {"finetune_args": "benchmarks/finetune.py", "pretrain_args": "benchmarks/model.py"}
    for program, args in list(benchmarks):
        if program == "benchmarks/backends.py":
            for word in args:
                name, _, value = word[2:].partition("=")
                if name in inner:
                    benchmarks.append((inner[name], shlex.split(value)))
    assert any(program == "benchmarks/model.py" for program, _ in benchmarks)
    for program, args in benchmarks:
        defined = defined_flags(program.split("/")[1])
        for word in args:
            if word.startswith("--"):
                name = word[2:].split("=", 1)[0]
                assert name in defined or (name.startswith("no") and name[2:] in defined), (program, word)


def test_the_cache_commands_parse_and_pick_their_folder(tmp_path):
    train = [(environ, args) for environ, program, args in commands() if program == "kgpt-train"]
    assert len(train) == 4
    out = subprocess.run(
        [sys.executable, "-c", PARSE, json.dumps([args for _, args in train])],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    values = json.loads(out.stdout.splitlines()[-1])
    assert values == [None, "xla-cache", "none", None]
    assert [environ for environ, _ in train] == [{}, {}, {}, {"KGPT_COMPILATION_CACHE": "xla-cache"}]
    assert run.compilation_cache_dir(None, {"XDG_CACHE_HOME": str(tmp_path)}) == str(tmp_path / "kgpt" / "xla")
    assert run.compilation_cache_dir("none", {"KGPT_COMPILATION_CACHE": str(tmp_path)}) is None  # the flag wins


# The profile's shape shrunk to a tiny model (later flags override the command's own).
TINY_PROFILE = [
    "--num_layers",
    "1",
    "--hidden_dim",
    "16",
    "--num_heads",
    "2",
    "--intermediate_dim",
    "32",
    "--vocabulary_size",
    "97",
    "--sequence_length",
    "16",
    "--batch_size",
    "4",
    "--steps",
    "2",
    "--rounds",
    "1",
    "--warmup_steps",
    "1",
    "--top",
    "3",
]


def test_the_profile_command_runs_and_reads_its_trace(tmp_path):
    """The page's first profile_step.py command for this backend, on a tiny model: the step and the table.

    The other commands (--ab, --xla_options) are checked for their flags above: each adds a compilation.
    """
    backend = keras.config.backend()
    found = [
        args
        for environ, program, args in commands()
        if program == "benchmarks/profile_step.py" and environ.get("KERAS_BACKEND") == backend
    ]
    assert found, f"docs/performance.md has no profile_step.py command for {backend}"
    env = {
        **os.environ,
        "KERAS_BACKEND": backend,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [
            sys.executable,
            "benchmarks/profile_step.py",
            *found[0],
            *TINY_PROFILE,
            "--trace_dir",
            str(tmp_path / "trace"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert re.search(r"step, dropout masks kgpt: [\d.]+ ms", text)
    assert ("--ab" not in found[0]) or re.search(r"A/B: masks kgpt / masks keras, .*: [\d.]+x", text)
    rows = dict(re.findall(r"^\| ([^|]+?) \| [\d.]+ \| [\d.]+ \| [\d.]+ \| ([\d.]+) \|", text, re.M))
    # The model's work is attributed: the dense layers, attention, layer norm and the optimizer take time.
    for name in (
        "dense layers: matmuls and biases",
        "attention: scores, mask, softmax, x values",
        "layer norm",
        "optimizer update",
    ):
        assert name in rows, (name, text)
    assert sum(map(float, rows.values())) > 0
    assert list((tmp_path / "trace").glob("**/plugins/profile/*/*.xplane.pb"))
    if backend == "jax":
        assert re.search(r"step period in the trace \(start to start\): [\d.]+ ms", text)
        assert re.search(r"XLA cost analysis of the train step: [\d.]+ GFLOP", text)


@pytest.fixture(scope="module")
def step_profile():
    spec = importlib.util.spec_from_file_location("step_profile", ROOT / "benchmarks" / "step_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_trace_reader_takes_nested_ops_out(step_profile):
    # (start, duration, op): a while loop (0-10) holding two ops, and one op after it
    rows = step_profile.exclusive([(0, 10, "while"), (1, 3, "a"), (5, 4, "b"), (12, 2, "c")])
    assert dict(rows) == {"while": 3, "a": 3, "b": 4, "c": 2}


def test_the_compiled_text_names_each_op(step_profile):
    text = """HloModule jit_train_step

%fused_computation.1 (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %t = f32[4]{0} tanh(%p), metadata={op_name="jit(train_step)/jvp(m)/layer/feedforward_intermediate_dense/tanh"}
}

ENTRY %main.1 (a: f32[4], k: u32[8]) -> (f32[4], f32[]) {
  %a = f32[4]{0} parameter(0)
  %k = u32[8]{0} parameter(1)
  %tanh_fusion = f32[4]{0} fusion(%a), kind=kLoop, calls=%fused_computation.1
  %copy.3 = u32[8]{0} copy(%k)
  %reduce_fusion = (f32[], s32[]) fusion(%a), kind=kLoop, calls=%fused_computation.1, \
metadata={op_name="jit(train_step)/jvp(compile_loss)/while/body/reduce"}
  ROOT %tuple = (f32[4]{0}, f32[]) tuple(%tanh_fusion, %reduce_fusion)
}
"""
    ops = step_profile.hlo_instructions(text)
    opcode, path, movement, dtype = ops["tanh_fusion"]
    assert (opcode, movement, dtype) == ("fusion", False, "f32")
    assert step_profile.classify(path, opcode, movement) == "gelu"
    classes = {name: step_profile.classify(path, opcode, movement) for name, (opcode, path, movement, _) in ops.items()}
    assert classes["copy.3"] == "dropout: random bits"  # a copy of the RNG loop's uint32 state
    assert classes["reduce_fusion"].startswith("LM loss")
    assert step_profile.direction("jit(train_step)/transpose(jvp(gpt_backbone))/x") == "backward"
    assert step_profile.classify(
        "StatefulPartitionedCall/m/gpt_backbone_1/transformer_layer_1_1/transpose_2", "_MklTranspose"
    ).startswith("attention")
