"""Shared fixtures: tiny models (2 layers, hidden 16) so the suite runs in minutes."""

import atexit
import gc
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types

# JAX: keep every XLA program compiled during the session on disk and reuse it
# when the same program comes again (each new model's train step is a new trace
# but often the same program), here and in the subprocesses tests start (they
# inherit the variable). Set before JAX is imported; the results do not change.
# Each pytest process (each xdist worker) gets its own folder: JAX writes cache
# entries in place, so two processes must not share one while both write.
_cache, _worker = os.environ.get("JAX_COMPILATION_CACHE_DIR"), os.environ.get("PYTEST_XDIST_WORKER")
if _cache is None:
    _cache = tempfile.mkdtemp(prefix="kgpt-tests-xla-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
if _worker and os.path.basename(_cache) != _worker:  # under the main process's folder, removed with it
    _cache = os.path.join(_cache, _worker)
os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# XLA's CPU backend without its costly LLVM passes: the tests' models are tiny, so compiling is most of their
# time. On JAX also at optimization level 0: the whole JAX suite took 983 s so against 1221 s with the LLVM
# flag alone (one uncontended run each), though a paper-size model's initialisation is 1.2x slower. Processes
# the tests start inherit it; benchmarks, run as scripts, do not.
_FAST_COMPILE = "--xla_llvm_disable_expensive_passes=true"
if os.environ.get("KERAS_BACKEND") == "jax":  # read before Keras is imported; TensorFlow compiles little with XLA
    _FAST_COMPILE += " --xla_backend_optimization_level=0"
if _FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE}".strip()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kgpt  # noqa: E402

TINY = dict(
    vocabulary_size=97,
    num_layers=2,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    max_sequence_length=16,
)


# Files whose tests take longest (minutes on a 2-core CPU), run first: with pytest-xdist
# (`--dist loadfile`, files in this order) the last files to start are short ones, so
# neither worker is left alone with a long file at the end. The rest run in name order: a long
# file late in the alphabet (test_use_trained.py, test_quantize.py) is listed here too.
SLOW_FILES = (
    "test_cluster.py",
    "test_distribute.py",
    "test_analysis.py",
    "test_paper_tasks.py",
    "test_documented_commands.py",
    "test_generic_tasks.py",
    "test_pretrain.py",
    "test_finetune.py",
    "test_use_trained.py",
    "test_keras_hub_tokenizer.py",
    "test_quantize.py",
    "test_remote_output.py",
    "test_keras_hub_conformance.py",
    "test_plugin_doc.py",
    "test_causal_lm.py",
    "test_task_contract.py",
    "test_text_task.py",
    "test_dry_run.py",
    "test_plugins.py",
    "test_backbone.py",
    "test_task_model.py",
    "test_lm_loss.py",
)


def one_backend(name):
    """Marks a test whose subject does not depend on the Keras backend (a CLI's flags, a file format, a plugin's
    discovery) though it trains a tiny model: it runs on backend `name`, and on the other only under `-m large`.

    The suite runs once per backend on 2 cores; what is the same code on both is paid for once. What each
    backend does its own way (training steps, checkpoints, processes, precision) keeps running on both.
    """
    return pytest.mark.large if keras.config.backend() != name else pytest.mark.one_backend(name)


def pytest_collection_modifyitems(items):
    slow = {name: rank for rank, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: slow.get(item.path.name, len(slow)))  # stable: the rest keep their order


def pytest_report_header(config):
    return f"keras backend: {keras.config.backend()}; XLA compilation cache: {os.environ['JAX_COMPILATION_CACHE_DIR']}"


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)


@pytest.fixture(autouse=True)
def _kgpt_logger():
    """Leaves the "kgpt" logger as the test found it (a command run in-process installs its handler)."""
    logger = logging.getLogger("kgpt")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


# A full garbage collection scans every object the process holds: in a test worker that has imported TensorFlow,
# JAX and Keras (half a million objects) and run hundreds of tests, seconds each, and the tests run many (Python's
# own, `gc.collect()` in Keras' quantize per kernel it replaces and in `keras.backend.clear_session`). What is
# alive once the tests are collected, and what a test file leaves alive after its last test (caches, compiled
# programs), is frozen (`gc.freeze`): later collections scan only what the running file made. A frozen object is
# still freed when its last reference goes; only a reference cycle that it joins later would wait for the end.
def pytest_collection_finish(session):
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="module", autouse=True)
def _freeze_what_the_file_leaves():
    yield
    gc.collect()
    gc.freeze()


@pytest.fixture
def progress():
    """kgpt's progress lines on stdout, as `kgpt.log.to_stdout()` gives a script (capsys reads them)."""
    kgpt.log.to_stdout()


@pytest.fixture
def backbone():
    return kgpt.GPTBackbone(**TINY)


@pytest.fixture
def causal_lm(backbone):
    return kgpt.GPTCausalLM(backbone)


def random_inputs(batch=3, length=12, vocabulary_size=TINY["vocabulary_size"], seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocabulary_size, (batch, length)).astype("int32")
    return {"token_ids": ids, "padding_mask": np.ones_like(ids)}


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def char_tokenizer():
    """A GPTTokenizer over single characters (no merges): a ~140-id vocabulary for fast tests."""
    chars = "abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"-()"
    encoder = {"<unk>": 0}
    for c in chars:
        encoder[c] = len(encoder)
    for c in chars:
        encoder[c + "</w>"] = len(encoder)
    return kgpt.GPTTokenizer(encoder, [])


def newline_tokenizer():
    """The conftest character tokenizer plus the newline token GPT-1's vocabulary ends with."""
    base = char_tokenizer()
    encoder = {s: i for s, i in base.encoder.items() if s not in base.special_tokens}
    encoder["\n</w>"] = len(encoder)
    return kgpt.GPTTokenizer(encoder, [])


def text_lm(tokenizer, sequence_length=16):
    from kgpt.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor

    backbone = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": tokenizer.vocabulary_size()})
    return kgpt.GPTCausalLM(backbone, preprocessor=GPTCausalLMPreprocessor(tokenizer, sequence_length))


@pytest.fixture
def tiny_preset(tmp_path):
    """A preset directory (backbone config + weights + tokenizer) with a tiny model."""
    tokenizer = char_tokenizer()
    backbone = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": tokenizer.vocabulary_size(), "max_sequence_length": 128})
    path = tmp_path / "preset"
    backbone.save_to_preset(str(path))
    tokenizer.save_to_preset(str(path))
    return str(path)


def checkpoint_step(folder):
    """The step of the latest complete checkpoint in `folder` (a run's `checkpoint/`), 0 before there is one."""
    try:
        name = json.loads((folder / "latest.json").read_text())["checkpoint"]
        return json.loads((folder / name / "state.json").read_text())["step"]
    except (OSError, ValueError, KeyError):  # not written yet (each file is replaced or renamed into place)
        return 0


def kill_at_step(process, folder, step, timeout=300):
    """SIGKILLs `process` once `folder` holds a checkpoint of `step` or later (a bounded wait); returns its step."""
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None and checkpoint_step(folder) < step:
        time.sleep(0.02)
    assert process.poll() is None, "the run ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    return checkpoint_step(folder)


def cli(monkeypatch, capsys, module, *args):
    """Runs the command `module.run()` in this process with `args`: `(exit code, stdout, stderr)`, every line."""
    from absl import flags

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")  # no descriptor-level filter: capsys sees everything
    monkeypatch.delenv("KGPT_TRACEBACK", raising=False)
    monkeypatch.setattr(sys, "argv", [module.__name__, *args])
    flags.FLAGS.unparse_flags()
    try:
        with pytest.raises(SystemExit) as exited:
            module.run()
    finally:
        flags.FLAGS.unparse_flags()
    out = capsys.readouterr()
    return exited.value.code, out.out, out.err


@pytest.fixture
def command(monkeypatch, capsys):
    """`command(module, *args, cwd=None)`: `cli` as `subprocess.run` gives a run, `.returncode` (0 on success),
    `.stdout` and `.stderr`; for tests of a command's output and exit code, not of its process (a start of the
    command in a new process is seconds of imports)."""

    def run(module, *args, cwd=None):
        with monkeypatch.context() as patch:
            if cwd is not None:
                patch.chdir(cwd)
            code, out, err = cli(patch, capsys, module, *args)
        return types.SimpleNamespace(returncode=code or 0, stdout=out, stderr=err)

    return run


_COMMANDS = """
import contextlib, importlib, io, json, logging, os, sys
from absl import flags

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"  # as in `cli`: no descriptor-level filter, the redirection sees every line
module, path, results = importlib.import_module(sys.argv[1]), sys.argv[2], []
for args in json.loads(sys.stdin.read()):
    out, err, handlers = io.StringIO(), io.StringIO(), list(logging.getLogger("kgpt").handlers)
    sys.argv = [module.__name__, *args]
    flags.FLAGS.unparse_flags()
    code = 0  # absl's app.run always exits; a run() that returned would be a success
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            module.run()
        except SystemExit as e:
            code = e.code
    logging.getLogger("kgpt").handlers[:] = handlers
    results.append({"returncode": code or 0, "stdout": out.getvalue(), "stderr": err.getvalue()})
with open(path, "w") as f:
    json.dump(results, f)
"""


def commands_in_one_process(module, commands, folder, timeout=600):
    """Runs `commands` (argument lists) of the command `module` (`"kgpt.cli.predict"`) one after another in one new
    process, in `folder`: `command`'s result for each. For kgpt-predict, whose flags clash with kgpt-train's in one
    process (a test worker has the latter): one start-up, not one per command."""
    fd, results = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    done = subprocess.run(
        [sys.executable, "-c", _COMMANDS, module, results],
        input=json.dumps([[str(a) for a in args] for args in commands]),
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=timeout,
    )
    try:
        assert done.returncode == 0, done.stderr[-3000:]
        with open(results) as f:
            return [types.SimpleNamespace(**result) for result in json.load(f)]
    finally:
        os.remove(results)
