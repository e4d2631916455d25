"""The paper's GLUE tasks except MNLI (see `nli.py`): CoLA, SST-2, MRPC, QQP, STS-B, QNLI, RTE.

`--data_dir` is the task's GLUE folder (e.g. `glue_data/RTE`) with
`train.tsv`, `dev.tsv` and `test.tsv` as GLUE distributes them: a header row
naming the columns (CoLA's train/dev have none), tabs, no quoting; test files
have no label column, so test predictions are written but not scored, and
`--predict_test` also writes them in GLUE's submission format. MRPC also reads
Microsoft's original `msr_paraphrase_{train,test}.txt`. QQP's train file has
a few rows with missing fields in the GLUE release; they are skipped and
counted. Every other malformed row is an error naming file and line.

CoLA and SST-2 carry the paper's zero-shot heuristics, and small embedded
datasets (`glue_demo.py`) for runs without `--data_dir`.
"""

import kgpt
from kgpt.data import readers
from kgpt.tasks.heuristics import NextWordChoice, ThresholdedLogProb
from kgpt.tasks.transforms import Classification, Entailment, Similarity
from kgpt_tasks import glue_demo

SPLITS = ("train", "dev", "test")


def tsv_reader(text_columns, label_column, files=None, skip_malformed=False):
    """A `read(split, data_dir)` for a headered GLUE TSV; test rows without labels are unlabeled."""

    def read(split, data_dir):
        candidates = (files or {}).get(split, []) + [f"{split}.tsv"]
        path = readers.find_file(data_dir, candidates, f"{split} file")
        for line_no, row in readers.read_tsv_columns(path, required=text_columns, skip_malformed=skip_malformed):
            source = f"{path}:{line_no}"
            if row is None:
                yield kgpt.Skipped(source, "row with a wrong number of fields")
                continue
            label = row.get(label_column)
            yield kgpt.Example(
                segments=tuple(row[c] for c in text_columns),
                label=None if label is None else label.strip(),
                source=source,
                uid=row.get("index", row.get("id", source)).strip(),
            )

    return read


def read_cola(split, data_dir):
    """CoLA: train/dev without a header (source, label, original mark, sentence); test has one."""
    path = readers.find_file(data_dir, [f"{split}.tsv"], f"CoLA {split} file")
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        headed = f.readline().startswith("index\tsentence")
    if headed:
        yield from tsv_reader(["sentence"], "label")(split, data_dir)
        return
    for line_no, (_, label, _, sentence) in readers.read_tsv(path, num_columns=4):
        source = f"{path}:{line_no}"
        yield kgpt.Example(segments=(sentence,), label=label.strip(), source=source, uid=source)


def glue_task(name, submission, **fields):
    return kgpt.Task(name=name, splits=SPLITS, submissions={"test": submission}, **fields)


TASKS = [
    glue_task(
        "cola",
        "CoLA.tsv",
        transform=Classification(),
        labels=("0", "1"),
        metrics=("matthews",),
        read=read_cola,
        paper_score="45.4 mc",
        description="CoLA acceptability (GLUE).",
        zero_shot=ThresholdedLogProb(positive="1"),
        default_data=glue_demo.write_cola,
    ),
    glue_task(
        "sst2",
        "SST-2.tsv",
        transform=Classification(),
        labels=("0", "1"),
        metrics=("accuracy",),
        read=tsv_reader(["sentence"], "label"),
        paper_score="91.3 acc",
        description="SST-2 sentiment (GLUE).",
        zero_shot=NextWordChoice({"1": "positive", "0": "negative"}, suffix="very"),
        default_data=glue_demo.write_sst2,
    ),
    glue_task(
        "mrpc",
        "MRPC.tsv",
        transform=Similarity(),
        labels=("0", "1"),
        metrics=("f1", "accuracy"),
        read=tsv_reader(
            ["#1 String", "#2 String"],
            "Quality",
            files={"train": ["msr_paraphrase_train.txt"], "test": ["msr_paraphrase_test.txt"]},
        ),
        paper_score="82.3 F1",
        description="MRPC paraphrase (GLUE or Microsoft's files).",
    ),
    glue_task(
        "qqp",
        "QQP.tsv",
        transform=Similarity(),
        labels=("0", "1"),
        metrics=("f1", "accuracy"),
        read=tsv_reader(["question1", "question2"], "is_duplicate", skip_malformed=True),
        paper_score="70.3 F1",
        description="Quora Question Pairs (GLUE).",
    ),
    glue_task(
        "stsb",
        "STS-B.tsv",
        transform=Similarity(),
        metrics=("pearson", "spearman"),
        read=tsv_reader(["sentence1", "sentence2"], "score"),
        paper_score="82.0 pc",
        description="STS-B similarity score 0-5, regression (GLUE).",
    ),
    glue_task(
        "qnli",
        "QNLI.tsv",
        transform=Entailment(),
        labels=("entailment", "not_entailment"),
        metrics=("accuracy",),
        read=tsv_reader(["question", "sentence"], "label"),
        paper_score="88.1 acc",
        description="QNLI question/sentence entailment (GLUE).",
    ),
    glue_task(
        "rte",
        "RTE.tsv",
        transform=Entailment(),
        labels=("entailment", "not_entailment"),
        metrics=("accuracy",),
        read=tsv_reader(["sentence1", "sentence2"], "label"),
        paper_score="56.0 acc",
        description="RTE entailment (GLUE).",
    ),
]


@kgpt.hookimpl
def register_tasks(register):
    for task in TASKS:
        register(task)
