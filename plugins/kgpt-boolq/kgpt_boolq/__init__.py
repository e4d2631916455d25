"""BoolQ as a kgpt task: a passage and a yes/no question about it.

Reads BoolQ's distributed JSON-lines files, `train.jsonl` and `dev.jsonl`
(fields `question`, `passage`, `answer` true/false, `title`), or SuperGLUE's
copy (`train.jsonl`, `val.jsonl`, `test.jsonl` with `label` and `idx`).
Each example becomes `[start] passage [delim] question [extract]`
(the entailment transformation); the metric is accuracy.
"""

import kgpt
from kgpt.data import readers
from kgpt.tasks.transforms import Entailment

LABELS = ("false", "true")


def read(split, data_dir):
    """Yields `kgpt.Example(segments=(passage, question), label)`; test rows are unlabeled."""
    names = [f"{split}.jsonl"] + (["val.jsonl"] if split == "dev" else [])
    path = readers.find_file(data_dir, names, f"BoolQ {split} file")
    for line_no, row in readers.read_jsonl(path):
        source = f"{path}:{line_no}"
        answer = row.get("answer", row.get("label"))
        if answer is not None and not isinstance(answer, bool):
            raise kgpt.DataError(f"{source}: answer {answer!r} is not true or false.")
        yield kgpt.Example(
            segments=(readers.field(row, "passage", source), readers.field(row, "question", source)),
            label=None if answer is None else LABELS[answer],
            source=source,
            uid=str(row.get("idx", source)),
        )


@kgpt.hookimpl
def register_tasks(register):
    register(
        kgpt.Task(
            name="boolq",
            transform=Entailment(),
            labels=LABELS,
            metrics=("accuracy",),
            read=read,
            splits=("train", "dev", "test"),
            description="BoolQ yes/no questions about a passage (example third-party plugin).",
        )
    )
