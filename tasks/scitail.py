"""SciTail (Khot et al., 2018): science entailment, labels `entails` / `neutral`, accuracy.

Reads the distributed files from `--data_dir`, which may be the `SciTailV1.1`
folder or one of its format folders:
`tsv_format/scitail_1.0_{split}.tsv` (premise TAB hypothesis TAB label, no
header), or else `snli_format/scitail_1.0_{split}.txt` (JSON lines with
`sentence1`, `sentence2` and `gold_label` `entailment`/`neutral`).
"""

import kgpt
from kgpt.data import readers
from kgpt.tasks.transforms import Entailment
from kgpt_tasks import scitail_demo

LABELS = ("entails", "neutral")
_SNLI_LABELS = {"entailment": "entails", "neutral": "neutral"}


def read(split, data_dir):
    """Yields `kgpt.Example(segments=(premise, hypothesis), label)` for one split."""
    name = f"scitail_1.0_{split}"
    path = readers.find_file(
        data_dir,
        [f"tsv_format/{name}.tsv", f"{name}.tsv", f"snli_format/{name}.txt", f"{name}.txt", f"{name}.jsonl"],
        f"SciTail {split} file",
    )
    if path.endswith(".tsv"):
        for line_no, (premise, hypothesis, label) in readers.read_tsv(path, num_columns=3):
            source = f"{path}:{line_no}"
            yield kgpt.Example(segments=(premise, hypothesis), label=label.strip(), source=source, uid=source)
        return
    for line_no, row in readers.read_jsonl(path):
        source = f"{path}:{line_no}"
        gold = readers.field(row, "gold_label", source)
        if gold not in _SNLI_LABELS:
            raise kgpt.DataError(f"{source}: gold_label {gold!r} is not one of {', '.join(_SNLI_LABELS)}.")
        segments = (readers.field(row, "sentence1", source), readers.field(row, "sentence2", source))
        yield kgpt.Example(segments=segments, label=_SNLI_LABELS[gold], source=source, uid=source)


@kgpt.hookimpl
def register_tasks(register):
    register(
        kgpt.Task(
            name="scitail",
            transform=Entailment(),
            labels=LABELS,
            metrics=("accuracy",),
            read=read,
            description="SciTail science entailment (paper Table 2).",
            paper_score="88.3 acc",
            default_data=scitail_demo.write,
        )
    )
