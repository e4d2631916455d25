"""The embedded SciTail-format dataset: science facts written for kgpt (CC0).

Every subject has two true facts. An `entails` pair states a fact in the
premise and again as the hypothesis; a `neutral` pair states the subject's
*other* fact in the premise, so premise and hypothesis share their subject
but the premise does not support the hypothesis (SciTail's neutral pairs are
topically related too). Splits are by subject, so dev and test ask about
subjects never seen in training: only comparing what is said, not recalling
subjects, scores above chance (50%). Generated deterministically; `write()`
lays it out as SciTail's `tsv_format`.
"""

import os
import random

FACTS = [
    ("the heart", "pumps blood through the body", "has four chambers in humans"),
    ("the lungs", "take in oxygen from the air", "are protected by the rib cage"),
    ("plants", "make their own food by photosynthesis", "take in water through their roots"),
    ("the moon", "orbits the earth about once a month", "reflects light from the sun"),
    ("water", "boils at 100 degrees celsius at sea level", "expands when it freezes"),
    ("iron", "rusts when it is exposed to air and moisture", "is attracted by a magnet"),
    ("the sun", "is the star at the center of the solar system", "gives off light and heat"),
    ("earthquakes", "happen when plates in the crust move suddenly", "are measured with a seismograph"),
    ("bees", "carry pollen from flower to flower", "make honey from nectar"),
    ("sound", "travels as a wave through matter", "cannot travel through empty space"),
    ("mammals", "feed their young with milk", "have hair or fur on their bodies"),
    ("volcanoes", "release molten rock called lava", "can form new islands in the ocean"),
    ("the skeleton", "supports and protects the body", "has more than two hundred bones in adults"),
    ("glaciers", "carve valleys as they move", "form where snow builds up over many years"),
    ("copper", "conducts electricity well", "is used to make electrical wires"),
    ("fish", "breathe with gills", "are cold-blooded animals"),
    ("clouds", "form when water vapor condenses", "are made of tiny drops of water or ice"),
    ("the stomach", "breaks down food with acid", "is part of the digestive system"),
    ("fossils", "are the remains of ancient living things", "are often found in sedimentary rock"),
    ("magnets", "have a north pole and a south pole", "attract objects made of iron"),
    ("seeds", "grow into new plants", "are spread by wind, water and animals"),
    ("the earth", "rotates once every twenty four hours", "is the third planet from the sun"),
    ("rainbows", "appear when sunlight passes through raindrops", "show the colors of visible light"),
    ("frogs", "begin life as tadpoles in water", "are amphibians"),
    ("salt", "dissolves easily in water", "is made of sodium and chlorine"),
    ("the brain", "controls the nervous system", "is protected by the skull"),
    ("wind", "is caused by differences in air pressure", "can be used to make electricity"),
    ("leaves", "change color in the fall", "contain the green pigment chlorophyll"),
    ("ice", "melts at zero degrees celsius", "floats on liquid water"),
    ("mercury", "is the planet closest to the sun", "has almost no atmosphere"),
    ("bacteria", "are single celled organisms", "can cause diseases"),
    ("light", "travels faster than sound", "can be reflected by a mirror"),
]

PREMISES = [
    "In science class we learned that {s} {p}.",
    "A textbook chapter explains that {s} {p}, which students can observe.",
    "Scientists have shown that {s} {p}.",
]

SPLITS = {"train": FACTS[:22], "dev": FACTS[22:27], "test": FACTS[27:]}


def _sentence(subject, predicate):
    return f"{subject[0].upper()}{subject[1:]} {predicate}."


def rows(split):
    """`(premise, hypothesis, label)` rows of one split, in a fixed shuffled order."""
    out = []
    for subject, first, second in SPLITS[split]:
        for fact, other in ((first, second), (second, first)):
            hypothesis = _sentence(subject, fact)
            for template in PREMISES:
                out.append((template.format(s=subject, p=fact), hypothesis, "entails"))
                out.append((template.format(s=subject, p=other), hypothesis, "neutral"))
    random.Random(split).shuffle(out)
    return out


def write(directory):
    """Writes `directory/tsv_format/scitail_1.0_{train,dev,test}.tsv`; returns `directory`."""
    folder = os.path.join(directory, "tsv_format")
    os.makedirs(folder, exist_ok=True)
    for split in SPLITS:
        with open(os.path.join(folder, f"scitail_1.0_{split}.tsv"), "w", encoding="utf-8") as f:
            f.writelines("\t".join(row) + "\n" for row in rows(split))
    return directory
