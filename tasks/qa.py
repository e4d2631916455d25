"""RACE and the Story Cloze Test: multiple choice, accuracy.

RACE: `--data_dir` is the distributed `RACE` folder, `{train,dev,test}/{middle,high}/*.txt`,
one JSON object per passage with `article`, `questions`, `options` (4 per
question) and `answers` (letters). `race` uses both levels; `race-middle` and
`race-high` one each (the paper's RACE, RACE-m, RACE-h). Each question is an
example: context = article + question, one view per option.

Story Cloze: the 2016 CSV files (header `InputStoryid, InputSentence1..4,
RandomFifthSentenceQuiz1, RandomFifthSentenceQuiz2, AnswerRightEnding`). As in
the paper, the validation file trains and the test file is scored; the files
are `cloze_test_val__spring2016 - cloze_test_ALL_val.csv` and
`cloze_test_test__spring2016 - cloze_test_ALL_test.csv` (or `val.csv`, `test.csv`).
"""

import csv
import glob
import json
import os

import kgpt
from kgpt.data import readers
from kgpt.tasks.heads import MultipleChoiceHead
from kgpt.tasks.heuristics import AnswerLogProb
from kgpt.tasks.transforms import MultipleChoice

LETTERS = "ABCD"


def race_reader(levels):
    def read(split, data_dir):
        folders = [os.path.join(data_dir or "", split, level) for level in levels]
        files = sorted(f for folder in folders for f in glob.glob(os.path.join(folder, "*.txt")))
        if not files:
            raise FileNotFoundError(f"No RACE {split} files found; looked for *.txt in {', '.join(folders)}.")
        for path in files:
            yield from _race_file(path)

    return read


def _race_file(path):
    lines = list(readers.read_lines(path))
    text = "\n".join(line for _, line in lines)
    try:
        passage = json.loads(text)
    except json.JSONDecodeError as e:
        raise kgpt.DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno}).") from None
    source = f"{path}:1"
    if not isinstance(passage, dict):
        raise kgpt.DataError(f"{source}: expected a JSON object with article, questions, options, answers.")
    article = readers.field(passage, "article", source)
    questions, options, answers = (passage.get(k) for k in ("questions", "options", "answers"))
    if not (
        isinstance(questions, list)
        and isinstance(options, list)
        and isinstance(answers, list)
        and len(questions) == len(options) == len(answers)
    ):
        raise kgpt.DataError(f"{source}: questions, options and answers must be lists of one length.")
    for i, (question, choices, answer) in enumerate(zip(questions, options, answers)):
        where = f"{source} (question {i + 1})"
        if answer not in LETTERS:
            raise kgpt.DataError(f"{where}: answer {answer!r} is not one of A, B, C, D.")
        yield kgpt.Example(
            segments=(article, str(question)),
            choices=tuple(str(c) for c in choices),
            label=LETTERS.index(answer),
            source=where,
            uid=f"{passage.get('id', path)}#{i}",
        )


STORY_FILES = {
    "val": ["cloze_test_val__spring2016 - cloze_test_ALL_val.csv", "val.csv"],
    "test": ["cloze_test_test__spring2016 - cloze_test_ALL_test.csv", "test.csv"],
}
STORY_COLUMNS = [
    "InputStoryid",
    "InputSentence1",
    "InputSentence2",
    "InputSentence3",
    "InputSentence4",
    "RandomFifthSentenceQuiz1",
    "RandomFifthSentenceQuiz2",
    "AnswerRightEnding",
]


def read_story_cloze(split, data_dir):
    path = readers.find_file(data_dir, STORY_FILES.get(split, [f"{split}.csv"]), f"Story Cloze {split} file")
    # UTF-8 checked and BOM dropped per line; the line end goes back so that a quoted field holding a
    # newline keeps it (csv joins the lines of a record).
    lines = (line + "\n" for _, line in readers.read_lines(path))
    rows = csv.reader(lines)
    header = next(rows, None)
    if header != STORY_COLUMNS:
        raise kgpt.DataError(f"{path}:1: expected the header {','.join(STORY_COLUMNS)}.")
    while True:
        start = rows.line_num + 1  # a record may span lines: it is named by its first
        try:
            row = next(rows, None)
        except csv.Error as e:
            raise kgpt.DataError(f"{path}:{start}: {e}.") from None
        if row is None:
            return
        source = f"{path}:{start}"
        if len(row) != len(STORY_COLUMNS):
            raise kgpt.DataError(f"{source}: expected {len(STORY_COLUMNS)} comma-separated fields, got {len(row)}.")
        if row[7] not in ("1", "2"):
            raise kgpt.DataError(f"{source}: AnswerRightEnding {row[7]!r} is not 1 or 2.")
        yield kgpt.Example(
            segments=(" ".join(row[1:5]),), choices=(row[5], row[6]), label=int(row[7]) - 1, source=source, uid=row[0]
        )


TASKS = [
    kgpt.Task(
        name="race",
        transform=MultipleChoice(4, num_segments=2),  # the article and the question
        head=MultipleChoiceHead(4, names=LETTERS),  # predictions written as the data's answers are
        read=race_reader(["middle", "high"]),
        paper_score="59.0 acc",
        description="RACE reading comprehension, middle + high school.",
        zero_shot=AnswerLogProb(),
    ),
    kgpt.Task(
        name="race-middle",
        transform=MultipleChoice(4, num_segments=2),  # the article and the question
        head=MultipleChoiceHead(4, names=LETTERS),  # predictions written as the data's answers are
        read=race_reader(["middle"]),
        paper_score="62.9 acc",
        description="RACE-m: middle-school passages only.",
        zero_shot=AnswerLogProb(),
    ),
    kgpt.Task(
        name="race-high",
        transform=MultipleChoice(4, num_segments=2),  # the article and the question
        head=MultipleChoiceHead(4, names=LETTERS),  # predictions written as the data's answers are
        read=race_reader(["high"]),
        paper_score="57.4 acc",
        description="RACE-h: high-school passages only.",
        zero_shot=AnswerLogProb(),
    ),
    kgpt.Task(
        name="story-cloze",
        transform=MultipleChoice(2, num_segments=1),  # the four sentences, joined
        head=MultipleChoiceHead(2, names=("1", "2")),  # AnswerRightEnding's values
        read=read_story_cloze,
        splits=("val", "test"),
        paper_score="86.5 acc",
        description="Story Cloze Test 2016: the right ending of four sentences.",
        zero_shot=AnswerLogProb(),
    ),
]


@kgpt.hookimpl
def register_tasks(register):
    for task in TASKS:
        register(task)
