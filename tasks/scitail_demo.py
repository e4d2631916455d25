"""The embedded SciTail-format dataset: which living things are animals (written for kgpt, CC0).

Each premise describes one member of the demo world (`kgpt.data.demo_world`,
the text the demo pre-trains on) by two of its kind's properties; the
hypothesis says it is an animal. Birds, fish and mammals entail it; trees,
flowers and vegetables leave it `neutral`. Dev and test ask about members
and properties that training never shows, so a model fine-tuned without
pre-training can only guess (about 50%), while one pre-trained on the demo
text has read what each of them is. Generated deterministically; `write()`
lays it out as SciTail's `tsv_format`.
"""

import os
import random

from kgpt.data import demo_world

HYPOTHESES = ["{name} is an animal.", "{name} is a kind of animal."]
PREMISES_PER_MEMBER = {"train": 4, "dev": 3, "test": 3}


def rows(split):
    """`(premise, hypothesis, label)` rows of one split, in a fixed shuffled order."""
    rng = random.Random(f"scitail-demo-{split}")
    out = []
    for kind in demo_world.KINDS:
        label = "entails" if demo_world.GROUP[kind] == "animal" else "neutral"
        properties = demo_world.split_properties(kind, split)
        for word in demo_world.split_members(kind, split):
            name = demo_world.capital(demo_world.the(word))
            for i in range(PREMISES_PER_MEMBER[split]):
                first, second = (demo_world.fill(p, rng) for p in rng.sample(properties, 2))
                out.append((f"{name} {first}, and it {second}.", HYPOTHESES[i % 2].format(name=name), label))
    rng.shuffle(out)
    return out


def write(directory):
    """Writes `directory/tsv_format/scitail_1.0_{train,dev,test}.tsv`; returns `directory`."""
    folder = os.path.join(directory, "tsv_format")
    os.makedirs(folder, exist_ok=True)
    for split in demo_world.SPLITS:
        with open(os.path.join(folder, f"scitail_1.0_{split}.tsv"), "w", encoding="utf-8") as f:
            f.writelines("\t".join(row) + "\n" for row in rows(split))
    return directory
