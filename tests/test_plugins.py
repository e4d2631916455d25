"""The example third-party plugin, installed with pip and reached only through its entry point."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import char_tokenizer

import kgpt
import kgpt.testing

PLUGIN = os.path.join(os.path.dirname(__file__), os.pardir, "plugins", "kgpt-boolq")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A folder holding the installed plugin (not on sys.path until a test puts it there)."""
    target = tmp_path_factory.mktemp("site")
    # Offline when setuptools is at hand; otherwise pip fetches it for an isolated build.
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *isolation,
                    "--target", str(target), PLUGIN], check=True, capture_output=True, timeout=600)
    assert not os.path.exists(os.path.join(str(target), "kgpt"))  # kgpt itself was not reinstalled
    return str(target)


def write_boolq(folder):
    os.makedirs(folder, exist_ok=True)
    rows = {
        "train": [("the sky is blue on a clear day", "is the sky blue", True),
                  ("fish live in water", "do fish live on land", False)] * 8,
        "dev": [("ice is frozen water", "is ice frozen water", True), ("cats bark", "do cats meow", False)],
    }
    for split, items in rows.items():
        with open(os.path.join(folder, f"{split}.jsonl"), "w") as f:
            for passage, question, answer in items:
                f.write(json.dumps({"question": question, "passage": passage, "answer": answer, "title": "t"}) + "\n")
    return folder


def test_not_visible_before_installing():
    assert "boolq" not in kgpt.TaskRegistry()


def test_installed_plugin_passes_the_contract(site, monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(site)
    registry = kgpt.TaskRegistry()
    entry = registry.entry("boolq")
    assert entry.plugin == "boolq" and "kgpt-boolq 0.1.0" in entry.origin
    assert registry.problems() == []
    # The contract over every other task runs in test_task_contract.py; here, the plugin's own.
    kgpt.testing.check_task(registry.get("boolq"), data_dir=write_boolq(str(tmp_path / "boolq")),
                            tokenizer=char_tokenizer())


def test_installed_plugin_lists_and_trains_from_the_cli(site, tiny_preset, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([site, os.environ.get("PYTHONPATH", "")])}
    run = lambda *args: subprocess.run([sys.executable, "-m", "kgpt.cli.train", *args], capture_output=True,
                                       text=True, env=env, timeout=600)
    listed = run("--list_tasks")
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert re.search(r"boolq\s+boolq\s+entailment\s+classification\s+false,true\s+accuracy", listed.stdout)
    data = write_boolq(str(tmp_path / "boolq"))
    trained = run("--task=boolq", f"--data_dir={data}", f"--init={tiny_preset}", "--epochs=1",
                  f"--output_dir={tmp_path / 'out'}")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "Split 'test' not evaluated: No BoolQ test file found" in trained.stdout
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["task"] == "boolq" and 0 <= metrics["splits"]["dev"]["accuracy"] <= 1
