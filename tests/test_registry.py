"""Task discovery: every registry error path, with its message."""

import importlib.metadata
import sys
import textwrap
import types

import pytest

import kgpt
from kgpt.tasks import transforms


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


@pytest.fixture
def module_file(tmp_path, monkeypatch):
    """Writes a module that the registry really imports (unlike fake_module's), forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written = []

    def write(name, source):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


def entry_point(name, value):
    return importlib.metadata.EntryPoint(name=name, value=value, group="kgpt")


def hooks_module(name, **attributes):
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    return module


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


def test_plugin_that_exits_is_reported_and_others_work(module_file, fake_module):
    quits = module_file("kgpt_test_quits", "raise SystemExit(3)\n")
    good = fake_module("kgpt_test_good", register_tasks=plugin("g", make_task("good")).register_tasks)
    registry = kgpt.TaskRegistry(
        plugins=[plugin("halts", error=SystemExit())],
        entry_points=[entry_point("quits", quits), entry_point("good", good)],
    )
    assert registry.names() == ["good"]
    assert registry.problems() == [
        "plugin 'quits' (entry point quits = kgpt_test_quits) failed in import: SystemExit: 3",
        "plugin 'halts' (registered directly (halts)) failed in register_tasks: SystemExit",
    ]
    with pytest.raises(
        kgpt.RegistryError,
        match=r"Task 'quits' is unavailable: plugin 'quits' .*SystemExit: 3\. "
        r"Fix or uninstall that plugin\.",
    ):
        registry.get("quits")


def test_ctrl_c_is_not_taken_for_a_broken_plugin():
    with pytest.raises(KeyboardInterrupt):
        kgpt.TaskRegistry(plugins=[plugin("interrupted", error=KeyboardInterrupt())], entry_points=[])


def test_tasks_registered_before_a_failure_point_to_it():
    def register_tasks(register):
        register(make_task("early"))
        raise RuntimeError("disk full")

    half = hooks_module("half", register_tasks=kgpt.hookimpl(register_tasks))
    registry = kgpt.TaskRegistry(plugins=[half], entry_points=[])
    with pytest.raises(kgpt.RegistryError, match=r"Task 'early' is unavailable: plugin 'half' .* RuntimeError: disk"):
        registry.get("early")


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
        plugins=[
            plugin("first", make_task("twin")),
            plugin("second", make_task("twin")),
            plugin("x", make_task("solo")),
        ],
        entry_points=[],
    )
    assert registry.names() == ["solo"]
    with pytest.raises(
        kgpt.RegistryError,
        match=r"Task 'twin' is registered by two plugins: plugin 'first' .* and "
        r"plugin 'second'",
    ):
        registry.get("twin")
    assert (
        "task 'twin' is claimed by 'first' (registered directly (first)) and 'second' (registered directly "
        "(second)); uninstall one"
    ) in registry.problems()


def test_unknown_task_suggests_the_closest():
    registry = kgpt.TaskRegistry(plugins=[plugin("p", make_task("scitail"), make_task("snli"))], entry_points=[])
    with pytest.raises(
        kgpt.RegistryError,
        match=r"Unknown task 'scitial'. Did you mean 'scitail'\? "
        r"Available: scitail, snli.",
    ):
        registry.get("scitial")
    for spelled, meant in (("SciTail", "scitail"), ("SNLI", "snli"), ("SCITIAL", "scitail")):  # capitals: no hint
        with pytest.raises(kgpt.RegistryError, match=rf"Unknown task '{spelled}'. Did you mean '{meant}'\?"):
            registry.get(spelled)


def test_unknown_task_mentions_broken_plugins(fake_module):
    registry = kgpt.TaskRegistry(entry_points=[entry_point("glue", "kgpt_test_missing_module_xyz")])
    with pytest.raises(kgpt.RegistryError, match="Broken plugins that may provide it: plugin 'glue'"):
        registry.get("mrpc")


def test_entry_points_sharing_a_name_both_load(fake_module):
    # A plugin is its distribution (here, without one, its module) plus its name; see test_plugins for built-ins.
    one = fake_module("kgpt_test_one", register_tasks=plugin("a", make_task("a1")).register_tasks)
    two = fake_module("kgpt_test_two", register_tasks=plugin("b", make_task("b1")).register_tasks)
    registry = kgpt.TaskRegistry(entry_points=[entry_point("same", one), entry_point("same", two)])
    assert registry.names() == ["a1", "b1"] and not registry.problems()


def test_duplicate_plugin_names():
    registry = kgpt.TaskRegistry(
        plugins=[plugin("same", make_task("a1")), plugin("same", make_task("b1"))], entry_points=[]
    )
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


def test_misspelt_hook_refuses_its_plugin():
    @kgpt.hookimpl
    def register_task(register):
        register(make_task("lost"))

    misspelt = hooks_module("misspelt", register_task=register_task)
    extra = hooks_module(
        "extra", register_tasks=plugin("x", make_task("kept")).register_tasks, kgpt_setup=kgpt.hookimpl(lambda: None)
    )
    registry = kgpt.TaskRegistry(plugins=[misspelt, extra, plugin("fine", make_task("fine"))], entry_points=[])
    assert registry.names() == ["fine"]
    assert registry.problems() == [
        "plugin 'extra' (registered directly (extra)): @kgpt.hookimpl kgpt_setup is no kgpt hook (kgpt has "
        "register_tasks), so the plugin is not loaded; rename it, or mark it @kgpt.hookimpl(optionalhook=True) if "
        "another kgpt version defines it",
        "plugin 'misspelt' (registered directly (misspelt)): @kgpt.hookimpl register_task (did you mean "
        "register_tasks?) is no kgpt hook (kgpt has register_tasks), so the plugin is not loaded; rename it, or mark "
        "it @kgpt.hookimpl(optionalhook=True) if another kgpt version defines it",
    ]


def test_optional_hooks_of_other_kgpt_versions_are_allowed():
    newer = hooks_module(
        "newer",
        register_tasks=plugin("n", make_task("new")).register_tasks,
        kgpt_register_metrics=kgpt.hookimpl(optionalhook=True)(lambda register: None),
    )
    registry = kgpt.TaskRegistry(plugins=[newer], entry_points=[])
    assert registry.names() == ["new"] and not registry.problems()


def test_plugin_registering_no_task_is_reported():
    def register_tasks(register):
        register(make_task("unmarked"))

    unmarked = hooks_module("unmarked", register_tasks=register_tasks)
    empty = hooks_module("empty", kgpt=kgpt, LABELS=("a", "b"))
    idle = hooks_module("idle", register_tasks=kgpt.hookimpl(lambda register: None))
    registry = kgpt.TaskRegistry(plugins=[unmarked, empty, idle], entry_points=[])
    assert registry.problems() == [
        "plugin 'empty' (registered directly (empty)): registered no task: it has no @kgpt.hookimpl def "
        "register_tasks(register)",
        "plugin 'idle' (registered directly (idle)): registered no task: its register_tasks never called "
        "register(task)",
        "plugin 'unmarked' (registered directly (unmarked)): registered no task: it has no @kgpt.hookimpl def "
        "register_tasks(register); register_tasks is misspelt or lacks @kgpt.hookimpl",
    ]


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
        (dict(labels=("a", "b\tc")), r"label 'b\\tc' holds a tab or line break, which the predictions' TSV"),
        (dict(metrics=("bleu",)), "Unknown metric 'bleu'"),
        (dict(transform="entailment"), "transform must be a kgpt.tasks.transforms.Transform"),
        (
            dict(head=kgpt.tasks.heads.MultipleChoiceHead(2)),
            "scores answer choices, which the classification transform has not",
        ),
        (dict(head="classification"), "head must be a kgpt.tasks.heads.Head"),
        (dict(head=kgpt.tasks.heads.ClassificationHead(["x", "y"])), r"labels \('no', 'yes'\) differ from the head's"),
        (
            dict(labels=None, transform=transforms.MultipleChoice(3), head=kgpt.tasks.heads.MultipleChoiceHead(4)),
            "the head has 4 choices but the transform makes 3 views",
        ),
    ],
)
def test_task_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        make_task(**overrides)


def test_heads_are_inferred():
    assert make_task().head == kgpt.tasks.heads.ClassificationHead(make_task().labels)
    assert make_task(labels=None).head == kgpt.tasks.heads.RegressionHead()
    assert make_task(labels=None, transform=transforms.MultipleChoice(4)).head == kgpt.tasks.heads.MultipleChoiceHead(4)


# --- plugin code failing on data: the task, plugin, split and file are named ---


def jsonl_reader(split, data_dir):
    path = kgpt.data.readers.find_file(data_dir, [f"{split}.jsonl"], f"{split} file")
    for line_no, row in kgpt.data.readers.read_jsonl(path):
        yield kgpt.Example(segments=(row["text"],), label=row["label"], source=f"{path}:{line_no}")


class StrictHead(kgpt.tasks.heads.ClassificationHead):
    def target(self, label, source=""):
        return {"no": 0, "yes": 1}[label.strip()]


class PickyTransform(transforms.Classification):
    def check(self, segments, choices=()):
        return segments[0].startswith("#")


def read_none(split, data_dir):
    return None


def read_dicts(split, data_dir):
    yield {"text": "hi"}


def read_and_exit(split, data_dir):
    raise SystemExit(2)


READ = "Task 'bad' of plugin 'mine' (registered directly (mine)): read('dev', ...)"
ADVICE = " Report it to the plugin's authors, with the file if it is the cause."


@pytest.mark.parametrize(
    "rows, overrides, error, message, cause",
    [
        (
            ['{"text": "fine", "label": "yes"}', '{"txt": "typo", "label": "no"}'],
            {},
            kgpt.DataError,
            READ + " raised KeyError: 'text' (split 'dev' of {data}, file {data}/dev.jsonl, last row read "
            "{data}/dev.jsonl:1)." + ADVICE,
            KeyError,
        ),
        (
            ['{"txt": "typo"}'],
            {},
            kgpt.DataError,
            READ + " raised KeyError: 'text' (split 'dev' of {data}, file {data}/dev.jsonl)." + ADVICE,
            KeyError,
        ),
        (
            [],
            dict(read=read_none),
            TypeError,
            READ + " returned NoneType, not an iterable of kgpt.Example/Skipped (split 'dev' of {data})." + ADVICE,
            None,
        ),
        (
            [],
            dict(read=read_dicts),
            kgpt.DataError,
            READ + " yielded dict, not kgpt.Example/Skipped (split 'dev' of {data})." + ADVICE,
            None,
        ),
        (
            [],
            dict(read=read_and_exit),
            kgpt.DataError,
            READ + " raised SystemExit: 2 (split 'dev' of {data})." + ADVICE,
            SystemExit,
        ),
        (
            ['{"text": null, "label": "yes"}'],
            dict(transform=PickyTransform()),
            kgpt.DataError,
            "Task 'bad' of plugin 'mine' (registered directly (mine)): PickyTransform.check() raised AttributeError: "
            "'NoneType' object has no attribute 'startswith' (split 'dev' of {data}, file {data}/dev.jsonl, last row "
            "read {data}/dev.jsonl:1)." + ADVICE,
            AttributeError,
        ),
        (
            ['{"text": "fine", "label": 1}'],
            dict(head=StrictHead(("no", "yes"))),
            kgpt.DataError,
            "{data}/dev.jsonl:1: StrictHead.target() raised AttributeError: 'int' object has no attribute 'strip' on "
            "label 1 (task 'bad' of plugin 'mine' (registered directly (mine))).",
            AttributeError,
        ),
    ],
    ids=["raises", "raises-on-first-row", "returns-none", "yields-dict", "exits", "transform-check", "head-target"],
)
def test_plugin_code_failing_on_data_names_task_plugin_split_and_file(tmp_path, rows, overrides, error, message, cause):
    data = tmp_path / "data"
    data.mkdir()
    (data / "dev.jsonl").write_text("".join(row + "\n" for row in rows))
    task = make_task("bad", **{"read": jsonl_reader, **overrides})
    registry = kgpt.TaskRegistry(plugins=[plugin("mine", task)], entry_points=[])
    with pytest.raises(error) as info:
        for example in registry.get("bad").examples("dev", str(data))[0]:
            registry.get("bad").label_value(example)
    assert isinstance(info.value, kgpt.DataError)
    assert str(info.value) == message.format(data=data)
    assert type(info.value.__cause__) is (cause or type(None))


def test_reader_contract_errors_pass_unchanged(tmp_path):
    # A missing evaluation split's FileNotFoundError is how fine-tuning skips it; DataError names its line.
    registry = kgpt.TaskRegistry(plugins=[plugin("mine", make_task("plain", read=jsonl_reader))], entry_points=[])
    with pytest.raises(FileNotFoundError, match="No test file found"):
        registry.get("plain").examples("test", str(tmp_path))
    (tmp_path / "dev.jsonl").write_text("[1]\n")
    with pytest.raises(kgpt.DataError, match=r"^\S+dev.jsonl:1: expected a JSON object, got list\.$"):
        registry.get("plain").examples("dev", str(tmp_path))
