"""Your own data, no plugin: `text-classification`, `text-regression` and `multiple-choice` on CSV, TSV or JSON lines.

The files and their columns are options of the task (`kgpt-train --train_file
... --text_columns ... --label_column ...`, or `task.with_files(...)` in
Python); docs/your-data.md has the formats and every error.

- `text-classification`: one or two text columns and a label column of any
  label strings; the label set is the training file's (sorted, numerically
  when every label is an integer). Labels spelled more than one way (`pos`
  and `Pos`, `1` and `1.0`) stay separate classes, with a counted warning.
  Accuracy, and F1 of the second label when there are two.
- `text-regression`: one or two text columns and a numeric column; Pearson,
  Spearman.
- `multiple-choice`: one or more context columns (an article and a question
  are concatenated), two or more choice columns, and the answer as a choice
  index from 0 or as the text of the right choice (an index that is also
  another choice's text is read as the index, counted in a warning); accuracy.

Two text columns use the paper's pair transformation (`[start] a [delim] b
[extract]`, `kgpt.tasks.transforms.Entailment`). Rows with an empty text are
skipped and counted (the first of them named in a warning); every other
problem is a `kgpt.DataError` naming `file:line`.

Without files each task runs on a small embedded demo table (written here,
from `glue_demo`'s SST-2-format reviews), which the contract test reads.

```python
from kgpt_tasks import generic

task = kgpt.TaskRegistry().get("text-classification").with_files(
    train_file="reviews.csv", validation_file="dev.csv", text_columns=["review"], label_column="stars")
model = kgpt.GPTTaskModel.from_preset("lm", task=task)   # a kgpt-train --task lm --output_dir
```
"""

import collections
import dataclasses
import logging
import math
import os
import random
import re

import kgpt
from kgpt import checks
from kgpt.data import readers, tables
from kgpt.errors import ConfigError, DataError
from kgpt.tasks import heads
from kgpt.tasks.metrics import METRICS
from kgpt.tasks.transforms import Classification, Entailment, MultipleChoice
from kgpt_tasks import glue_demo

logger = logging.getLogger("kgpt.tasks.generic")  # under "kgpt": printed as kgpt's progress is

SPLITS = ("train", "validation", "test")
# The option (and kgpt-train flag) naming each split's file.
SPLIT_FLAGS = {"train": "train_file", "validation": "validation_file", "test": "test_file"}
CLASSIFICATION, REGRESSION, CHOICE = "text-classification", "text-regression", "multiple-choice"


@dataclasses.dataclass(frozen=True)
class Files:
    """A task's table files (split -> path, `None` when not given) and the columns it reads."""

    paths: dict
    text_columns: tuple
    label_column: str
    choice_columns: tuple = ()
    metrics: tuple | None = None

    def path(self, split, data_dir):
        """The split's file (a relative path is under `data_dir`); `FileNotFoundError` when not given."""
        name = self.paths.get(split)
        if name is None:
            raise FileNotFoundError(f"no {checks.option(SPLIT_FLAGS[split])} given")
        return os.path.join(data_dir, name) if data_dir else name


@dataclasses.dataclass(frozen=True)
class FileTask(kgpt.Task):
    """A `kgpt.Task` whose data are table files with named columns, given as options (`with_files`).

    Attributes:
        files: the `Files` it reads (for the registered task: its embedded demo's, relative to `data_dir`).
    """

    files: Files | None = None

    def with_files(
        self,
        train_file=None,
        validation_file=None,
        test_file=None,
        text_columns=None,
        label_column=None,
        choice_columns=None,
        metrics=None,
        data_dir=None,
    ):
        """This task on your files: a new `FileTask` (the label set read from `train_file` for classification).

        Args:
            train_file, validation_file, test_file: CSV, TSV or JSON-lines files
                (by extension); relative paths are under `data_dir` when given.
                Only `train_file` is required; the others are evaluated when given.
            text_columns: one or two text columns (multiple choice: the context, one or more).
            label_column: the label, number or answer column (may be absent from the test file).
            choice_columns: multiple choice only: the answer choices, two or more.
            metrics: metric keys (`kgpt.tasks.metrics.METRICS`, `--metrics`) instead of the defaults; the first
                is the headline.

        Raises `ConfigError` naming the option for a missing or contradictory
        option, and `DataError` naming `file:line` for bad data in the training file.
        """
        kind = self.name
        if not train_file:
            raise ConfigError(
                f"Task {kind!r} reads your files: give {checks.option('train_file')} (and "
                f"{checks.option('validation_file')}, {checks.option('test_file')}), {checks.option('text_columns')} "
                f"and {checks.option('label_column')}{' and ' + checks.option('choice_columns') if kind == CHOICE else ''}."
            )
        text_columns, choice_columns = (
            _names(text_columns, checks.option("text_columns")),
            _names(choice_columns, checks.option("choice_columns")),
        )
        given = {"train": train_file, "validation": validation_file, "test": test_file}
        # Absolute: finetune's data_dir (where ids are relative to) may be another folder then.
        paths = {
            split: os.path.abspath(os.path.join(data_dir or "", name)) if name else None
            for split, name in given.items()
        }
        train_path = paths["train"]
        for split, name in paths.items():
            if name:
                tables.table_format(name)  # an unknown extension is refused before anything is read
                readers.check_file(name, checks.option(SPLIT_FLAGS[split]), missing=ConfigError)
        table = tables.read_table(train_path)
        header = table.columns
        has = f"{train_path} has {', '.join(map(repr, header))}"
        if not text_columns:
            raise ConfigError(
                f"{checks.option('text_columns')}: name the text column(s) of {train_path} ({has[len(train_path) + 1 :]})."
            )
        if not label_column:
            raise ConfigError(
                f"{checks.option('label_column')}: name the {'answer' if kind == CHOICE else 'label'} column ({has})."
            )
        if kind == CHOICE and len(choice_columns) < 2:
            raise ConfigError(
                f"{checks.option('choice_columns')}: multiple-choice needs two or more answer-choice columns ({has})."
            )
        if kind != CHOICE and choice_columns:
            raise ConfigError(f"{checks.option('choice_columns')} is for task 'multiple-choice', not {kind!r}.")
        if kind != CHOICE and len(text_columns) > 2:
            raise ConfigError(
                f"{checks.option('text_columns')}: {kind} takes one text column or a pair, got {len(text_columns)}; "
                f"join the texts into one column, or pick two."
            )
        metrics = _names(metrics, checks.option("metrics"))
        unknown = [m for m in metrics if m not in METRICS]
        if unknown:
            raise ConfigError(
                f"{checks.option('metrics')}: {', '.join(map(repr, unknown))} is no metric; kgpt has {', '.join(METRICS)}."
            )
        every = [*text_columns, *choice_columns, label_column]
        twice = sorted({c for c in every if every.count(c) > 1})
        if twice:
            raise ConfigError(
                f"Column(s) {', '.join(map(repr, twice))} given twice in {checks.option('text_columns')}, "
                f"{checks.option('choice_columns')} and {checks.option('label_column')}."
            )
        table.require(text_columns, checks.option("text_columns"))
        table.require(choice_columns, checks.option("choice_columns"))
        table.require([label_column], checks.option("label_column"))
        files = Files(paths, text_columns, label_column, choice_columns, tuple(metrics) if metrics else None)
        labels = _training_labels(files, data_dir) if kind == CLASSIFICATION else None
        _warn_training_rows(paths)
        _check_metrics(kind, metrics, labels)
        task = build(kind, files, labels, description=f"{kind} on {train_file}.")
        object.__setattr__(task, "plugin", self.plugin)  # its reading errors name the plugin, as the registry's copy
        return task

    def inputs(self):
        """The columns a model of this task reads its text from: what `kgpt-predict` reads by default."""
        return {
            "text_columns": list(self.files.text_columns),
            "choice_columns": list(self.files.choice_columns),
            "label_column": self.files.label_column,
        }


def _warn_training_rows(paths):
    """A counted warning for a validation or test file that is the training file (by any path or link): what it
    scores is the rows the model trains on."""
    train = paths["train"]
    for split, uses in (
        ("validation", f"validation scores (and {checks.option('keep')} best)"),
        ("test", "test scores"),
    ):
        name = paths[split]
        if name and os.path.samefile(name, train):
            rows = sum(1 for _ in tables.read_table(train).rows)
            logger.warning(
                f"Warning: {checks.option(SPLIT_FLAGS[split])} {name} is the {checks.option('train_file')} {train}"
                f"{'' if name == train else ' (by another path)'}: {uses} are measured on its {rows:,} training "
                f"rows. Hold out rows that the model does not train on."
            )


def _check_metrics(kind, metrics, labels):
    """A `ConfigError` naming the metrics option for a metric that cannot score `kind`: a class metric of values
    (accuracy of floats is exact equality: 0.0), binary F1 of other than two labels or of answers."""
    classes = ("accuracy", "f1", "matthews")  # f1 of values: the binary check below has the message
    wrong = [m for m in metrics if m in classes] if kind == REGRESSION else []
    if wrong:
        raise ConfigError(
            f"{checks.option('metrics')}: {', '.join(map(repr, wrong))} compare(s) classes; {kind} predicts values: "
            f"use pearson or spearman."
        )
    if "f1" in metrics and (kind == CHOICE or len(labels) != 2):
        has = f"the training file has {len(labels)} labels" if kind == CLASSIFICATION else "it scores answers"
        raise ConfigError(
            f"{checks.option('metrics')}: 'f1' is the binary F1 of a task of two labels; {has}: use accuracy or "
            f"matthews."
        )


def _names(columns, flag):
    """Names given as a list or comma-separated: a tuple; an empty or repeated one is a `ConfigError` naming `flag`
    (`review,` was read as `review` alone)."""
    if columns is None:
        return ()
    given = columns.split(",") if isinstance(columns, str) else list(columns)
    names = tuple(str(c).strip() for c in given)
    if "" in names:
        raise ConfigError(f"{flag} {','.join(map(str, given))!r}: an empty name; name each once, comma-separated.")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{flag}: {', '.join(map(repr, twice))} named twice; name each once.")
    return names


def _sorted_labels(labels):
    """Integers in numeric order, anything else in string order."""
    try:
        return sorted(labels, key=int)
    except ValueError:
        return sorted(labels)


def _training_labels(files, data_dir):
    """The label set of the training file; a bad or empty label is a `DataError` at its line."""
    table = tables.read_table(files.path("train", data_dir))
    table.require([files.label_column], checks.option("label_column"))
    spellings, counts = collections.Counter(), collections.Counter()
    for line, row in table.rows:
        counts[_label(table, row, files.label_column, line)] += 1
        spellings[table.value(row, files.label_column, line)] += 1
    _warn_spellings(table.path, files.label_column, spellings)
    labels = tuple(_sorted_labels(counts))
    if len(labels) < 2:
        raise DataError(
            f"{table.path}: every row has label {checks.shown(labels[0])} in column {files.label_column!r}: a "
            f"classifier needs two labels or more."
        )
    rare = [f"{checks.shown(name)} ({n})" for name, n in counts.items() if n < 2]
    if rare:
        logger.warning(
            f"{table.path}: label(s) {checks.listed(rare, show=str)} occur once only in {sum(counts.values())} rows: "
            f"the model can hardly learn them."
        )
    logger.info(
        f"{table.path}: {len(labels)} labels "
        + ", ".join(f"{checks.shown(name)} ({counts[name]})" for name in labels[:20])
        + (f", ... ({len(labels) - 20:,} more)" if len(labels) > 20 else "")
        + "."
    )
    return labels


def _spelling(label):
    """What two spellings of one label share: case and spaces aside, and a number's value (`1`, `1.0`, `1e0`)."""
    number = checks.number_text(label)
    return repr(number) if math.isfinite(number) else label.strip().casefold()


def _warn_spellings(path, column, spellings):
    """A counted warning for labels spelled more than one way; only surrounding spaces are merged (`_label`)."""
    groups = collections.defaultdict(list)
    for raw, n in sorted(spellings.items(), key=lambda item: -item[1]):
        groups[_spelling(raw)].append(f"{raw!r} ({n} row{'s' if n > 1 else ''})")
    mixed = [", ".join(group) for group in groups.values() if len(group) > 1]
    if mixed:
        logger.warning(
            f"{path}: label(s) in column {column!r} spelled more than one way: {'; '.join(mixed)}. "
            f"Surrounding spaces are dropped (one label); a difference in case or number format makes "
            f"separate classes: if they are one, spell them one way in your files."
        )


def _label(table, row, column, line):
    label = table.value(row, column, line).strip()
    if not label:
        raise DataError(f"{table.path}:{line}: empty label in column {column!r}.")
    if heads.unwritable(label):
        raise DataError(
            f"{table.path}:{line}: label {checks.shown(label)} in column {column!r} {heads.unwritable(label)}."
        )
    return label


class Reader:
    """`read(split, data_dir)` of a `FileTask`: its files' rows as `kgpt.Example`s (and `kgpt.Skipped`)."""

    def __init__(self, kind, files, labels):
        self.kind, self.files, self.labels = kind, files, labels

    def __call__(self, split, data_dir):
        files = self.files
        table = tables.read_table(files.path(split, data_dir))
        table.require(
            [*files.text_columns, *files.choice_columns],
            f"{checks.option('text_columns')}/{checks.option('choice_columns')}",
        )
        labeled = files.label_column in table.columns
        if not labeled and split != "test":
            table.require([files.label_column], checks.option("label_column"))
        empty, ambiguous, answers = collections.Counter(), {}, collections.Counter()
        first_empty = None
        for line, row in table.rows:
            source = f"{table.path}:{line}"
            texts = [table.text(row, c, line) for c in files.text_columns]
            choices = [table.value(row, c, line) for c in files.choice_columns]  # a true/false quiz's: true
            blank = next(
                (c for c, t in zip((*files.text_columns, *files.choice_columns), (*texts, *choices)) if not t.strip()),
                None,
            )
            if blank is not None:
                empty[blank] += 1
                first_empty = first_empty or source
                yield kgpt.Skipped(source, f"empty text in column {blank!r}")
                continue
            if not labeled and files.label_column in row:  # a JSON line: the first had none, so none were read
                raise DataError(
                    f"{source}: has {files.label_column!r}, which the file's first line has not: give every line "
                    f"a label, or none."
                )
            label = self._target(table, row, line, choices, ambiguous) if labeled else None
            if self.kind == CHOICE and labeled:
                answers[label] += 1
            yield kgpt.Example(segments=tuple(texts), label=label, choices=tuple(choices), source=source, uid=source)
        if empty:
            logger.warning(
                f"{table.path}: {sum(empty.values())} row(s) with an empty text skipped (first at {first_empty})."
            )
        for why, (count, first) in ambiguous.items():
            logger.warning(f"{table.path}: {count} answer(s) in {files.label_column!r} {why} (first at {first}).")
        if split == "train" and len(answers) == 1 and sum(answers.values()) > 1:
            ((index, count),) = answers.items()
            logger.warning(
                f"{table.path}: every one of its {count} answers in {files.label_column!r} is choice {index} "
                f"({files.choice_columns[index]!r}): the model can learn the position, not the texts. Shuffle "
                f"each row's choices (and its answer with them)."
            )

    def _target(self, table, row, line, choices, ambiguous):
        column, source = self.files.label_column, f"{table.path}:{line}"
        value = _label(table, row, column, line)
        if self.kind == CLASSIFICATION:
            if value not in self.labels:
                same = [label for label in self.labels if _spelling(label) == _spelling(value)]
                raise DataError(
                    f"{source}: label {checks.shown(value)} is not one of the training file's labels "
                    f"({checks.listed(self.labels)})"
                    f"{f'; it spells {same[0]!r} another way' if same else ''}."
                )
            return value
        if self.kind == REGRESSION:
            number = checks.number_text(value)
            if not math.isfinite(number):
                raise DataError(f"{source}: {column!r} holds {checks.shown(value)}, not a finite number.")
            return number
        matches = [i for i, choice in enumerate(choices) if choice.strip() == value]
        if re.fullmatch(r"-?[0-9]+", value):  # not str.isdigit(): int() refuses "²", which it takes
            index = int(value)
            if not 0 <= index < len(choices) and len(matches) == 1:  # choices 4, 5, 6 and the answer 5: its text
                _count(
                    ambiguous,
                    "are no choice index (out of range) but a choice's text: read as that choice; write answers "
                    "as indices from 0 or as texts throughout",
                    source,
                )
                return matches[0]
            if not 0 <= index < len(choices):
                raise DataError(
                    f"{source}: answer {index} in {column!r} is out of range: the {len(choices)} "
                    f"choices ({', '.join(self.files.choice_columns)}) are 0..{len(choices) - 1}."
                )
            if matches and index not in matches:
                _count(
                    ambiguous,
                    f"are a choice's index and another choice's text: read as indices from 0 "
                    f"(0 is {self.files.choice_columns[0]!r}); write them as indices if they were texts",
                    source,
                )
            return index
        if not matches:
            raise DataError(
                f"{source}: answer {checks.shown(value)} in {column!r} is neither a choice index (0.."
                f"{len(choices) - 1}) nor the text of a choice."
            )
        if len(matches) > 1:
            _count(ambiguous, "are the text of two or more choices: the first of them taken as the answer", source)
        return matches[0]


def _count(counts, why, source):
    count, first = counts.get(why, (0, source))
    counts[why] = (count + 1, first)


DEFAULT_METRICS = {REGRESSION: ("pearson", "spearman"), CHOICE: ("accuracy",)}


def build(kind, files, labels=None, description="", default_data=None):
    """The `FileTask` of `kind` reading `files`."""
    if kind == CHOICE:
        transform = MultipleChoice(len(files.choice_columns))
    else:
        transform = Entailment() if len(files.text_columns) == 2 else Classification()
    metrics = files.metrics or DEFAULT_METRICS.get(kind) or (("accuracy", "f1") if len(labels) == 2 else ("accuracy",))
    return FileTask(
        name=kind,
        transform=transform,
        labels=labels,
        read=Reader(kind, files, labels),
        metrics=metrics,
        splits=SPLITS,
        description=description,
        default_data=default_data,
        files=files,
    )


# --- the embedded demo tables: SST-2-format reviews (glue_demo) in each task's shape ----------------------------


def _demo_rows(kind, split):
    rng = random.Random(f"generic-{kind}-{split}")
    for sentence, label in glue_demo.sst2_rows("dev" if split == "validation" else "train"):
        positive = label == "1"
        if kind == CLASSIFICATION:
            yield {"review": sentence, "sentiment": "positive" if positive else "negative"}
        elif kind == REGRESSION:
            yield {"review": sentence, "stars": rng.choice((4, 5) if positive else (1, 2))}
        else:
            options = ["i liked it .", "i did not like it ."]
            right = 0 if positive else 1
            if rng.random() < 0.5:
                options.reverse()
                right = 1 - right
            yield {"review": sentence, "option_a": options[0], "option_b": options[1], "answer": right}


DEMO = {
    CLASSIFICATION: (
        Files({"train": "train.csv", "validation": "validation.csv"}, ("review",), "sentiment"),
        ("negative", "positive"),
        "Your CSV/TSV/JSONL: one or two text columns and a label column.",
    ),
    REGRESSION: (
        Files({"train": "train.tsv", "validation": "validation.tsv"}, ("review",), "stars"),
        None,
        "Your CSV/TSV/JSONL: one or two text columns and a numeric column.",
    ),
    CHOICE: (
        Files(
            {"train": "train.jsonl", "validation": "validation.jsonl"}, ("review",), "answer", ("option_a", "option_b")
        ),
        None,
        "Your CSV/TSV/JSONL: context column(s), choice columns and the answer (index or text).",
    ),
}


def demo_writer(kind):
    """`fn(directory) -> directory` writing `kind`'s embedded demo tables there."""

    def write(directory):
        files = DEMO[kind][0]
        os.makedirs(directory, exist_ok=True)
        for split, name in files.paths.items():
            rows = list(_demo_rows(kind, split))
            path = os.path.join(directory, name)
            tables.write_table(path, tables.table_format(name), list(rows[0]), rows)
        return directory

    return write


TASKS = [
    build(kind, files, labels, description=description, default_data=demo_writer(kind))
    for kind, (files, labels, description) in DEMO.items()
]


@kgpt.hookimpl
def register_tasks(register):
    for task in TASKS:
        register(task)
