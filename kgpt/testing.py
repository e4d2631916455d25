"""The task contract test, run over every registered task (built-in or not).

```python
# tests/test_my_plugin.py of a plugin distribution
import kgpt.testing

def test_contract():
    kgpt.testing.check_registry()      # every installed task, yours included

def test_my_files(tmp_path):
    write_sample_files(tmp_path)       # rows in your dataset's real format
    kgpt.testing.check_task(kgpt.TaskRegistry().get("mytask"), data_dir=str(tmp_path))
```

`check_task` raises `AssertionError` naming the task and what broke.
"""

import math
import tempfile

import numpy as np

from kgpt.models.gpt.gpt_backbone import GPTBackbone
from kgpt.models.gpt.gpt_task_model import GPTTaskModel
from kgpt.models.gpt.gpt_task_preprocessor import GPTTaskPreprocessor
from kgpt.models.gpt.gpt_tokenizer import GPTTokenizer
from kgpt.tasks import metrics as metrics_lib
from kgpt.tasks.registry import TaskRegistry
from kgpt.tasks.task import Example, Skipped, Task

_TEXT = ["the cat sat on the mat", "a dog ran", "rain falls in spring", "why is the sky blue"]


def synthetic_example(task, index=0):
    """An example that fits `task`'s transformation and head (for contract checks)."""
    transform = task.transform
    num_segments = transform.num_segments or (2 if transform.takes_choices else 1)
    segments = tuple(_TEXT[(index + i) % len(_TEXT)] for i in range(num_segments))
    choices = tuple(f"answer {k}" for k in range(transform.num_views)) if transform.takes_choices else ()
    names = task.head.output_names()
    if transform.takes_choices:
        label = index % transform.num_views
    elif names:
        label = names[index % len(names)]
    else:
        label = float(index % 3)
    return Example(segments=segments, label=label, choices=choices, source=f"synthetic:{index}")


def _check(condition, task, message):
    if not condition:
        raise AssertionError(f"Task {task.name!r}: {message}")


def check_examples(task, items, tokenizer=None, max_length=64):
    """Every item is an Example/Skipped that the task's transformation and labels accept."""
    preprocessor = GPTTaskPreprocessor(tokenizer or GPTTokenizer.gpt1(), task.transform, sequence_length=max_length)
    start, extract = preprocessor.tokenizer.start_id, preprocessor.tokenizer.extract_id
    count = 0
    for item in items:
        if isinstance(item, Skipped):
            _check(item.reason and item.source, task, f"Skipped needs a source and a reason: {item!r}")
            continue
        _check(isinstance(item, Example), task, f"read() yielded {type(item).__name__}, not Example/Skipped")
        _check(item.source, task, f"example without a source (file:line): {item!r}")
        problem = task.transform.check(item.segments, item.choices)
        _check(problem is None, task, f"{item.source}: {problem}")
        if item.label is not None:
            task.label_value(item)
        views, _ = preprocessor.encode(item.segments, item.choices)
        _check(len(views) == task.transform.num_views, task, f"{len(views)} views, expected {task.transform.num_views}")
        for view in views:
            _check(view[0] == start and view[-1] == extract, task, "views must be [start] ... [extract]")
            _check(len(view) <= max_length, task, f"a view of {len(view)} tokens exceeds max_length={max_length}")
        count += 1
    return count


def check_task(task, data_dir=None, tokenizer=None):
    """Checks one task end to end on a tiny model; reads real files when `data_dir` is given.

    Checks: the definition validates; synthetic examples transform into the
    right number of `[start] ... [extract]` views; a tiny `GPTTaskModel`
    trains one step on them with a finite loss and predicts the head's shape;
    every metric returns a float; with `data_dir` (or the task's embedded
    `default_data`), every split present reads into valid examples (the
    first, training split must be present).
    """
    import keras

    _check(isinstance(task, Task), task, "is not a kgpt.Task")
    task.validate()
    tokenizer = tokenizer or GPTTokenizer.gpt1()
    examples = [synthetic_example(task, i) for i in range(4)]
    check_examples(task, examples, tokenizer)

    preprocessor = GPTTaskPreprocessor(tokenizer, task.transform, sequence_length=32)
    targets = [task.label_value(e) for e in examples]
    split = preprocessor.encode_batch(examples, np.asarray(targets, task.head.target_dtype))
    backbone = GPTBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=32,
    )
    model = GPTTaskModel(backbone, head=task.head, num_views=task.transform.num_views, preprocessor=preprocessor)
    x, y, sample_weight = split.batch(np.arange(len(split)))
    logs = model.train_on_batch(x, y, sample_weight=sample_weight, return_dict=True)
    _check(math.isfinite(float(logs["loss"])), task, f"training loss is not finite: {logs}")
    outputs = model.predict(split)
    predictions = np.asarray(task.head.decode(outputs))
    _check(predictions.shape == (4,), task, f"head.decode gave shape {predictions.shape} for 4 examples, expected (4,)")
    names = task.head.output_names()
    probabilities = np.asarray(task.head.probabilities(outputs))
    expected = (4, len(names)) if names else (4,)
    _check(
        probabilities.shape == expected,
        task,
        f"head.probabilities gave shape {probabilities.shape}, expected {expected} (one column per output name)",
    )
    for metric in task.metrics:
        name, fn = metrics_lib.resolve(metric)
        value = fn(split.targets, predictions)
        _check(isinstance(value, float), task, f"metric {name!r} returned {type(value).__name__}, not float")
    keras.backend.clear_session()

    if data_dir is None and task.default_data is not None:
        with tempfile.TemporaryDirectory(prefix=f"kgpt-{task.name}-") as scratch:  # the embedded data, removed after
            _check_splits(task, task.default_data(scratch), tokenizer)
    elif data_dir is not None:
        _check_splits(task, data_dir, tokenizer)


def _check_splits(task, data_dir, tokenizer):
    """Every split of `task` in `data_dir` reads into valid examples; the first, training split must be there."""
    for i, split in enumerate(task.splits):
        try:
            count = check_examples(task, task.read(split, data_dir), tokenizer, max_length=512)
        except FileNotFoundError:
            if i == 0:  # fine-tuning skips missing others
                raise
            continue
        _check(count > 0, task, f"split {split!r} in {data_dir} has no examples")


def check_registry(registry=None):
    """`check_task` on every registered task; fails on broken plugins and name conflicts."""
    registry = registry or TaskRegistry()
    problems = registry.problems()
    if problems:
        raise AssertionError("Plugin problems:\n" + "\n".join(problems))
    for task in (e.task for e in registry.entries()):
        check_task(task)
    return registry.names()
