"""Embedded SST-2 and CoLA-format data, written for kgpt (CC0), for runs without `--data_dir`.

They exist so that `kgpt-analyze` (zero-shot curves) and `kgpt-train --task
sst2|cola` run end to end on a fresh machine; they are small and regular, not
benchmarks.

- SST-2 format (`sentence` TAB `label`, header row): short reviews whose
  sentiment is carried by one adjective or verb, positive (1) or negative (0).
- CoLA format (source, label, mark, sentence; no header): sentences built
  from templates are acceptable (1); the same sentences with the words of a
  phrase swapped or the verb's agreement broken are unacceptable (0).

Generated deterministically; dev uses subjects unseen in train.
"""

import os
import random

SUBJECTS = [
    "the film",
    "the movie",
    "this story",
    "the acting",
    "the plot",
    "the music",
    "the ending",
    "the script",
    "the director's work",
    "the cast",
    "the dialogue",
    "the soundtrack",
    "the pacing",
    "the camera work",
    "this sequel",
    "the final scene",
    "the lead actor",
    "the humor",
]
POSITIVE = [
    "wonderful",
    "moving",
    "brilliant",
    "delightful",
    "charming",
    "gripping",
    "beautiful",
    "funny",
    "clever",
    "touching",
]
NEGATIVE = ["dull", "boring", "awful", "clumsy", "tedious", "bland", "painful", "lifeless", "messy", "forgettable"]
FRAMES = [
    "{s} is {a} .",
    "{s} was {a} from start to finish .",
    "i found {s} {a} .",
    "{s} feels {a} .",
    "honestly , {s} is {a} .",
]

NOUNS = [
    ("dog", "dogs"),
    ("teacher", "teachers"),
    ("child", "children"),
    ("farmer", "farmers"),
    ("bird", "birds"),
    ("student", "students"),
    ("doctor", "doctors"),
    ("cat", "cats"),
    ("pilot", "pilots"),
    ("baker", "bakers"),
    ("singer", "singers"),
    ("neighbor", "neighbors"),
]
VERBS = [
    ("sees", "see"),
    ("likes", "like"),
    ("follows", "follow"),
    ("helps", "help"),
    ("calls", "call"),
    ("finds", "find"),
    ("meets", "meet"),
    ("watches", "watch"),
]


def _split_items(items, dev_share=0.3):
    rng = random.Random(0)
    items = list(items)
    rng.shuffle(items)
    cut = int(len(items) * (1 - dev_share))
    return {"train": items[:cut], "dev": items[cut:]}


def sst2_rows(split):
    """`(sentence, label)` rows of the embedded SST-2-format split."""
    subjects = _split_items(SUBJECTS)[split]
    rng = random.Random(f"sst2-{split}")
    rows = []
    for subject in subjects:
        for frame in FRAMES:
            for label, words in (("1", POSITIVE), ("0", NEGATIVE)):
                rows.append((frame.format(s=subject, a=rng.choice(words)), label))
    rng.shuffle(rows)
    return rows


def cola_rows(split):
    """`(sentence, label)` rows of the embedded CoLA-format split."""
    nouns = _split_items(NOUNS)[split]
    rng = random.Random(f"cola-{split}")
    rows = []
    for subject in nouns:
        for verb in VERBS:
            obj = rng.choice([n for n in NOUNS if n != subject])
            plural = rng.random() < 0.5
            noun = subject[1] if plural else subject[0]
            good_verb, bad_verb = (verb[1], verb[0]) if plural else verb
            rows.append((f"the {noun} {good_verb} the {obj[0]} .", "1"))
            if rng.random() < 0.5:
                rows.append((f"the {noun} {bad_verb} the {obj[0]} .", "0"))  # agreement broken
            else:
                rows.append((f"{noun} the {good_verb} the {obj[0]} .", "0"))  # words swapped
    rng.shuffle(rows)
    return rows


def write_sst2(directory):
    """Writes GLUE's SST-2 layout (`train.tsv`, `dev.tsv`) in `directory`; returns it."""
    os.makedirs(directory, exist_ok=True)
    for split in ("train", "dev"):
        with open(os.path.join(directory, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("sentence\tlabel\n")
            f.writelines(f"{s}\t{label}\n" for s, label in sst2_rows(split))
    return directory


def write_cola(directory):
    """Writes GLUE's CoLA layout (`train.tsv`, `dev.tsv`, no header) in `directory`; returns it."""
    os.makedirs(directory, exist_ok=True)
    for split in ("train", "dev"):
        with open(os.path.join(directory, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.writelines(f"kgpt\t{label}\t{'' if label == '1' else '*'}\t{s}\n" for s, label in cola_rows(split))
    return directory
