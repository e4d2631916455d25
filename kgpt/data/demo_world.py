"""The embedded demo's text: a small natural-history world, generated (written for kgpt, CC0).

Ninety-six living things of six kinds (birds, fish and mammals, which are
animals; trees, flowers and vegetables, which are plants), each with eight
properties its kind shares. `corpus()` writes encyclopedia-style paragraphs
about all of them: what kind each is, whether it is an animal or a plant, and
its kind's properties. The demo pre-trains on that text
(`kgpt-train --task lm` without `--corpus`), and the embedded SciTail set
(`kgpt_tasks.scitail_demo`) asks which of them are animals, from properties
and names that fine-tuning never shows for its dev and test splits
(`split_members`, `split_properties`): only what pre-training read can tell
them apart, so fine-tuning without pre-training scores about chance there.

Everything is drawn from `random.Random(seed)`, so the same seed writes the
same text.

Example:
```python
from kgpt.data import demo_world
print(demo_world.corpus(paragraphs=2))
```
"""

import os
import random

# kind: (plural, members, properties). A property may hold a {place} to fill.
KINDS = {
    "bird": (
        "birds",
        [
            "heron",
            "sparrow",
            "eagle",
            "owl",
            "robin",
            "crow",
            "hawk",
            "swan",
            "parrot",
            "pigeon",
            "falcon",
            "gull",
            "wren",
            "finch",
            "stork",
            "pelican",
        ],
        [
            "has feathers and a beak",
            "lays its eggs in a nest",
            "flies over the {place}",
            "sings at dawn",
            "builds its nest in the {plant}",
            "flies south in the autumn",
            "catches insects in the air",
            "spreads its wings to fly",
        ],
    ),
    "fish": (
        "fish",
        [
            "salmon",
            "trout",
            "cod",
            "tuna",
            "shark",
            "carp",
            "pike",
            "herring",
            "perch",
            "bass",
            "sardine",
            "mackerel",
            "halibut",
            "minnow",
            "eel",
            "anchovy",
        ],
        [
            "swims in the {water}",
            "breathes through its gills",
            "has scales and fins",
            "lays its eggs in the water",
            "swims in large schools",
            "hides among the rocks of the {water}",
            "moves its tail to swim",
            "cannot live out of water",
        ],
    ),
    "mammal": (
        "mammals",
        [
            "whale",
            "dolphin",
            "fox",
            "wolf",
            "bear",
            "rabbit",
            "deer",
            "mouse",
            "horse",
            "otter",
            "badger",
            "squirrel",
            "beaver",
            "goat",
            "tiger",
            "camel",
        ],
        [
            "feeds its young with milk",
            "has warm blood and thick fur",
            "sleeps in a den",
            "gives birth to live young",
            "hunts at night",
            "grows a thicker coat in the winter",
            "cares for its young for many months",
            "breathes air with its lungs",
        ],
    ),
    "tree": (
        "trees",
        [
            "oak",
            "maple",
            "pine",
            "birch",
            "willow",
            "cedar",
            "elm",
            "spruce",
            "fir",
            "beech",
            "poplar",
            "walnut",
            "chestnut",
            "hemlock",
            "sycamore",
            "larch",
        ],
        [
            "grows tall in the forest",
            "drops its leaves in the autumn",
            "has deep roots and a thick trunk",
            "makes seeds in the spring",
            "is cut for timber",
            "gives shade in the summer",
            "grows on the hills near the {place}",
            "takes in water through its roots",
        ],
    ),
    "flower": (
        "flowers",
        [
            "rose",
            "tulip",
            "daisy",
            "lily",
            "orchid",
            "poppy",
            "violet",
            "iris",
            "lotus",
            "daffodil",
            "sunflower",
            "marigold",
            "lilac",
            "jasmine",
            "peony",
            "lavender",
        ],
        [
            "opens its petals in the morning",
            "has a sweet smell",
            "is visited by bees",
            "blooms in the spring",
            "has bright petals and a green stem",
            "grows in the garden by the {place}",
            "makes seeds after it blooms",
            "closes its petals at night",
        ],
    ),
    "vegetable": (
        "vegetables",
        [
            "carrot",
            "potato",
            "onion",
            "cabbage",
            "turnip",
            "lettuce",
            "spinach",
            "pumpkin",
            "radish",
            "celery",
            "pea",
            "bean",
            "cucumber",
            "leek",
            "beet",
            "parsnip",
        ],
        [
            "grows in the garden soil",
            "is picked in the autumn",
            "is cooked for dinner",
            "grows from a small seed",
            "is sold at the market",
            "has green leaves above the ground",
            "is stored in a cool cellar",
            "grows in rows on the farm near the {place}",
        ],
    ),
}
GROUP = {
    "bird": "animal",
    "fish": "animal",
    "mammal": "animal",
    "tree": "plant",
    "flower": "plant",
    "vegetable": "plant",
}
_FILL = {
    "place": ["river", "lake", "valley", "hills", "coast", "marsh", "mountains", "meadow"],
    "plant": ["reeds", "tall grass", "bushes", "old trees", "flowers", "hedges"],
    "water": ["river", "sea", "lake", "cold ocean", "deep water", "stream"],
}
_GROUP_HABIT = {"animal": "moves and eats", "plant": "grows from the soil"}

SPLITS = ("train", "dev", "test")
_MEMBERS = {"train": slice(0, 8), "dev": slice(8, 12), "test": slice(12, 16)}
_PROPERTIES = {"train": slice(0, 5), "dev": slice(5, 8), "test": slice(5, 8)}


def split_members(kind, split):
    """The members of `kind` a split asks about: 8 in train, 4 others in dev, 4 more in test."""
    return KINDS[kind][1][_MEMBERS[split]]


def split_properties(kind, split):
    """The properties of `kind` a split's premises use: 5 in train; the other 3 in dev and test."""
    return KINDS[kind][2][_PROPERTIES[split]]


def the(word):
    return f"the {word}"


def a(noun):
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def capital(text):
    return text[:1].upper() + text[1:]


def fill(phrase, rng):
    """`phrase` with each {place}, {plant} or {water} replaced by a random choice."""
    for key, values in _FILL.items():
        while "{" + key + "}" in phrase:
            phrase = phrase.replace("{" + key + "}", rng.choice(values), 1)
    return phrase


def paragraph(rng, kind, word):
    """A few sentences about one member: its kind, its group and some of its kind's properties."""
    plural, members, properties = KINDS[kind]
    name, group = the(word), GROUP[kind]
    other = the(rng.choice([w for w in members if w != word]))
    unlike_kind = rng.choice([k for k in KINDS if k != kind])
    unlike = the(rng.choice(KINDS[unlike_kind][1]))
    p = rng.sample(properties, 4)
    first = [
        f"{capital(name)} is {a(kind)}.",
        f"{capital(name)} is {a(kind)} that {fill(rng.choice(properties), rng)}.",
    ]
    rest = [
        f"{capital(name)} {fill(p[0], rng)}.",
        f"Like other {plural}, {name} {fill(p[1], rng)}.",
        f"It {fill(p[2], rng)}.",
        f"{capital(name)} and {other} are both {plural}.",
        f"Unlike {unlike}, {name} {fill(p[3], rng)}.",
        f"Students often read about {name}, which is {a(kind)}.",
        f"{capital(name)} is {a(group)}, because every {kind} is {a(group)}.",
        f"Like every {group}, {name} {_GROUP_HABIT[group]}.",
    ]
    rng.shuffle(rest)
    return " ".join([rng.choice(first)] + rest[: rng.randint(3, 6)])


def corpus(paragraphs=3000, seed=0):
    """`paragraphs` paragraphs, each about a member drawn at random, separated by blank lines."""
    rng = random.Random(seed)
    members = [(kind, word) for kind, (_, words, _) in KINDS.items() for word in words]
    return "\n\n".join(paragraph(rng, *rng.choice(members)) for _ in range(paragraphs)) + "\n"


def corpus_path(directory):
    """Where `write_corpus` writes the demo text in `directory`."""
    return os.path.join(directory, "demo_corpus.txt")


def write_corpus(directory, paragraphs=3000, seed=0):
    """Writes `corpus()` to `directory/demo_corpus.txt` (unless it already holds that text); returns its path."""
    path = corpus_path(directory)
    text = corpus(paragraphs, seed)
    if not os.path.exists(path) or open(path, encoding="utf-8").read() != text:
        os.makedirs(directory, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return path
