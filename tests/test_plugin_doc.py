"""docs/plugins.md, run: its example plugin is written out of the page, installed as a distribution on sys.path,
checked with its own contract test and trained by the page's commands; its reference tables match the code."""

import dataclasses
import pathlib
import re
import shlex
import sys
import tomllib

import pytest
from conftest import one_backend
from test_cli_errors import cli

import kgpt
from kgpt.cli import train
from kgpt.tasks import heads, hookspecs, metrics, transforms

DOC = pathlib.Path(__file__).parents[1] / "docs" / "plugins.md"


def blocks(language):
    """`{first-line comment: code}` of the page's code blocks in `language`, and `None: [unnamed blocks]`."""
    found = {None: []}
    for code in re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S):
        first = code.splitlines()[0]
        if first.startswith("# "):
            found[first[2:].strip()] = code
        else:
            found[None].append(code)
    return found


def section(title):
    text = DOC.read_text()
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def first_column(text):
    """The backticked names in the first column of the markdown tables in `text`."""
    return re.findall(r"^\| `([^`]+)` \|", text, re.M)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The page's plugin module and pyproject entry point, as an installed distribution in a folder."""
    root = tmp_path_factory.mktemp("site")
    code = blocks("python")
    (root / "kgpt_sentiment.py").write_text(code["kgpt_sentiment.py"])
    project = tomllib.loads(blocks("toml")["pyproject.toml"])["project"]
    info = root / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    points = project["entry-points"]["kgpt"]
    (info / "entry_points.txt").write_text("[kgpt]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()))
    return root


@pytest.fixture
def installed(site, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    yield
    sys.modules.pop("kgpt_sentiment", None)


def test_the_example_plugin_passes_its_own_contract_test(installed, tmp_path):
    namespace = {}
    exec(blocks("python")["tests/test_kgpt_sentiment.py"], namespace)  # noqa: S102 - the page's own test
    namespace["test_contract"](tmp_path)
    entry = kgpt.TaskRegistry().entry("sentiment")  # installed: found through its entry point
    assert entry.plugin == "sentiment" and "kgpt-sentiment 0.1.0" in entry.origin


@one_backend("tensorflow")
def test_the_pages_commands_list_and_train_the_example(installed, monkeypatch, capsys, tmp_path):
    import kgpt_sentiment

    commands = [
        shlex.split(line, comments=True)
        for code in blocks("bash")[None]
        for line in code.splitlines()
        if line.startswith("kgpt-train")
    ]
    assert [c[:2] for c in commands] == [["kgpt-train", "--list_tasks"], ["kgpt-train", "--task"]]
    monkeypatch.chdir(tmp_path)
    kgpt_sentiment.write_demo("sentiment-data")
    code, out, err = cli(monkeypatch, capsys, train, *commands[0][1:])
    assert code in (0, None), err[-3000:]
    assert re.search(
        r"^sentiment\s+sentiment\s+classification\s+classification\s+negative,positive\s+"
        r"accuracy,f1,balanced_accuracy$",
        out,
        re.M,
    )
    code, out, err = cli(monkeypatch, capsys, train, *commands[1][1:])
    assert code in (0, None), err[-3000:]
    assert "Skipped" not in err and "test: 2 read, 1 used, 1 skipped (deleted sentence: 1)" in out
    assert (tmp_path / "sentiment-scratch" / "metrics.json").exists()
    config = kgpt.GPTTaskModel.from_preset("sentiment-scratch").backbone.get_config()
    assert config["max_sequence_length"] == 64 and config["num_layers"] == 2  # --max_length is the context


def test_the_reference_tables_match_the_code():
    task_fields = {f.name for f in dataclasses.fields(kgpt.Task)}
    tables = section("`kgpt.Task`")
    example_start = tables.index("`kgpt.Example` (frozen dataclass)")
    assert set(first_column(tables[:example_start])) == task_fields
    assert set(first_column(tables[example_start:])) == {f.name for f in dataclasses.fields(kgpt.Example)}
    hooks = {name for name in vars(hookspecs) if hasattr(getattr(hookspecs, name), "kgpt_spec")}
    assert {h.split("(")[0] for h in first_column(section("The hook"))} == hooks
    keys = set(first_column(section("Metrics"))) - {"a callable"}
    assert keys == set(metrics.METRICS)
    text = section("Transformations and heads")
    heads_start = text.index("| `kgpt.tasks.heads.` |")
    for module, table in ((transforms, text[:heads_start]), (heads, text[heads_start:])):
        listed = {n.split("(")[0] for n in first_column(table)} - {f"{module.__name__}."}
        base = module.Transform if module is transforms else module.Head
        defined = {
            name
            for name, value in vars(module).items()
            if isinstance(value, type)
            and issubclass(value, base)
            and value is not base
            and not name.startswith("_")
            and value.__module__ == module.__name__
            and name != "Categorical"
        }  # Categorical: a base
        assert listed == defined, module.__name__


def test_the_errors_the_page_describes():
    read = lambda split, data_dir: []  # noqa: E731
    with pytest.raises(ValueError, match="metric 'f1' is binary F1 of the second label"):
        kgpt.Task(
            name="three", transform=transforms.Classification(), read=read, labels=("a", "b", "c"), metrics=("f1",)
        )
    with pytest.raises(ValueError, match="metric 'f1' is binary"):
        kgpt.Task(name="score", transform=transforms.Classification(), read=read, metrics=("f1",))
    with pytest.raises(ValueError, match="Unknown metric 'auc'. Built-in metrics: accuracy, f1, matthews"):
        kgpt.Task(name="auc", transform=transforms.Classification(), read=read, labels=("a", "b"), metrics=("auc",))
    with pytest.raises(ValueError, match="name must match"):
        kgpt.Task(name="1st", transform=transforms.Classification(), read=read)
