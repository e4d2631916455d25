"""The embedded demo's generated text and SciTail set: deterministic, and built so only pre-training can help."""

import os
import re

from kgpt.data import demo_world
from kgpt_tasks import scitail_demo


def test_corpus_is_the_same_for_a_seed_and_mentions_every_member_with_its_kind():
    text = demo_world.corpus()
    assert text == demo_world.corpus()
    assert text != demo_world.corpus(seed=1)
    for kind, (_, members, _) in demo_world.KINDS.items():
        for word in members:
            assert f"the {word} is {demo_world.a(kind)}" in text.lower(), word
    # Every paragraph is whole sentences: what a sample of it should read like.
    for paragraph in text.strip().split("\n\n"):
        assert paragraph[0].isupper() and paragraph.endswith(".") and "{" not in paragraph


def test_write_corpus_keeps_a_file_with_the_same_text_and_replaces_another(tmp_path):
    path = demo_world.write_corpus(str(tmp_path), paragraphs=50)
    assert open(path, encoding="utf-8").read() == demo_world.corpus(paragraphs=50)
    os.utime(path, (0, 0))
    demo_world.write_corpus(str(tmp_path), paragraphs=50)
    assert os.stat(path).st_mtime == 0  # unchanged: shards built from it stay valid
    open(path, "w", encoding="utf-8").write("tampered")
    demo_world.write_corpus(str(tmp_path), paragraphs=50)
    assert open(path, encoding="utf-8").read() == demo_world.corpus(paragraphs=50)


def _words(rows):
    return {w for premise, hypothesis, _ in rows for w in re.findall(r"[a-z]+", (premise + " " + hypothesis).lower())}


def test_scitail_demo_dev_and_test_ask_about_members_and_properties_fine_tuning_never_shows():
    rows = {split: scitail_demo.rows(split) for split in demo_world.SPLITS}
    train_words = _words(rows["train"])
    train_premises = " ".join(p for p, _, _ in rows["train"])
    for split in ("dev", "test"):
        for kind in demo_world.KINDS:
            for word in demo_world.split_members(kind, split):
                assert word not in train_words, (split, word)
            for prop in demo_world.split_properties(kind, split):
                assert prop.split("{")[0].strip() not in train_premises, (split, prop)
        # Balanced: answering one label everywhere scores 50%.
        labels = [label for _, _, label in rows[split]]
        assert labels.count("entails") == labels.count("neutral")
    for split_rows in rows.values():
        for premise, hypothesis, label in split_rows:
            subject = hypothesis.split(" is ")[0]
            assert premise.startswith(subject + " ")
            kind = next(k for k, (_, ws, _) in demo_world.KINDS.items() if subject.lower() in {f"the {w}" for w in ws})
            assert label == ("entails" if demo_world.GROUP[kind] == "animal" else "neutral")


def test_the_corpus_says_which_members_are_animals():
    text = demo_world.corpus().lower()
    for kind, (_, members, _) in demo_world.KINDS.items():
        group = demo_world.GROUP[kind]
        for word in members:
            assert f"the {word} is {demo_world.a(group)}" in text, word
