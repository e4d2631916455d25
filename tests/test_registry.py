"""Task discovery: every registry error path, with its message."""

import importlib.metadata
import sys
import types

import pytest

import kgpt
from kgpt import transforms


def make_task(name="demo", **overrides):
    fields = dict(name=name, transform=transforms.Classification(), labels=("no", "yes"), read=lambda s, d: [])
    return kgpt.Task(**{**fields, **overrides})


def plugin(name, *tasks, error=None):
    """A plugin object registering `tasks` (or raising `error`)."""
    module = types.ModuleType(name)

    @kgpt.hookimpl
    def register_tasks(register):
        if error:
            raise error
        for task in tasks:
            register(task() if callable(task) else task)

    module.register_tasks = register_tasks
    return module


@pytest.fixture
def fake_module(monkeypatch):
    """Installs an importable module `name` for the duration of a test."""

    def install(name, **attributes):
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        monkeypatch.setitem(sys.modules, name, module)
        return name

    return install


def entry_point(name, value):
    return importlib.metadata.EntryPoint(name=name, value=value, group="kgpt")


def test_builtin_scitail_comes_through_the_entry_point():
    registry = kgpt.TaskRegistry()
    entry = registry.entry("scitail")
    assert entry.plugin == "scitail"
    assert "kgpt_tasks.scitail" in entry.origin
    assert not registry.problems()


def test_direct_plugins_register_tasks():
    registry = kgpt.TaskRegistry(plugins=[plugin("mine", make_task("alpha"), make_task("beta"))], entry_points=[])
    assert registry.names() == ["alpha", "beta"]
    assert registry.entry("alpha").plugin == "mine"


def test_plugin_that_fails_to_import_is_reported_and_others_work(fake_module):
    good = fake_module("kgpt_test_good", register_tasks=plugin("g", make_task("good")).register_tasks)
    registry = kgpt.TaskRegistry(
        entry_points=[entry_point("broken", "kgpt_test_missing_module_xyz"), entry_point("good", good)]
    )
    assert registry.names() == ["good"]
    [problem] = registry.problems()
    assert "plugin 'broken' (entry point broken = kgpt_test_missing_module_xyz)" in problem
    assert "failed in import: ModuleNotFoundError" in problem
    # Asking for the broken plugin's task re-raises its error with that context.
    with pytest.raises(kgpt.RegistryError, match="Task 'broken' is unavailable: plugin 'broken'") as info:
        registry.get("broken")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    assert "ModuleNotFoundError" in registry.format_traceback("broken")


def test_plugin_whose_hook_raises_is_reported():
    registry = kgpt.TaskRegistry(
        plugins=[plugin("bad", error=RuntimeError("no data files")), plugin("ok", make_task("fine"))], entry_points=[]
    )
    assert registry.names() == ["fine"]
    assert registry.problems() == [
        "plugin 'bad' (registered directly (bad)) failed in register_tasks: RuntimeError: no data files"
    ]


def test_invalid_task_definition_names_its_plugin():
    bad = plugin("sloppy", lambda: make_task("Bad Name"))
    registry = kgpt.TaskRegistry(plugins=[bad], entry_points=[])
    [problem] = registry.problems()
    assert "plugin 'sloppy'" in problem and "Task 'Bad Name': name must match" in problem


def test_registering_something_else_than_a_task():
    registry = kgpt.TaskRegistry(plugins=[plugin("odd", "scitail")], entry_points=[])
    assert "register() takes a kgpt.Task, got str" in registry.problems()[0]


def test_two_plugins_claiming_one_name_is_an_error_naming_both():
    registry = kgpt.TaskRegistry(
        plugins=[plugin("first", make_task("twin")), plugin("second", make_task("twin")), plugin("x", make_task("solo"))],
        entry_points=[],
    )
    assert registry.names() == ["solo"]
    with pytest.raises(kgpt.RegistryError, match=r"Task 'twin' is registered by two plugins: plugin 'first' .* and "
                                                  r"plugin 'second'"):
        registry.get("twin")
    assert "task 'twin' is claimed by 'first' and 'second'" in registry.problems()


def test_unknown_task_suggests_the_closest():
    registry = kgpt.TaskRegistry(plugins=[plugin("p", make_task("scitail"), make_task("snli"))], entry_points=[])
    with pytest.raises(kgpt.RegistryError, match=r"Unknown task 'scitial'. Did you mean 'scitail'\? "
                                                  r"Available: scitail, snli."):
        registry.get("scitial")


def test_unknown_task_mentions_broken_plugins(fake_module):
    registry = kgpt.TaskRegistry(entry_points=[entry_point("glue", "kgpt_test_missing_module_xyz")])
    with pytest.raises(kgpt.RegistryError, match="Broken plugins that may provide it: plugin 'glue'"):
        registry.get("mrpc")


def test_duplicate_plugin_names(fake_module):
    one = fake_module("kgpt_test_one", register_tasks=plugin("a", make_task("a1")).register_tasks)
    two = fake_module("kgpt_test_two", register_tasks=plugin("b", make_task("b1")).register_tasks)
    registry = kgpt.TaskRegistry(entry_points=[entry_point("same", one), entry_point("same", two)])
    assert registry.names() == ["a1"]
    assert "two plugins are named 'same'" in registry.problems()[0]


def test_pluggy_rejects_misspelled_hook_arguments():
    module = types.ModuleType("typo")

    @kgpt.hookimpl
    def register_tasks(registr):
        pass

    module.register_tasks = register_tasks
    registry = kgpt.TaskRegistry(plugins=[module], entry_points=[])
    assert "registr" in registry.problems()[0]


def test_list_table_shows_tasks_and_problems():
    registry = kgpt.TaskRegistry(
        plugins=[plugin("p", make_task("alpha", metrics=("accuracy", "f1"))), plugin("bad", error=ValueError("boom"))],
        entry_points=[],
    )
    table = registry.describe()
    assert "alpha  p       classification  classification  no,yes  accuracy,f1" in table
    assert "1 problem(s):" in table and "boom" in table


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(name="lm"), "reserved"),
        (dict(labels=("a",)), "at least 2 labels"),
        (dict(labels=("a", "a")), "labels repeat"),
        (dict(metrics=("bleu",)), "Unknown metric 'bleu'"),
        (dict(transform="entailment"), "transform must be a kgpt.transforms.Transform"),
        (dict(head=kgpt.heads.MultipleChoice(2)), "scores answer choices, which the classification transform has not"),
        (dict(head="classification"), "head must be a kgpt.heads.Head"),
        (dict(head=kgpt.heads.Classification(["x", "y"])), r"labels \('no', 'yes'\) differ from the head's"),
        (dict(labels=None, transform=transforms.MultipleChoice(3), head=kgpt.heads.MultipleChoice(4)),
         "the head has 4 choices but the transform makes 3 views"),
    ],
)
def test_task_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        make_task(**overrides)


def test_heads_are_inferred():
    assert make_task().head == kgpt.heads.Classification(make_task().labels)
    assert make_task(labels=None).head == kgpt.heads.Regression()
    assert make_task(labels=None, transform=transforms.MultipleChoice(4)).head == kgpt.heads.MultipleChoice(4)
