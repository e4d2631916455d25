"""Task heads: what a fine-tuned model outputs, its loss, and how a prediction is decoded.

The model (`kgpt.GPTTaskModel`) reads each view's last-layer state at the
extract token, pools the views as the head asks (`"sum"`: the views' states
are added, as the paper does for similarity; `"each"`: one score per view, as
for multiple choice), and applies one linear layer of `head.units(num_views)`
outputs. The head does the rest:

| head                 | output `[batch, ...]`  | loss                  | prediction     | probabilities |
|----------------------|------------------------|-----------------------|----------------|---------------|
| `ClassificationHead` | logits `[C]`           | cross-entropy         | label index    | softmax       |
| `RegressionHead`     | a value `[]`           | mean squared error    | the value      | the value     |
| `MultipleChoiceHead` | one logit per choice   | cross-entropy         | choice index   | softmax       |

A plugin brings a new head by subclassing `Head` and registering it with
`keras.saving.register_keras_serializable`, so a fine-tuned preset can be
loaded again:

```python
import keras
import kgpt

@keras.saving.register_keras_serializable(package="my_plugin")
class Ordinal(kgpt.tasks.heads.RegressionHead):
    kind = "ordinal"

    def decode(self, outputs):
        return outputs.round().clip(0, 4)

task = kgpt.Task(name="stars", transform=kgpt.tasks.transforms.Classification(), head=Ordinal(),
                 read=lambda split, data_dir: [], metrics=("pearson",))
```
"""

import math

import keras
import numpy as np
from keras import ops

from kgpt.checks import number_text, positive_int, shown
from kgpt.errors import DataError
from kgpt.tasks.configurable import Configurable


def _softmax(logits):
    logits = np.asarray(logits, "float64")
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (shifted / shifted.sum(axis=-1, keepdims=True)).astype("float32")


class Head(Configurable):
    """Base class of task heads; subclasses set `kind` and override what differs.

    Attributes:
        kind: a short name shown in logs and `kgpt-train --list_tasks`.
        pooling: `"sum"` (the views' extract states are added before the
            linear layer) or `"each"` (the linear layer scores every view).
        target_dtype: dtype of the model's task targets.
    """

    kind = "head"
    pooling = "sum"
    target_dtype = "int32"

    def units(self, num_views):
        """Width of the linear layer on the pooled extract states."""
        raise NotImplementedError

    def outputs(self, scores):
        """The task output from the linear layer's `scores` (Keras ops, in the model graph)."""
        return scores

    def loss(self):
        """The Keras loss of the task output; its `call(y_true, y_pred)` gives one value per example.

        The model averages those values by sample weight over the whole batch
        (`kgpt.train.lm_loss.BatchMean`), however many devices hold it.
        """
        raise NotImplementedError

    def metrics(self):
        """Keras metrics tracked on the task output during `fit` (the task's own run after each epoch)."""
        return []

    def target(self, label, source=""):
        """A label as read from a dataset (or given to `fit`) -> the model's target; `DataError` if invalid."""
        raise NotImplementedError

    def decode(self, outputs):
        """Task outputs (NumPy, `[examples, ...]`) -> predictions, what the task's metrics take."""
        raise NotImplementedError

    def probabilities(self, outputs):
        """`model.predict(x)`'s raw outputs (NumPy) -> probabilities (softmax of logits), or the values as they are.

        What kgpt-predict writes in its `p_<name>` columns: e.g.
        `model.head.probabilities(model.predict(["what a film"]))` gives
        `[[p("0"), p("1")]]` for a two-label classifier.
        """
        return np.asarray(outputs, "float32")

    def prediction_name(self, value):
        """A prediction or target as written to predictions files: a label name, an index, a number."""
        return value

    def output_names(self):
        """Names of the columns of `probabilities` (`[]` for a single value per example)."""
        return []

    def check(self, transform):
        """A problem with using this head after `transform`, or None."""
        if (self.pooling == "each") != transform.takes_choices:
            if self.pooling == "each":
                return f"the {self.kind} head scores answer choices, which the {transform.kind} transform has not"
            return f"the {transform.kind} transform has answer choices: use a head that scores each one"
        return None


class Categorical(Head):
    """A choice among several: logits, cross-entropy, accuracy, argmax, softmax probabilities."""

    def loss(self):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def metrics(self):
        return ["accuracy"]

    def decode(self, outputs):
        return np.argmax(outputs, axis=-1)

    def probabilities(self, outputs):
        return _softmax(outputs)


def unwritable(label):
    """Why the label name `label` cannot be written in a predictions file (a TSV, with a `p_<label>` column),
    or None."""
    if any(c in str(label) for c in "\t\n\r"):
        return "holds a tab or line break, which the predictions' TSV cannot hold"
    return None


@keras.saving.register_keras_serializable(package="kgpt.tasks.heads")
class ClassificationHead(Categorical):
    """One of `labels`: logits, cross-entropy, softmax probabilities.

    Targets are label names. An integer is read as a label name when the
    names are numbers (`labels=("0", "1")`: `1` is `"1"`), and otherwise as
    an index into `labels`; an integer that is neither is an error.

    Example:
    ```python
    head = kgpt.tasks.heads.ClassificationHead(["negative", "positive"])
    head.target("positive")                # 1
    head.decode(np.array([[0.1, 2.0]]))    # array([1])
    head.prediction_name(1)                # 'positive'
    ```
    """

    kind = "classification"

    def __init__(self, labels):
        if isinstance(labels, str) or labels is None:
            raise ValueError(f"ClassificationHead labels must be a list of label names, got {labels!r}.")
        labels = tuple(labels)
        if len(labels) < 2:
            raise ValueError(f"A classification head needs at least 2 labels, got {labels!r}.")
        if len(set(labels)) != len(labels):
            raise ValueError(f"ClassificationHead labels repeat: {labels}.")
        for name in labels:
            if unwritable(name):
                raise ValueError(f"ClassificationHead label {name!r} {unwritable(name)}.")
        self.labels = labels

    def units(self, num_views):
        return len(self.labels)

    def target(self, label, source=""):
        if isinstance(label, bytes):
            label = label.decode("utf-8", "replace")
        if isinstance(label, str):
            stripped = label.strip()
            if stripped in self.labels:
                return self.labels.index(stripped)
        elif isinstance(label, (int, np.integer)) and not isinstance(label, bool):
            if str(int(label)) in self.labels:  # numeric label names: the integer is the name
                return self.labels.index(str(int(label)))
            numeric = any(name.lstrip("-").isdigit() for name in self.labels)
            if not numeric and 0 <= label < len(self.labels):
                return int(label)
        where = f"{source}: " if source else ""
        raise DataError(f"{where}label {shown(label)} is not one of {', '.join(map(repr, self.labels))}.")

    def prediction_name(self, value):
        return self.labels[int(value)]

    def output_names(self):
        return list(self.labels)

    def get_config(self):
        return {"labels": list(self.labels)}


@keras.saving.register_keras_serializable(package="kgpt.tasks.heads")
class RegressionHead(Head):
    """A real value: one output, mean squared error; non-finite targets are refused.

    Example: `kgpt.tasks.heads.RegressionHead().target("3.5")  # 3.5`
    """

    kind = "regression"
    target_dtype = "float32"

    def units(self, num_views):
        return 1

    def outputs(self, scores):
        return ops.squeeze(scores, axis=-1)  # [B, 1] -> [B]

    def loss(self):
        return keras.losses.MeanSquaredError()

    def target(self, label, source=""):
        where = f"{source}: " if source else ""
        if isinstance(label, bool):
            raise DataError(f"{where}target {shown(label)} is not a number.")
        if isinstance(label, (str, bytes)) and not math.isfinite(
            number_text(label if isinstance(label, str) else label.decode("utf-8", "replace"))
        ):
            # Read as a table's text is: float() also takes "1_000" and "١٢".
            try:
                spelled = float(label)
            except ValueError:
                spelled = 0.0
            what = "a number" if math.isfinite(spelled) else "a finite number"
            raise DataError(f"{where}target {shown(label)} is not {what}.")
        try:
            value = float(label)
        except (TypeError, ValueError):
            raise DataError(f"{where}target {shown(label)} is not a number.") from None
        except OverflowError:  # an int past a double's range (10**400), so past float32's too
            value = None
        if value is not None and not math.isfinite(value):
            raise DataError(f"{where}target {shown(label)} is not a finite number.")
        if value is None or abs(value) > float(np.finfo(np.float32).max):  # float32 targets: it would train as inf
            raise DataError(f"{where}target {shown(label)} is beyond float32's range (±3.4e38), which training uses.")
        return value

    def decode(self, outputs):
        return np.asarray(outputs, "float32")

    def prediction_name(self, value):
        # The shortest number that reads back to the float32 value: 1234.567, not 1234.5670166015625.
        return float(str(np.float32(value)))


@keras.saving.register_keras_serializable(package="kgpt.tasks.heads")
class MultipleChoiceHead(Categorical):
    """The right one of `num_choices` answers: one logit per choice view, softmax over them.

    `names`, when given, are what the dataset calls the choices (RACE: `"ABCD"`; Story Cloze: `"1"`, `"2"`):
    predictions are written as those names, and a text target is one of them; an integer target is an index
    either way.

    Example:
    ```python
    kgpt.tasks.heads.MultipleChoiceHead(4).target(2)                          # 2
    kgpt.tasks.heads.MultipleChoiceHead(4, names="ABCD").prediction_name(2)  # 'C'
    ```
    """

    kind = "multiple_choice"
    pooling = "each"

    def __init__(self, num_choices, names=None):
        self.num_choices = positive_int(num_choices, "num_choices", minimum=2)
        if names is not None:
            names = [str(n) for n in names] if not isinstance(names, str) else list(names)
            if len(names) != self.num_choices or len(set(names)) != len(names):
                raise ValueError(f"names must be {self.num_choices} distinct choice names, got {shown(names)}.")
            bad = next((n for n in names if not n.strip() or unwritable(n)), None)
            if bad is not None:
                raise ValueError(f"The choice name {shown(bad)} {unwritable(bad) or 'is blank'}.")
        self.names = names

    def units(self, num_views):
        return 1

    def outputs(self, scores):
        return ops.squeeze(scores, axis=-1)  # [B, K, 1] -> [B, K]

    def target(self, label, source=""):
        if self.names is not None and isinstance(label, str):
            if label in self.names:
                return self.names.index(label)
        elif isinstance(label, str) and label.strip().isascii() and label.strip().isdigit():  # int() refuses "²"
            label = int(label)
        if isinstance(label, (int, np.integer)) and not isinstance(label, bool) and 0 <= label < self.num_choices:
            return int(label)
        where = f"{source}: " if source else ""
        names = f" or one of {', '.join(self.names)}" if self.names is not None else ""
        raise DataError(f"{where}answer {shown(label)} is not a choice index 0..{self.num_choices - 1}{names}.")

    def prediction_name(self, value):
        return self.names[int(value)] if self.names is not None else int(value)

    def output_names(self):
        return list(self.names) if self.names is not None else [str(k) for k in range(self.num_choices)]

    def check(self, transform):
        problem = super().check(transform)
        if problem is None and transform.num_views != self.num_choices:
            return f"the head has {self.num_choices} choices but the transform makes {transform.num_views} views"
        return problem

    def get_config(self):
        # names only when given: a model saved without them keeps its config.
        config = {"num_choices": self.num_choices}
        if self.names is not None:
            config["names"] = list(self.names)
        return config


# The names presets saved before the heads had names of their own record (`"registered_name":
# "kgpt.tasks.heads>Classification"`, the name the input transformation has too): they load as these.
for _old, _head in (
    ("Classification", ClassificationHead),
    ("Regression", RegressionHead),
    ("MultipleChoice", MultipleChoiceHead),
):
    keras.saving.get_custom_objects().setdefault(f"kgpt.tasks.heads>{_old}", _head)
del _old, _head


def for_task(transform, labels):
    """The head a task gets when it names none: multiple choice, classification or regression."""
    if transform.takes_choices:
        return MultipleChoiceHead(transform.num_views)
    return RegressionHead() if labels is None else ClassificationHead(labels)
