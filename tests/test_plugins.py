"""Third-party plugins, reached only through their entry points: the example one installed with pip, and
broken or clashing ones as distributions written to a folder on sys.path."""

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from conftest import char_tokenizer, one_backend

import kgpt
import kgpt.testing
from kgpt.errors import RegistryError
from kgpt.jobs import finetune as finetune_lib
from kgpt.jobs.config import FinetuneConfig

PLUGIN = os.path.join(os.path.dirname(__file__), os.pardir, "plugins", "kgpt-boolq")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A folder holding the installed plugin (not on sys.path until a test puts it there)."""
    target = tmp_path_factory.mktemp("site")
    # Offline when setuptools is at hand; otherwise pip fetches it for an isolated build.
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *isolation, "--target", str(target), PLUGIN],
        check=True,
        capture_output=True,
        timeout=600,
    )
    assert not os.path.exists(os.path.join(str(target), "kgpt"))  # kgpt itself was not reinstalled
    return str(target)


def write_boolq(folder):
    os.makedirs(folder, exist_ok=True)
    rows = {
        "train": [
            ("the sky is blue on a clear day", "is the sky blue", True),
            ("fish live in water", "do fish live on land", False),
        ]
        * 8,
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
    kgpt.testing.check_task(
        registry.get("boolq"), data_dir=write_boolq(str(tmp_path / "boolq")), tokenizer=char_tokenizer()
    )


@one_backend("tensorflow")
def test_installed_plugin_lists_and_trains_from_the_cli(site, tiny_preset, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([site, os.environ.get("PYTHONPATH", "")])}

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "kgpt.cli.train", *args], capture_output=True, text=True, env=env, timeout=600
        )

    listed = run("--list_tasks")
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert re.search(r"boolq\s+boolq\s+entailment\s+classification\s+false,true\s+accuracy", listed.stdout)
    data = write_boolq(str(tmp_path / "boolq"))
    trained = run(
        "--task=boolq", f"--data_dir={data}", f"--init={tiny_preset}", "--epochs=1", f"--output_dir={tmp_path / 'out'}"
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "Split 'test' not evaluated: No BoolQ test file found" in trained.stdout
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["task"] == "boolq" and 0 <= metrics["splits"]["dev"]["accuracy"] <= 1


def write_distribution(site, name, entry_points, modules):
    """Writes distribution `name` 0.1 into `site`: `kgpt` entry points `{name: module}`, modules `{module: source}`."""
    info = site / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kgpt]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    for module, source in modules.items():
        (site / f"{module}.py").write_text(textwrap.dedent(source))


CLAIMS = """
import kgpt

def task(name):
    return kgpt.Task(name=name, transform=kgpt.tasks.transforms.Classification(), labels=("a", "b"), read=lambda s, d: [])

@kgpt.hookimpl
def register_tasks(register):
    for name in {names!r}:
        register(task(name))
"""

MISSPELT = """
import kgpt

@kgpt.hookimpl
def register_task(register):
    pass
"""

GLUE = {"cola", "sst2", "mrpc", "qqp", "stsb", "qnli", "rte"}


@pytest.fixture
def clashing_site(tmp_path, monkeypatch):
    """A third-party `glue` entry point (sorting before the built-in one) and another plugin, both claiming mrpc."""
    site = tmp_path / "clashing"
    write_distribution(
        site, "kgpt-acme", {"glue": "kgpt_acme_glue"}, {"kgpt_acme_glue": CLAIMS.format(names=("mrpc", "acme-extra"))}
    )
    write_distribution(
        site,
        "kgpt-other",
        {"other": "kgpt_other_tasks"},
        {"kgpt_other_tasks": CLAIMS.format(names=("mrpc", "other-extra"))},
    )
    monkeypatch.syspath_prepend(str(site))
    yield site
    for module in ("kgpt_acme_glue", "kgpt_other_tasks"):
        sys.modules.pop(module, None)


def test_third_party_plugin_named_like_a_builtin_hides_none_of_its_tasks(clashing_site):
    registry = kgpt.TaskRegistry()
    assert GLUE | {"acme-extra", "other-extra"} <= set(registry.names())
    assert "kgpt_tasks.glue" in registry.entry("mrpc").origin
    assert registry.problems() == [
        "task 'mrpc' of plugin 'glue' (entry point glue = kgpt_acme_glue (kgpt-acme 0.1)) is ignored: the built-in "
        "plugin 'glue' has that name; rename the task",
        "task 'mrpc' of plugin 'other' (entry point other = kgpt_other_tasks (kgpt-other 0.1)) is ignored: the "
        "built-in plugin 'glue' has that name; rename the task",
    ]
    table = registry.describe()
    assert re.search(r"^acme-extra\s+glue \(kgpt-acme\)\s", table, re.M)
    assert re.search(r"^mrpc\s+glue \(kgpt\)\s", table, re.M)
    assert re.search(r"^other-extra\s+other\s", table, re.M)


def test_distribution_with_unreadable_entry_points_is_reported(tmp_path, monkeypatch):
    site = tmp_path / "unreadable"
    write_distribution(site, "kgpt-garbled", {}, {})
    (site / "kgpt_garbled-0.1.dist-info" / "entry_points.txt").write_text("[kgpt]\nno equals sign here\n")
    monkeypatch.syspath_prepend(str(site))
    registry = kgpt.TaskRegistry()
    assert GLUE | {"scitail"} <= set(registry.names())
    [problem] = registry.problems()
    assert problem.startswith(
        "plugin 'kgpt-garbled' (distribution kgpt-garbled 0.1): its entry_points.txt cannot be read (TypeError: "
    )
    assert problem.endswith("); reinstall or uninstall it")


@one_backend("jax")
def test_cli_lists_tasks_and_broken_plugins(clashing_site):
    write_distribution(
        clashing_site, "kgpt-quits", {"quits": "kgpt_test_quits"}, {"kgpt_test_quits": "raise SystemExit(3)\n"}
    )
    write_distribution(clashing_site, "kgpt-typo", {"typo": "kgpt_test_typo"}, {"kgpt_test_typo": MISSPELT})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(clashing_site), os.environ.get("PYTHONPATH", "")])}
    listed = subprocess.run(
        [sys.executable, "-m", "kgpt.cli.train", "--list_tasks"], capture_output=True, text=True, env=env, timeout=600
    )
    assert listed.returncode == 0, listed.stderr[-3000:]
    listed_tasks = set(re.findall(r"^(\S+)  ", listed.stdout, re.M))
    assert GLUE | {"scitail", "acme-extra", "other-extra"} <= listed_tasks
    assert (
        "plugin 'quits' (entry point quits = kgpt_test_quits (kgpt-quits 0.1)) failed in import: SystemExit: 3"
        in listed.stdout
    )
    assert (
        "plugin 'typo' (entry point typo = kgpt_test_typo (kgpt-typo 0.1)): @kgpt.hookimpl register_task (did "
        "you mean register_tasks?) is no kgpt hook"
    ) in listed.stdout


class MoodsPlugin:
    """A plugin whose task's metric returns `value` (a plugin's mistake, or NaN)."""

    def __init__(self, value):
        self.value = value

    @kgpt.hookimpl
    def register_tasks(self, register):
        def read(split, data_dir):
            words = ["sad", "glad", "grim", "happy"] * (2 if split == "train" else 1)
            return [kgpt.Example((w,), "high" if i % 2 else "low", source=f"{split}:{i}") for i, w in enumerate(words)]

        def mood(labels, predictions):
            return self.value

        register(
            kgpt.Task("moods", kgpt.tasks.transforms.Classification(), read, labels=("low", "high"), metrics=(mood,))
        )


def fine_tune_moods(value, preset, out, **overrides):
    registry = kgpt.TaskRegistry(plugins=[MoodsPlugin(value)], entry_points=[])
    settings = dict(task="moods", data_dir=str(out), init=preset, epochs=1, batch_size=4, max_length=16, seed=0)
    return finetune_lib.finetune(FinetuneConfig(**{**settings, **overrides}), registry)


def test_a_metric_returning_no_number_is_named_at_its_first_call(tiny_preset, tmp_path):
    with pytest.raises(
        RegistryError,
        match=r"^Task 'moods' of plugin 'MoodsPlugin' \(.*\): its metric 'mood' returned str 'high', not a",
    ):
        fine_tune_moods("high", tiny_preset, tmp_path)


@one_backend("tensorflow")
def test_keep_best_warns_once_that_a_nan_metric_cannot_choose(tiny_preset, tmp_path, caplog):
    with caplog.at_level("WARNING"):
        _, results = fine_tune_moods(float("nan"), tiny_preset, tmp_path, epochs=2, keep="best")
    warnings = [r.getMessage() for r in caplog.records if "NaN" in r.getMessage()]
    assert warnings == [
        "Warning: --keep best cannot choose by a NaN metric: the dev mood was NaN in epoch(s) 1, 2; "
        "keeping the last epoch, 2.",
        # The final scores: undefined, with no reason guessed for a plugin's metric.
        "Warning: mood on dev is undefined (NaN; null in metrics.json).",
        "Warning: mood on test is undefined (NaN; null in metrics.json).",
    ]
    assert results["kept_epoch"] == 2
