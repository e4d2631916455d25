"""SNLI and MultiNLI: three-way entailment, accuracy.

SNLI reads `snli_1.0_{train,dev,test}.jsonl` (`sentence1`, `sentence2`,
`gold_label`). MultiNLI reads GLUE's `{split}.tsv` (columns `sentence1`,
`sentence2`, `gold_label`; test files unlabeled) or the distributed
`multinli_1.0_{split}.jsonl`; its dev and test sets come matched and
mismatched, each its own split. Rows whose gold label is `-` (no annotator
consensus) are skipped and counted, as is usual for these datasets.
"""

import kgpt
from kgpt.data import readers
from kgpt.tasks.transforms import Entailment

LABELS = ("entailment", "neutral", "contradiction")
NO_CONSENSUS = "gold label '-' (no annotator consensus)"


def _example(source, premise, hypothesis, gold, uid):
    if gold == "-":
        return kgpt.Skipped(source, NO_CONSENSUS)
    return kgpt.Example(segments=(premise, hypothesis), label=gold, source=source, uid=uid or source)


def read_jsonl(path):
    for line_no, row in readers.read_jsonl(path):
        source = f"{path}:{line_no}"
        # Every SNLI/MultiNLI .jsonl row has one, test files included ('-' where annotators disagreed).
        gold = readers.field(row, "gold_label", source)
        yield _example(
            source,
            readers.field(row, "sentence1", source),
            readers.field(row, "sentence2", source),
            str(gold),
            str(row.get("pairID", "")),
        )


def read_tsv(path):
    for line_no, row in readers.read_tsv_columns(path, required=["sentence1", "sentence2"]):
        source = f"{path}:{line_no}"
        gold = row.get("gold_label")
        yield _example(
            source,
            row["sentence1"],
            row["sentence2"],
            None if gold is None else gold.strip(),
            row.get("index", row.get("pairID", "")).strip(),
        )


def reader(jsonl_name):
    def read(split, data_dir):
        path = readers.find_file(data_dir, [jsonl_name.format(split=split), f"{split}.tsv"], f"{split} file")
        yield from (read_jsonl(path) if path.endswith(".jsonl") else read_tsv(path))

    return read


TASKS = [
    kgpt.Task(
        name="snli",
        transform=Entailment(),
        labels=LABELS,
        read=reader("snli_1.0_{split}.jsonl"),
        paper_score="89.9 acc",
        description="SNLI natural language inference.",
    ),
    kgpt.Task(
        name="mnli",
        transform=Entailment(),
        labels=LABELS,
        read=reader("multinli_1.0_{split}.jsonl"),
        splits=("train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched"),
        submissions={"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"},
        paper_score="82.1 / 81.4 acc (m/mm)",
        description="MultiNLI, matched and mismatched (GLUE or JSONL).",
    ),
]


@kgpt.hookimpl
def register_tasks(register):
    for task in TASKS:
        register(task)
