"""The task contract: what a task plugin supplies.

A task is a name, a reader `read(split, data_dir) -> examples`, one of the
input transformations of `kgpt.tasks.transforms`, a head and its metrics. Register
one from a plugin (see `kgpt.tasks.hookspecs`):

```python
import kgpt

def read(split, data_dir):
    for line_no, fields in kgpt.data.readers.read_tsv(f"{data_dir}/{split}.tsv", num_columns=2):
        yield kgpt.Example(segments=(fields[0],), label=fields[1], source=f"{split}.tsv:{line_no}")

@kgpt.hookimpl
def register_tasks(register):
    register(kgpt.Task(name="sentiment", transform=kgpt.tasks.transforms.Classification(),
                       labels=("negative", "positive"), read=read))
```
"""

import collections
import dataclasses
import os
import re
from collections.abc import Callable, Iterable

from kgpt.checks import shown
from kgpt.data import readers
from kgpt.errors import DataError, ReaderTypeError
from kgpt.tasks import heads as heads_lib
from kgpt.tasks import metrics as metrics_lib
from kgpt.tasks import transforms
from kgpt.tasks.heuristics import Heuristic

_NAME = re.compile(r"^[a-z][a-z0-9_.\-]*$")
RESERVED_NAMES = ("lm",)  # pre-training, built into kgpt-train
_END = object()


def describe_error(error):
    """`"KeyError: 'label'"`: an exception's type and message, for reports."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


@dataclasses.dataclass(frozen=True)
class Example:
    """One example as read from a dataset file.

    Attributes:
        segments: the text fields in transformation order, e.g.
            `(premise, hypothesis)`, `(sentence,)`, or `(article, question)`.
        label: a label name for classification, a float for regression, the
            index of the right answer for multiple choice; `None` if unlabeled.
        choices: the candidate answers (multiple choice only).
        source: where it came from, `"file:line"`, for error messages.
        uid: the dataset's own id, written with its prediction.
    """

    segments: tuple
    label: object = None
    choices: tuple = ()
    source: str = ""
    uid: str = ""


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A row a reader leaves out on purpose, counted by reason in metrics.json.

    Example: SNLI rows whose `gold_label` is `-` (no annotator consensus).
    """

    source: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Task:
    """A fine-tuning task.

    Attributes:
        name: the `--task` name: lower case letters, digits, `_ . -`.
        transform: a `kgpt.tasks.transforms` transformation instance.
        read: `read(split, data_dir)` yielding `Example`s (and `Skipped`);
            raise `kgpt.DataError` naming the file and line on a bad row.
        labels: label names (classification); `None` for regression and
            multiple choice.
        head: a `kgpt.tasks.heads.Head` (what the model outputs, its loss, how a
            prediction is decoded); when `None`, `heads.MultipleChoiceHead` for
            the MultipleChoice transform, else `heads.ClassificationHead(labels)`
            or `heads.RegressionHead()` when there are no labels.
        metrics: metric keys of `kgpt.tasks.metrics.METRICS` or callables
            `fn(labels, predictions) -> float`; the first is the headline.
            Default: `("accuracy",)`, or `("pearson",)` for a head of values.
        splits: the splits `read` understands; the first trains.
        description: one line for `kgpt-train --list_tasks`.
        default_data: optional `fn(directory) -> data_dir` that writes a small
            embedded dataset in the task's own file format, used when no
            `--data_dir` is given.
        paper_score: the GPT-1 paper's result, for reference in `--list_tasks`
            (e.g. `"88.3 acc"`).
        submissions: `{split: file name}` of benchmark submission files that
            `--predict_test` writes (`index` TAB `prediction`), e.g. GLUE's.
        zero_shot: optional `kgpt.tasks.heuristics.Heuristic` that solves the task
            with the pre-trained LM alone (`kgpt-analyze zero-shot`).
        plugin: set by `kgpt.TaskRegistry`: the plugin that registered the
            task and its entry point, named when its code fails on data.
    """

    name: str
    transform: transforms.Transform
    read: Callable[[str, str], Iterable]
    labels: tuple | None = None
    head: heads_lib.Head | None = None
    metrics: tuple | None = None
    splits: tuple = ("train", "dev", "test")
    description: str = ""
    default_data: Callable[[str], str] | None = None
    paper_score: str = ""
    submissions: dict | None = None
    zero_shot: Heuristic | None = None
    plugin: str = dataclasses.field(default="", init=False, compare=False, repr=False)

    def __post_init__(self):
        if self.labels is not None:
            object.__setattr__(self, "labels", tuple(self.labels))
        if isinstance(self.metrics, str) or callable(self.metrics):
            object.__setattr__(self, "metrics", (self.metrics,))
        object.__setattr__(self, "splits", tuple(self.splits))
        if self.head is None and isinstance(self.transform, transforms.Transform):
            try:
                object.__setattr__(self, "head", heads_lib.for_task(self.transform, self.labels))
            except ValueError as e:
                raise ValueError(f"Task {self.name!r}: {e}") from None
        if self.metrics is None:  # accuracy of classes or answers; of values, a correlation
            values = isinstance(self.head, heads_lib.Head) and not self.head.output_names()
            object.__setattr__(self, "metrics", ("pearson",) if values else ("accuracy",))
        object.__setattr__(self, "metrics", tuple(self.metrics))
        self.validate()

    def validate(self):
        """Raises `ValueError` describing the first problem with this task's definition."""
        where = f"Task {self.name!r}"
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"{where}: name must match {_NAME.pattern}.")
        if self.name in RESERVED_NAMES:
            raise ValueError(f"{where}: the name is reserved for kgpt-train's pre-training.")
        if not isinstance(self.transform, transforms.Transform):
            raise ValueError(f"{where}: transform must be a kgpt.tasks.transforms.Transform, got {self.transform!r}.")
        if not callable(self.read):
            raise ValueError(f"{where}: read must be callable as read(split, data_dir).")
        if not isinstance(self.head, heads_lib.Head):
            raise ValueError(
                f"{where}: head must be a kgpt.tasks.heads.Head (e.g. kgpt.tasks.heads.ClassificationHead(labels)), "
                f"got {self.head!r}."
            )
        problem = self.head.check(self.transform)
        if problem:
            raise ValueError(f"{where}: {problem}.")
        head_labels = getattr(self.head, "labels", None)
        if self.labels is not None and head_labels is not None and tuple(head_labels) != self.labels:
            raise ValueError(f"{where}: labels {self.labels} differ from the head's {tuple(head_labels)}.")
        if self.labels is not None and head_labels is None:
            raise ValueError(f"{where}: a {self.head.kind} head takes no labels.")
        if not self.metrics:
            raise ValueError(f"{where}: give at least one metric.")
        for metric in self.metrics:
            metrics_lib.resolve(metric)
            if metric in ("accuracy", "matthews") and not self.head.output_names():
                raise ValueError(
                    f"{where}: metric {metric!r} compares classes, and this task's {self.head.kind} head predicts "
                    f"values (exact equality of floats scores 0). Use 'pearson' or 'spearman', or pass a callable "
                    f"fn(labels, predictions) -> float."
                )
            binary = isinstance(self.head, heads_lib.ClassificationHead) and len(self.head.labels) == 2
            if isinstance(metric, str) and metric == "f1" and not binary:
                raise ValueError(
                    f"{where}: metric 'f1' is binary F1 of the second label (index 1), for a "
                    f"classification head of 2 labels; this task's {self.head.kind} head has "
                    f"{len(self.head.output_names()) or 'no'} outputs. Use 'accuracy', or pass a callable "
                    f"fn(labels, predictions) -> float."
                )
        if not self.splits:
            raise ValueError(f"{where}: give at least one split.")
        if self.zero_shot is not None and not isinstance(self.zero_shot, Heuristic):
            raise ValueError(f"{where}: zero_shot must be a kgpt.tasks.heuristics.Heuristic, got {self.zero_shot!r}.")

    def iter_examples(self, split, data_dir, tally):
        """Streams a split's usable examples, counting every row into `tally`.

        `tally["read"]` counts all rows, `tally["skipped"]` (a Counter) the
        rows left out by reason (`Skipped` rows and empty text fields). A row
        the transformation cannot take raises `DataError` with its source.
        Whatever else the reader or the transformation raises, and a reader
        result of the wrong type, becomes a `DataError` naming the task, its
        plugin, the split, the file and the last row read, chained to the
        original error.
        """
        tally.setdefault("read", 0)
        skipped = tally.setdefault("skipped", collections.Counter())
        reading = _Reading(self, split, data_dir)
        read = f"read({split!r}, ...)"
        items = reading.call(read, self.read, split, data_dir)
        if items is None or isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
            raise reading.error(
                read, f"returned {type(items).__name__}, not an iterable of kgpt.Example/Skipped", ReaderTypeError
            )
        rows = reading.call(read, iter, items)
        while (item := reading.call(read, next, rows, _END)) is not _END:
            tally["read"] += 1
            if isinstance(item, Skipped):
                skipped[item.reason] += 1
                continue
            if not isinstance(item, Example):
                raise reading.error(read, f"yielded {type(item).__name__}, not kgpt.Example/Skipped", ReaderTypeError)
            reading.row = item.source
            for name in ("segments", "choices"):  # a bare string would be read as one text per character
                value = getattr(item, name)
                if not isinstance(value, (tuple, list)):
                    raise reading.error(
                        read,
                        f"yielded an Example whose {name} must be a tuple (or list) of strings, got "
                        f"{type(value).__name__} {shown(value, 40)}",
                        ReaderTypeError,
                    )
            problem = reading.call(
                f"{type(self.transform).__name__}.check()", self.transform.check, item.segments, item.choices
            )
            if problem:
                raise DataError(f"{item.source}: {problem} (task {self.name!r}).")
            texts = (*item.segments, *item.choices)
            bad = [t for t in texts if not isinstance(t, str)]
            if bad:
                bad = bad[0]
                raise DataError(
                    f"{item.source}: a text field is {type(bad).__name__} {shown(bad, 80)}, not text (task {self.name!r})."
                )
            if any(not s.strip() for s in texts):
                skipped["empty text field"] += 1
                continue
            yield item

    def examples(self, split, data_dir):
        """Reads a split: `(examples, skipped, read)`, every row accounted for (see `iter_examples`).

        An empty split raises `DataError`.
        """
        tally = {}
        examples = list(self.iter_examples(split, data_dir, tally))
        if not examples:
            raise self.no_examples(split, data_dir, tally)
        return examples, tally["skipped"], tally["read"]

    def no_examples(self, split, data_dir, tally):
        """The `DataError` for a split with no usable example."""
        return DataError(
            f"Task {self.name!r}: split {split!r} in {data_dir} has no usable examples "
            f"({tally.get('read', 0)} read, skipped: {dict(tally.get('skipped', {})) or 'none'})."
        )

    @property
    def metric_names(self):
        """Names of the task's metrics (a callable's `__name__`), as in metrics.json."""
        return [metrics_lib.resolve(m)[0] for m in self.metrics]

    def label_value(self, example):
        """The example's label as the model's target (class or choice index, or float).

        A bad label is a `DataError` from the head; anything else a custom
        head raises becomes one naming the example, the task and its plugin.
        """
        try:
            return self.head.target(example.label, example.source)
        except (DataError, KeyboardInterrupt):
            raise
        except BaseException as e:  # SystemExit too
            raise DataError(
                f"{example.source}: {type(self.head).__name__}.target() raised {describe_error(e)} on "
                f"label {example.label!r} (task {self.name!r}{self._of_plugin()})."
            ) from e

    def write_default_data(self, directory):
        """Runs `default_data(directory)`; returns the data directory it wrote.

        Whatever the plugin's function raises (even `SystemExit`), or a result
        that is no directory, becomes a `DataError` naming the task and its plugin.
        """
        what = f"Task {self.name!r}{self._of_plugin()}: default_data({directory!r})"
        try:
            data_dir = self.default_data(directory)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # plugin code: SystemExit too
            raise DataError(
                f"{what} raised {describe_error(e)}. Report it to the plugin's authors, or pass --data_dir."
            ) from e
        if not isinstance(data_dir, (str, os.PathLike)) or not os.path.isdir(data_dir):
            raise DataError(
                f"{what} returned {data_dir!r}, not the directory it wrote. Report it to the plugin's "
                f"authors, or pass --data_dir."
            )
        return str(data_dir)

    def _of_plugin(self):
        return f" of {self.plugin}" if self.plugin else ""

    def prediction_name(self, value):
        """A prediction as written to the predictions file: label name, answer index or number."""
        return self.head.prediction_name(value)


class _Reading:
    """One pass of a task's reader over a split: where it is, for the errors of plugin code."""

    # The reader contract's own errors: they name their file already, and a
    # missing evaluation split's FileNotFoundError is how fine-tuning skips it.
    PASSED_ON = (DataError, FileNotFoundError, KeyboardInterrupt)

    def __init__(self, task, split, data_dir):
        self.task, self.split, self.data_dir = task, split, data_dir
        self.row = ""  # source of the last example read
        self.opened = []  # the files the reader opened, latest last

    def call(self, what, fn, *args):
        """`fn(*args)`; a failure, even `SystemExit`, becomes a `DataError` saying where."""
        try:
            with readers.recording(self.opened):
                return fn(*args)
        except self.PASSED_ON:
            raise
        except BaseException as e:
            raise self.error(what, f"raised {describe_error(e)}") from e

    def error(self, what, problem, cls=DataError):
        where = [f"split {self.split!r} of {self.data_dir}"]
        if self.opened:
            where.append(f"file {self.opened[-1]}")
        if self.row:
            where.append(f"last row read {self.row}")
        return cls(
            f"Task {self.task.name!r}{self.task._of_plugin()}: {what} {problem} ({', '.join(where)}). "
            f"Report it to the plugin's authors, with the file if it is the cause."
        )
