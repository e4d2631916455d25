"""DPRD, the Definite Pronoun Resolution Dataset (Rahman & Ng, 2012): the paper's Winograd zero-shot task.

`--data_dir` holds `train.c.txt` and `test.c.txt` as distributed: one example
per block of four lines (the sentence, the target pronoun, the two candidate
antecedents separated by a comma, the correct antecedent) and a blank line
between blocks. The pronoun's first occurrence as a whole word is resolved.
Examples become `segments=(text before the pronoun, text after it)` with the
candidates as `choices`, for `PronounSubstitution` (section 5 of the paper);
fine-tuning sees `[start] before after [delim] candidate [extract]`.
"""

import re

import kgpt
from kgpt.data import readers
from kgpt.tasks.heuristics import PronounSubstitution
from kgpt.tasks.transforms import MultipleChoice

FILES = {"train": ["train.c.txt"], "test": ["test.c.txt"]}


def _blocks(path):
    block = []
    for line_no, line in readers.read_lines(path):
        line = line.rstrip("\r\n")
        if line.strip():
            block.append((line_no, line.strip()))
            continue
        if block:
            yield block
            block = []
    if block:
        yield block


def read(split, data_dir):
    path = readers.find_file(data_dir, FILES.get(split, [f"{split}.c.txt"]), f"DPRD {split} file")
    for block in _blocks(path):
        first = block[0][0]
        source = f"{path}:{first}"
        if len(block) != 4:
            raise kgpt.DataError(
                f"{source}: expected 4 lines (sentence, pronoun, 'candidate,candidate', answer), got {len(block)}."
            )
        (_, sentence), (_, pronoun), (_, candidates), (_, answer) = block
        choices = tuple(c.strip() for c in candidates.split(","))
        if len(choices) != 2 or not all(choices):
            raise kgpt.DataError(
                f"{path}:{first + 2}: expected two candidates separated by a comma, got {candidates!r}."
            )
        if answer not in choices:
            raise kgpt.DataError(f"{path}:{first + 3}: answer {answer!r} is not one of the candidates {choices}.")
        match = re.search(rf"(?<!\w){re.escape(pronoun)}(?!\w)", sentence, flags=re.IGNORECASE)
        if match is None:
            raise kgpt.DataError(f"{path}:{first + 1}: pronoun {pronoun!r} does not occur in the sentence.")
        before, after = sentence[: match.start()].strip(), sentence[match.end() :].strip()
        if not after:
            yield kgpt.Skipped(source, "nothing follows the pronoun to score")
            continue
        yield kgpt.Example(segments=(before, after), choices=choices, label=choices.index(answer), source=source)


TASK = kgpt.Task(
    name="dprd",
    transform=MultipleChoice(2, num_segments=2),  # the sentence before the pronoun and after it
    read=read,
    splits=("train", "test"),
    description="DPRD Winograd-style pronoun resolution (zero-shot in the paper, section 5).",
    zero_shot=PronounSubstitution(),
)


@kgpt.hookimpl
def register_tasks(register):
    register(TASK)
