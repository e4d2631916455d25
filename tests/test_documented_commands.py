"""Every kgpt command line and Python block in README.md, CONTRIBUTING.md and docs/ runs as written.

Commands (`kgpt-train`, `kgpt-predict`, `kgpt-analyze` in bash blocks, after
`&&`, a launcher such as `srun`, or inside a quoted `--command="..."`) run
with `--dry_run` (tests/documented_commands_worker.py: one process per
program and backend), each in a fresh folder holding stand-ins for what it
reads, made here (CONTRIBUTING.md, "Documented commands"):

- `--corpus`: a few small text files matching the glob or in the folder;
- `--data_dir DIR` of `--task T`, and `T=DIR` in `--tasks`: T's files in its
  real format (tests/test_paper_tasks.py's writers, DPRD's blocks, or the
  task's embedded data);
- `--init`/`--lstm_init`/`--model DIR`: what the doc's earlier command with
  `--output_dir DIR` writes (a fine-tuned preset of its task, a pre-trained
  transformer or LSTM); otherwise `STANDINS` by name (the original release,
  Hugging Face files), else a tiny pre-trained preset;
- `--input FILE`: a few examples for the model's task in the file's format;
- an absolute path is re-rooted inside the folder; `$VARIABLES` take
  `VARIABLES`' values.

Python blocks of a doc run in order in one namespace (one process per doc)
with the same stand-ins for the paths they name (`PYTHON_STANDINS`).

A command or block that cannot run here says so in the doc itself: a shell
comment `# not run: REASON` on the command, or `<!-- not run: REASON -->` on
the line before a block. Anything else that fails fails its test.
"""

import csv
import json
import os
import pathlib
import re
import resource
import shlex
import shutil
import subprocess
import sys
import textwrap

import keras
import pytest
from conftest import TINY, char_tokenizer, one_backend
from hub_server import FakeHub, environment, released_gpt1

import kgpt
from kgpt.io import hub as hub_lib

ROOT = pathlib.Path(__file__).parents[1]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
PROGRAMS = ("kgpt-train", "kgpt-predict", "kgpt-analyze")
NOT_RUN = re.compile(r"#\s*not run:\s*\S.*")
BLOCK_NOT_RUN = re.compile(r"<!--\s*not run:\s*\S.*-->\s*$")
VARIABLES = {"JOB_COMPLETION_INDEX": "0"}  # Kubernetes' indexed Job sets it: process 0
# Documented paths that are neither written by an earlier command nor a plain pre-trained preset.
STANDINS = {"finetune-transformer-lm/model": "original", "openai-gpt": "huggingface"}
PYTHON_STANDINS = {
    "out": "causal_lm",
    "lm": "causal_lm",
    "finetune-transformer-lm/model": "original",
    "openai-gpt": "huggingface",
    "encoder_bpe_40000.json": "gpt1_file:encoder_bpe_40000.json",
    "vocab_40000.bpe": "gpt1_file:vocab_40000.bpe",
}
PATH_FLAGS = (
    "corpus",
    "data_dir",
    "init",
    "lstm_init",
    "model",
    "input",
    "output_dir",
    "output",
    "tokenizer",
    "shards_dir",
    "train_file",
    "validation_file",
    "test_file",
)
TABLE_FLAGS = ("train_file", "validation_file", "test_file")
SENTENCES = ["the cat sat on the mat.", "a dog ran far away!", "rain falls in spring.", "why is the sky blue?"]


# Reading the docs.


def fenced_blocks(path):
    """`(language, first line number, text, reason not run or None)` of every fenced block in `path`."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        match = re.match(r"^\s*```(\w*)\s*$", lines[i])
        if not match:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i])
            i += 1
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        reason = BLOCK_NOT_RUN.search(before)
        found.append((match.group(1), start + 2, textwrap.dedent("\n".join(body)), reason and reason.group(0)))
        i += 1
    return found


def command_lines(text):
    """`(line offset, logical line)` of a shell block, continuation lines joined."""
    joined, first, current = [], None, ""
    for offset, line in enumerate(text.splitlines()):
        first = offset if not current else first
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        joined.append((first, current + line))
        current = ""
    return joined


def parse_command(line):
    """`(prog, args, env)` of the kgpt command in a shell line, or None."""
    match = re.search(r"(?<![\w-])(" + "|".join(PROGRAMS) + r")(?![\w-])", line)
    if not match:
        return None
    before, rest = line[: match.start()], line[match.end() :]
    # NAME=value settings right before the program (at the line's start, after &&, or inside a quoted command)
    leading = re.search(r"((?:[A-Z_][A-Z0-9_]*=(?:'[^']*'|\"[^\"]*\"|[^\s'\"]+)\s+)*)$", before).group(1)
    env = dict(part.split("=", 1) for part in shlex.split(leading))
    before = before[: len(before) - len(leading)]
    if before.endswith(("'", '"')):  # a launcher's quoted command: up to the closing quote
        rest = rest[: rest.index(before[-1])] if before[-1] in rest else rest
    else:
        rest = re.split(r"\s(?:&&|\|\||;|\|)\s", rest)[0]
    for name, value in VARIABLES.items():
        rest = rest.replace(f"${name}", value).replace(f"${{{name}}}", value)
    args = shlex.split(rest, comments=True)
    if args and args[-1] == "&":
        args = args[:-1]
    return match.group(1), args, env


def documented_commands():
    """Every kgpt command of the docs: dicts with doc, line, prog, args, env and `not_run`."""
    found = []
    for doc in DOCS:
        for language, line, text, block_reason in fenced_blocks(doc):
            if language not in ("bash", "sh", "shell", "console"):
                continue
            for offset, logical in command_lines(text):
                parsed = parse_command(logical)
                if parsed is None or logical.lstrip().startswith("#"):
                    continue
                prog, args, env = parsed
                reason = NOT_RUN.search(logical)
                found.append(
                    {
                        "doc": doc.relative_to(ROOT).as_posix(),
                        "line": line + offset,
                        "prog": prog,
                        "args": args,
                        "env": env,
                        "text": logical.strip(),
                        "not_run": block_reason or (reason and reason.group(0)),
                    }
                )
    return found


def python_blocks(doc):
    return [(line, text, reason) for language, line, text, reason in fenced_blocks(doc) if language == "python"]


def flag_values(args):
    """`{flag: value}` of the path flags (and --task, --tasks, --columns) in `args`."""
    values = {}
    for i, arg in enumerate(args):
        name, _, value = arg[2:].partition("=")
        if not arg.startswith("--") or name not in (
            *PATH_FLAGS,
            "task",
            "tasks",
            "columns",
            "architecture",
            "text_columns",
            "choice_columns",
            "label_column",
        ):
            continue
        values[name] = value if _ else (args[i + 1] if i + 1 < len(args) else "")
    return values


def rerooted(args, folder):
    """`args` with absolute paths of the path flags moved inside `folder`."""
    out = list(args)
    for i, arg in enumerate(out):
        name, eq, value = arg[2:].partition("=")
        if arg.startswith("--") and name in PATH_FLAGS:
            if eq and value.startswith("/"):
                out[i] = f"--{name}={folder}{value}"
            elif not eq and i + 1 < len(out) and out[i + 1].startswith("/"):
                out[i + 1] = f"{folder}{out[i + 1]}"
    return out


# Stand-ins.


class StandIns:
    """Tiny models and data written once, copied into each command's folder."""

    def __init__(self, root):
        self.root, self.made = pathlib.Path(root), {}

    def _once(self, kind, make):
        if kind not in self.made:
            path = self.root / kind
            make(str(path))
            self.made[kind] = path
        return self.made[kind]

    def copy(self, kind, target, make):
        target = pathlib.Path(target)
        if target.exists():
            return
        source = self._once(kind, make)
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copyfile)(source, target)

    def model(self, kind, target):
        self.copy(kind, target, lambda path: MAKERS[kind.split(":")[0]](path, *kind.split(":")[1:]))


def make_pretrained(path):
    tokenizer = char_tokenizer()  # the paper's 12 blocks, so documented --transfer_layers and --layers fit
    kgpt.GPTBackbone(
        **{**TINY, "num_layers": 12, "vocabulary_size": tokenizer.vocabulary_size(), "max_sequence_length": 64}
    ).save_to_preset(path)
    tokenizer.save_to_preset(path)


def make_causal_lm(path):
    from kgpt.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor

    tokenizer = char_tokenizer()
    backbone = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": tokenizer.vocabulary_size(), "max_sequence_length": 64})
    kgpt.GPTCausalLM(backbone, preprocessor=GPTCausalLMPreprocessor(tokenizer, 64)).save_to_preset(path)


def make_lstm(path):
    tokenizer = char_tokenizer()
    kgpt.LSTMBackbone(tokenizer.vocabulary_size(), hidden_dim=16, lstm_units=16, max_sequence_length=64).save_to_preset(
        path
    )
    tokenizer.save_to_preset(path)


def make_finetuned(path, task):
    pretrained = path + "-pretrained"
    make_pretrained(pretrained)
    kgpt.GPTTaskModel.from_preset(pretrained, task=task).save_to_preset(path)


def make_original(path, format="original"):
    tokenizer = kgpt.GPTTokenizer.gpt1()
    size = {
        "vocabulary_size": tokenizer.vocabulary_size(),
        "num_layers": 1,
        "num_heads": 12,
        "hidden_dim": 24,
        "intermediate_dim": 96,
        "max_sequence_length": 64,
    }
    kgpt.GPTBackbone(**size).save_original(path, format=format, tokenizer=tokenizer)


def make_gpt1_file(path, name):
    shutil.copyfile(os.path.join(os.path.dirname(kgpt.__file__), "assets", "gpt1_bpe", name), path)


MAKERS = {
    "pretrained": make_pretrained,
    "causal_lm": make_causal_lm,
    "lstm": make_lstm,
    "finetuned": make_finetuned,
    "original": make_original,
    "huggingface": lambda path: make_original(path, "huggingface"),
    "gpt1_file": make_gpt1_file,
}


def write_corpus(pattern):
    folder = pattern if not any(c in pattern for c in "*?[") else os.path.dirname(pattern) or "."
    name = "a.txt" if folder == pattern else os.path.basename(pattern).replace("*", "a").replace("?", "a")
    os.makedirs(folder, exist_ok=True)
    for i in range(2):
        with open(os.path.join(folder, name.replace("a", f"a{i}", 1) if i else name), "w", encoding="utf-8") as f:
            f.write(" ".join(SENTENCES * 5) + "\n")


def write_task_data(task_name, folder):
    import test_paper_tasks

    if os.path.exists(folder):
        return
    task = kgpt.TaskRegistry().get(task_name)
    if task_name == "dprd":
        os.makedirs(folder)
        block = "The bee landed on the flower because it had pollen .\nit\nbee,flower\nflower\n\n"
        for split in ("train", "test"):
            pathlib.Path(folder, f"{split}.c.txt").write_text(block * 3, encoding="utf-8")
    elif task_name in test_paper_tasks.PAPER_TASKS and task_name != "scitail":
        test_paper_tasks.write_dataset(task_name, folder)
    elif task.default_data is not None:
        written = task.default_data(folder)
        assert os.path.abspath(written) == os.path.abspath(folder), "stand-in data must land in the named folder"
    else:
        pytest.fail(f"no stand-in data for task {task_name!r}: add a writer to tests/test_documented_commands.py")


def write_table(path, task_name, values):
    """A small table in `path`'s format (by extension) with the columns the command names."""
    texts = [c for c in (values.get("text_columns") or "").split(",") if c]
    choices = [c for c in (values.get("choice_columns") or "").split(",") if c]
    label = values.get("label_column")
    rows = []
    for i in range(8):
        row = {name: SENTENCES[(i + j) % 4] for j, name in enumerate(texts + choices)}
        if label:
            row[label] = {"text-regression": f"{i % 5}.5", "multiple-choice": str(i % max(len(choices), 1))}.get(
                task_name, ("pos", "neg")[i % 2]
            )
        rows.append(row)
    write_rows(path, rows)


def write_rows(path, rows):
    names = list(rows[0])
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        if path.endswith(".jsonl"):
            f.writelines(json.dumps(row) + "\n" for row in rows)
        else:
            writer = csv.writer(f, delimiter="\t" if path.endswith(".tsv") else ",", lineterminator="\n")
            writer.writerows([names, *([row[n] for n in names] for row in rows)])


def write_input(path, task_name, columns, model_dir):
    """kgpt-predict's input: a table with the columns the model was trained on (as a user's would be), else rows."""
    from kgpt.jobs.predict import trained_columns

    task = kgpt.TaskRegistry().get(task_name)
    trained = trained_columns(model_dir) if model_dir and os.path.isdir(model_dir) else None
    count = task.transform.num_segments if isinstance(getattr(task.transform, "num_segments", None), int) else 2
    count = len(trained) if trained else count
    names = columns.split(",") if columns else trained or [f"text{i}" for i in range(count)]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in range(3):
            segments = [SENTENCES[(i + row) % 4] for i in range(count)]  # rows differ: a repeat reads as a header
            if path.endswith(".jsonl"):
                f.write(json.dumps(dict(zip(names, segments))) + "\n")
            elif path.endswith(".tsv") or (trained and not columns):
                separator = "\t" if path.endswith(".tsv") else ","
                f.write(separator.join(names) + "\n" if f.tell() == 0 else "")
                f.write(separator.join(segments) + "\n")
            else:
                f.write("\t".join(segments) + "\n")


def prepare(command, earlier, folder, standins):
    """Writes `command`'s stand-ins into `folder`; returns its arguments there."""
    args = rerooted(command["args"], folder)
    values = flag_values(args)
    os.makedirs(folder, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        task = values.get("task", "lm")
        if values.get("corpus"):
            write_corpus(values["corpus"])
        if values.get("data_dir"):
            data_task = task if command["prog"] == "kgpt-train" else None
            if data_task is None:  # kgpt-predict: the model's task
                data_task = earlier.get(values.get("model"), ("finetuned", None))[1]
                if data_task is None:
                    pytest.fail(
                        f"--model {values.get('model')}: no earlier command of the doc writes a fine-tuned model there"
                    )
            write_task_data(data_task, values["data_dir"])
        for item in (values.get("tasks") or "").split(","):
            name, _, data_dir = item.partition("=")
            if data_dir:
                write_task_data(name.strip(), data_dir.strip())
        for flag in ("init", "lstm_init", "model"):
            path = values.get(flag)
            if not path or path in ("demo", "scratch") or hub_lib.is_hub(path):  # the Hub's: FakeHub serves it
                continue
            kind, made_task = earlier.get(
                path, (STANDINS.get(path, "lstm" if flag == "lstm_init" else "pretrained"), None)
            )
            if flag == "model" and kind != "finetuned":
                pytest.fail(f"--model {path}: no earlier command of the doc writes a fine-tuned model there")
            standins.model(f"finetuned:{made_task}" if kind == "finetuned" else kind, path)
            for top, (what, _) in earlier.items():  # inside an earlier analysis's folder: claimed as it claims it
                if what == "analysis" and path.startswith(top.rstrip("/") + "/"):
                    pathlib.Path(top, "run.json").write_text(json.dumps({"job": "analyze", "settings": {}}))
        for flag in TABLE_FLAGS:
            if values.get(flag):
                write_table(values[flag], task, values)
        if values.get("input") and command["prog"] == "kgpt-predict":
            write_input(
                values["input"],
                earlier.get(values.get("model"), (None, "scitail"))[1],
                values.get("columns"),
                values.get("model"),
            )
        if values.get("tokenizer") not in (None, "train"):
            standins.model("pretrained", values["tokenizer"])
    finally:
        os.chdir(cwd)
    return args


def outputs(command):
    """`{output_dir: (kind, task)}` of what `command` writes."""
    values = flag_values(command["args"])
    out = values.get("output_dir")
    if command["prog"] == "kgpt-analyze":
        return {out or "analysis": ("analysis", None)}
    if not out or command["prog"] != "kgpt-train":
        return {}
    task = values.get("task", "lm")
    if task == "lm":
        return {out: ("lstm" if values.get("architecture") == "lstm" else "pretrained", None)}
    return {out: ("finetuned", task)}


# The tests.

COMMANDS = documented_commands()


def _id(command):
    return f"{command['doc']}:{command['line']}"


# A command that sets no KERAS_BACKEND runs on Keras' default, as a user without the variable runs it; its dry run
# builds no model, so on the other backend it runs with -m large (conftest.one_backend).
DEFAULT_BACKEND = "tensorflow"


@pytest.fixture(scope="module")
def results(tmp_path_factory, request):
    """Every documented command this session runs, with --dry_run: `{id: result}`."""
    selected = {
        item.callspec.id for item in request.session.items if item.originalname == "test_a_documented_command_runs"
    }
    root = tmp_path_factory.mktemp("documented")
    standins = StandIns(root / "standins")
    groups, earlier_of_doc = {}, {}
    backend = keras.config.backend()
    for n, command in enumerate(COMMANDS):
        earlier = earlier_of_doc.setdefault(command["doc"], {})
        # Run here: selected, and on this backend (the suite on another backend runs the others; CI runs both).
        if (
            not command["not_run"]
            and _id(command) in selected
            and command["env"].get("KERAS_BACKEND", backend) == backend
        ):
            folder = str(root / f"command{n}")
            args = prepare(command, earlier, folder, standins)
            env = {k: v for k, v in command["env"].items() if k != "KERAS_BACKEND"}
            group = ("predict" if command["prog"] == "kgpt-predict" else "train", backend)
            groups.setdefault(group, []).append(
                (_id(command), {"prog": command["prog"], "args": args, "env": env, "cwd": folder})
            )
        earlier.update(outputs(command))
    found, cpu = {}, resource.getrusage(resource.RUSAGE_CHILDREN)
    with FakeHub() as hub:  # what the docs load from the Hub (gpt1_base_en), served on 127.0.0.1
        released_gpt1(hub)
        for (group, backend), items in groups.items():
            result = subprocess.run(
                [sys.executable, str(ROOT / "tests" / "documented_commands_worker.py"), group],
                input=json.dumps([c for _, c in items]),
                capture_output=True,
                text=True,
                timeout=300,
                cwd=str(root),
                env={**os.environ, "KERAS_BACKEND": backend, **environment(hub, root / "hub")},
            )
            assert result.returncode == 0, result.stderr[-3000:]
            for (name, _), outcome in zip(items, json.loads(result.stdout.strip().splitlines()[-1])):
                found[name] = outcome
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime
    print(f"{len(found)} commands in {len(groups)} process(es): {seconds:.1f} s of CPU")
    return found


def test_the_docs_have_commands_of_every_program():
    assert {c["prog"] for c in COMMANDS} == set(PROGRAMS)
    assert len(COMMANDS) >= 20


@pytest.mark.parametrize(
    "command",
    [pytest.param(c, marks=() if "KERAS_BACKEND" in c["env"] else one_backend(DEFAULT_BACKEND)) for c in COMMANDS],
    ids=_id,
)
def test_a_documented_command_runs(command, results):
    if command["not_run"]:
        assert len(command["not_run"].split(":", 1)[1].strip()) > 3, "give the reason a command is not run"
        return
    if command["env"].get("KERAS_BACKEND", keras.config.backend()) != keras.config.backend():
        pytest.skip(f"KERAS_BACKEND={command['env']['KERAS_BACKEND']}: run by the suite on that backend")
    outcome = results[_id(command)]
    assert outcome["code"] == 0, (
        f"{command['text']}\n  exit {outcome['code']}: {outcome['error']}\n{outcome['log'][-2000:]}"
    )
    assert "no problem found" in outcome["log"] or {"--list_tasks", "--list_presets"} & set(command["args"]), outcome[
        "log"
    ][-2000:]


def test_the_parser_reads_continuations_launchers_and_variables():
    text = "KERAS_BACKEND=jax kgpt-train --task lm \\\n  --corpus 'a b/*.txt'   # ~30 min\n"
    ((offset, line),) = command_lines(text)
    assert parse_command(line) == ("kgpt-train", ["--task", "lm", "--corpus", "a b/*.txt"], {"KERAS_BACKEND": "jax"})
    assert parse_command("pip install . && kgpt-train --task scitail")[1] == ["--task", "scitail"]
    line = 'gcloud ssh x --command="KERAS_BACKEND=jax kgpt-train --task lm --coordinator_address auto" --zone z'
    assert parse_command(line)[1:] == (["--task", "lm", "--coordinator_address", "auto"], {"KERAS_BACKEND": "jax"})
    line = """TF_CONFIG='{"a": 1}' KERAS_BACKEND=tensorflow kgpt-train --task lm"""
    assert parse_command(line)[2] == {"TF_CONFIG": '{"a": 1}', "KERAS_BACKEND": "tensorflow"}
    assert parse_command("kgpt-train --process_id $JOB_COMPLETION_INDEX &")[1] == ["--process_id", "0"]
    assert parse_command("python -m pytest") is None


DOCS_WITH_PYTHON = [doc for doc in DOCS if any(not reason for _, _, reason in python_blocks(doc))]
RUN_BLOCKS = """
import json, os, sys, time, traceback
blocks = json.load(sys.stdin)
namespace, seconds = {"__name__": "__doc__"}, {}
for line, code in blocks:
    start, cpu = time.perf_counter(), time.process_time()
    try:
        exec(compile(code, f"block at line {line}", "exec"), namespace)
    except BaseException:
        print(json.dumps({"line": line, "error": traceback.format_exc()[-3000:]}))
        sys.exit(1)
    seconds[line] = (round(time.perf_counter() - start, 1), round(time.process_time() - cpu, 1))
print(json.dumps({"line": None, "seconds": seconds}))
"""


# The README's blocks run in every suite; the guides' (a minute or more on a 2-core CPU) with -m large.
@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(doc, marks=() if doc.name == "README.md" and doc.parent == ROOT else pytest.mark.large)
        for doc in DOCS_WITH_PYTHON
    ],
    ids=lambda d: d.relative_to(ROOT).as_posix(),
)
def test_the_python_blocks_of_a_doc_run_in_order(doc, tmp_path):
    blocks = [(line, text) for line, text, reason in python_blocks(doc) if not reason]
    standins = StandIns(tmp_path / "standins")
    folder = tmp_path / "run"
    folder.mkdir()
    for _line, text in blocks:
        for path, kind in PYTHON_STANDINS.items():
            if re.search(r"""["']""" + re.escape(path) + r"""["']""", text):
                standins.model(kind, folder / path)
    with FakeHub() as hub:
        released_gpt1(hub)
        result = subprocess.run(
            [sys.executable, "-c", RUN_BLOCKS],
            input=json.dumps(blocks),
            capture_output=True,
            text=True,
            timeout=300,
            cwd=str(folder),
            env={**os.environ, **environment(hub, tmp_path / "hub")},
        )
    last = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else {"error": result.stderr}
    assert result.returncode == 0 and last["line"] is None, (
        f"{doc.name}, the block at line {last.get('line')}:\n{last.get('error', result.stderr[-3000:])}"
    )
    print(f"{doc.name}: (wall, CPU) seconds per block (by line) {last['seconds']}")
