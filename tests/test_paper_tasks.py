"""The paper's 12 datasets as built-in tasks: each trains end to end on tiny files in its real format."""

import csv
import json
import os

import pytest
from conftest import one_backend

import kgpt
from kgpt.jobs import finetune as finetune_lib
from kgpt.jobs import finetune_data
from kgpt.jobs.config import FinetuneConfig

REGISTRY = kgpt.TaskRegistry()
SENTENCES = [
    "the cat sat on the mat.",
    "a dog ran far away!",
    "rain falls in spring.",
    "why is the sky blue?",
    "she wrote a long letter.",
    "the train was late again.",
]


def pairs(n):
    return [(SENTENCES[i % 6], SENTENCES[(i + 1) % 6]) for i in range(n)]


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def tsv(path, header, rows):
    write(path, "".join("\t".join(map(str, r)) + "\n" for r in ([header] if header else []) + rows))


def write_glue(folder, name):
    """GLUE-format train/dev/test files for `name` (12 train, 6 dev, 4 test rows)."""
    d = str(folder)
    for split, n in (("train", 12), ("dev", 6), ("test", 4)):
        test = split == "test"
        path = os.path.join(d, f"{split}.tsv")
        p = pairs(n)
        if name == "cola":
            if test:
                tsv(path, ["index", "sentence"], [(i, a) for i, (a, _) in enumerate(p)])
            else:
                tsv(path, None, [("gj04", i % 2, "*" if i % 2 == 0 else "", a) for i, (a, _) in enumerate(p)])
        elif name == "sst2":
            tsv(
                path,
                ["index", "sentence"] if test else ["sentence", "label"],
                [(i, a) if test else (a + " ", i % 2) for i, (a, _) in enumerate(p)],
            )
        elif name == "mrpc":
            head = ["index" if test else "Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
            tsv(path, head, [(i if test else i % 2, 100 + i, 200 + i, a, b) for i, (a, b) in enumerate(p)])
        elif name == "qqp":
            if test:
                tsv(path, ["id", "question1", "question2"], [(i, a, b) for i, (a, b) in enumerate(p)])
            else:
                tsv(
                    path,
                    ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                    [(i, 2 * i, 2 * i + 1, a, b, i % 2) for i, (a, b) in enumerate(p)],
                )
        elif name == "stsb":
            head = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2"]
            tsv(
                path,
                head + ([] if test else ["score"]),
                [
                    (i, "main-captions", "MSRvid", "2012test", i, "none", "none", a, b)
                    + (() if test else (f"{i % 6:.3f}",))
                    for i, (a, b) in enumerate(p)
                ],
            )
        elif name in ("qnli", "rte"):
            cols = ["question", "sentence"] if name == "qnli" else ["sentence1", "sentence2"]
            labels = ["entailment", "not_entailment"]
            tsv(
                path,
                ["index", *cols] + ([] if test else ["label"]),
                [(i, a, b) + (() if test else (labels[i % 2],)) for i, (a, b) in enumerate(p)],
            )
    return d


def write_nli(folder, name):
    d, labels = str(folder), ["entailment", "neutral", "contradiction"]
    if name == "snli":
        for split, n in (("train", 12), ("dev", 6), ("test", 6)):
            write(
                os.path.join(d, f"snli_1.0_{split}.jsonl"),
                "".join(
                    json.dumps(
                        {
                            "gold_label": labels[i % 3],
                            "sentence1": a,
                            "sentence2": b,
                            "pairID": f"p{i}",
                            "annotator_labels": [labels[i % 3]],
                        }
                    )
                    + "\n"
                    for i, (a, b) in enumerate(pairs(n))
                ),
            )
        return d
    head = [
        "index",
        "promptID",
        "pairID",
        "genre",
        "sentence1_binary_parse",
        "sentence2_binary_parse",
        "sentence1_parse",
        "sentence2_parse",
        "sentence1",
        "sentence2",
    ]
    for split, n in (
        ("train", 12),
        ("dev_matched", 6),
        ("dev_mismatched", 6),
        ("test_matched", 3),
        ("test_mismatched", 3),
    ):
        test = split.startswith("test")
        tsv(
            os.path.join(d, f"{split}.tsv"),
            head + ([] if test else ["label1", "gold_label"]),
            [
                (i, i, f"{i}e", "fiction", "( x )", "( y )", "(ROOT x)", "(ROOT y)", a, b)
                + (() if test else (labels[i % 3], labels[i % 3]))
                for i, (a, b) in enumerate(pairs(n))
            ],
        )
    return d


def race_passage(i):
    return {
        "id": f"{i}.txt",
        "article": " ".join(SENTENCES),
        "questions": ["what sat on the mat?", "what ran?"],
        "options": [["the cat", "a dog", "rain", "sky"], ["a dog", "the cat", "a train", "rain"]],
        "answers": ["A", "B"],
    }


def write_race(folder):
    for split in ("train", "dev", "test"):
        for level in ("middle", "high"):
            for i in range(3 if split == "train" else 1):
                write(os.path.join(str(folder), split, level, f"{i}.txt"), json.dumps(race_passage(i)))
    return str(folder)


def write_story_cloze(folder):
    head = (
        "InputStoryid,InputSentence1,InputSentence2,InputSentence3,InputSentence4,"
        "RandomFifthSentenceQuiz1,RandomFifthSentenceQuiz2,AnswerRightEnding\n"
    )
    for split, n in (("val", 8), ("test", 4)):
        rows = "".join(
            f'id{i},{SENTENCES[0]},"{SENTENCES[1]}, said she",{SENTENCES[2]},{SENTENCES[3]},'
            f"{SENTENCES[4]},{SENTENCES[5]},{1 + i % 2}\n"
            for i in range(n)
        )
        name = f"cloze_test_{split}__spring2016 - cloze_test_ALL_{split}.csv"
        write(os.path.join(str(folder), name), head + rows)
    return str(folder)


def write_dataset(name, folder):
    if name in ("cola", "sst2", "mrpc", "qqp", "stsb", "qnli", "rte"):
        return write_glue(folder, name)
    if name in ("snli", "mnli"):
        return write_nli(folder, name)
    if name.startswith("race"):
        return write_race(folder)
    return write_story_cloze(folder)


PAPER_TASKS = [
    "cola",
    "sst2",
    "mrpc",
    "qqp",
    "stsb",
    "qnli",
    "rte",
    "snli",
    "mnli",
    "race",
    "race-middle",
    "race-high",
    "story-cloze",
    "scitail",
]


def test_the_paper_datasets_are_all_listed():
    assert set(PAPER_TASKS) <= set(REGISTRY.names())
    assert not REGISTRY.problems()
    table = REGISTRY.describe()
    for score in (
        "45.4 mc",
        "91.3 acc",
        "82.3 F1",
        "70.3 F1",
        "82.0 pc",
        "88.1 acc",
        "56.0 acc",
        "89.9 acc",
        "82.1 / 81.4 acc (m/mm)",
        "59.0 acc",
        "62.9 acc",
        "57.4 acc",
        "86.5 acc",
        "88.3 acc",
    ):
        assert score in table


# RACE's three tasks share their reader, transform and head: race-high trains end to end here, and
# test_race_levels_read_their_own_folders checks what each reads; the other two train under -m large.
TRAINED_IN_LARGE = ("race", "race-middle")
# What a backend runs of a task is its transformation and head: each pair of those trains on both backends
# (stsb, the only regression, on both), each task on one, alternately; -m large trains every task on both.
ON_ONE_BACKEND = {
    "jax": ("sst2", "qqp", "rte", "mnli", "story-cloze"),  # the shorter runs: JAX's half of CI is the longer
    "tensorflow": ("cola", "mrpc", "qnli", "snli", "race-high"),
}


def _marks(name):
    if name in TRAINED_IN_LARGE:
        return [pytest.mark.large]
    return [one_backend(b) for b, names in ON_ONE_BACKEND.items() if name in names]


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=_marks(n)) for n in PAPER_TASKS if n != "scitail"],  # scitail: test_finetune.py
)
def test_trains_end_to_end_on_files_in_the_real_format(name, tiny_preset, tmp_path):
    task = REGISTRY.get(name)
    data = write_dataset(name, tmp_path / "data")
    config = FinetuneConfig(
        task=name,
        data_dir=data,
        init=tiny_preset,
        output_dir=str(tmp_path / "out"),
        epochs=1,
        batch_size=4,
        learning_rate=1e-3,
        max_length=96,
        predict_test=True,
    )
    _, results = finetune_lib.finetune(config, registry=REGISTRY)
    metric_names = list(task.metrics)
    scored = [
        s
        for s in task.splits[1:]
        if not s.startswith("test") or name in ("snli", "story-cloze") or name.startswith("race")
    ]
    for split in scored:
        assert set(metric_names) <= set(results["splits"][split]), (split, results["splits"][split])
    if getattr(task.head, "names", None):  # RACE's letters, Story Cloze's 1 and 2: written as the data has them
        rows = list(csv.DictReader(open(tmp_path / "out" / "predictions" / f"{scored[0]}.tsv"), delimiter="\t"))
        assert rows and {r["prediction"] for r in rows} <= set(task.head.names), rows[:2]
        assert {r["label"] for r in rows} <= set(task.head.names), rows[:2]
        assert [k for k in rows[0] if k.startswith("p_")] == [f"p_{n}" for n in task.head.names]
    for split, file_name in (task.submissions or {}).items():
        lines = (tmp_path / "out" / "submission" / file_name).read_text().splitlines()
        assert lines[0] == "index\tprediction"
        assert len(lines) == 1 + results["splits"][split]["examples"]["used"]
        assert {line.split("\t")[1] for line in lines[1:]} <= set(
            task.labels or ()
        ) or task.head == kgpt.tasks.heads.RegressionHead()


def encode(name, data, split="train"):
    task = REGISTRY.get(name)
    preprocessor = kgpt.GPTTaskPreprocessor(kgpt.GPTTokenizer.gpt1(), task.transform, sequence_length=128)
    return finetune_data.encode_split(task, split, data, preprocessor)


def test_glue_errors_name_file_and_line(tmp_path):
    data = write_glue(tmp_path / "rte", "rte")
    with open(os.path.join(data, "train.tsv"), "a") as f:
        f.write("99\tonly one sentence\tentailment\n")
    with pytest.raises(
        kgpt.DataError,
        match=r"rte/train.tsv:14: expected 4 tab-separated fields as in the header, "
        r"got 3",
    ):
        encode("rte", data)
    tsv(os.path.join(data, "train.tsv"), ["index", "sentence1", "sentence2", "label"], [(0, "a b", "c d", "maybe")])
    with pytest.raises(
        kgpt.DataError,
        match=r"train.tsv:2: label 'maybe' is not one of 'entailment', "
        r"'not_entailment'",
    ):
        encode("rte", data)
    tsv(os.path.join(data, "train.tsv"), ["index", "premise", "hypothesis", "label"], [(0, "a", "b", "entailment")])
    with pytest.raises(kgpt.DataError, match=r"train.tsv:1: the header lacks column\(s\) sentence1, sentence2"):
        encode("rte", data)


def test_qqp_rows_with_missing_fields_are_skipped_and_counted(tmp_path):
    data = write_glue(tmp_path / "qqp", "qqp")
    with open(os.path.join(data, "train.tsv"), "a") as f:
        f.write("77\t1\t2\ta question with no pair\n")
    split = encode("qqp", data)
    assert split.counts["skipped_reasons"] == {"row with a wrong number of fields": 1}
    assert split.counts["read"] == 13 and split.counts["used"] == 12


def test_snli_counts_no_consensus_rows_and_names_bad_json(tmp_path):
    data = write_nli(tmp_path / "snli", "snli")
    path = os.path.join(data, "snli_1.0_train.jsonl")
    with open(path, "a") as f:
        f.write(json.dumps({"gold_label": "-", "sentence1": "a", "sentence2": "b"}) + "\n")
    assert encode("snli", data).counts["skipped_reasons"] == {"gold label '-' (no annotator consensus)": 1}
    with open(path, "a") as f:
        f.write('{"gold_label": "neutral", "sentence1": "a"\n')
    with pytest.raises(kgpt.DataError, match=r"snli_1.0_train.jsonl:14: not valid JSON"):
        encode("snli", data)


def test_race_levels_read_their_own_folders(tmp_path):
    data = write_race(tmp_path / "race")
    ids = {
        name: [(e.source, e.uid) for e in REGISTRY.get(name).examples("train", data)[0]]
        for name in ("race", "race-middle", "race-high")
    }
    assert len(ids["race-middle"]) == len(ids["race-high"]) == 6  # 3 passages of 2 questions
    assert sorted(ids["race"]) == sorted(ids["race-middle"] + ids["race-high"])
    assert {os.path.basename(os.path.dirname(source.split(":")[0])) for source, _ in ids["race-middle"]} == {"middle"}
    assert {os.path.basename(os.path.dirname(source.split(":")[0])) for source, _ in ids["race-high"]} == {"high"}


def test_race_errors(tmp_path):
    data = write_race(tmp_path / "race")
    bad = os.path.join(data, "train", "high", "9.txt")
    write(bad, json.dumps({**race_passage(9), "answers": ["A", "E"]}))
    with pytest.raises(kgpt.DataError, match=r"9.txt:1 \(question 2\): answer 'E' is not one of A, B, C, D"):
        encode("race-high", data)
    with open(bad, "wb") as f:
        f.write(b'{"article": "caf\xe9"}')
    with pytest.raises(kgpt.DataError, match=r"9.txt:1: byte 17 of the line \(0xe9\) is not valid UTF-8"):
        encode("race", data)
    with pytest.raises(FileNotFoundError, match=r"No RACE dev files found"):
        encode("race", str(tmp_path / "nowhere"), split="dev")


def test_story_cloze_errors(tmp_path):
    data = write_story_cloze(tmp_path / "sc")
    path = os.path.join(data, "cloze_test_val__spring2016 - cloze_test_ALL_val.csv")
    with open(path, "a") as f:
        f.write("idx,one,two,three,four,end one,end two,3\n")
    with pytest.raises(kgpt.DataError, match=r"ALL_val.csv:10: AnswerRightEnding '3' is not 1 or 2"):
        encode("story-cloze", data, split="val")
    write_story_cloze(tmp_path / "sc")
    with open(path, "a") as f:
        f.write("idy,one,two\n")
    with pytest.raises(kgpt.DataError, match=r"ALL_val.csv:10: expected 8 comma-separated fields, got 3"):
        encode("story-cloze", data, split="val")


def test_empty_text_is_counted_not_silently_dropped(tmp_path):
    data = write_glue(tmp_path / "sst2", "sst2")
    with open(os.path.join(data, "train.tsv"), "a") as f:
        f.write(" \t1\n\x01\x02\t0\n\x7f\ufeff\t1\n")  # the last two: no tokens, trained on as [start][extract] before
    counts = encode("sst2", data).counts
    assert counts["skipped_reasons"] == {"empty text field": 1, "text with no tokens": 2}
    assert counts["read"] == counts["used"] + counts["skipped"]
