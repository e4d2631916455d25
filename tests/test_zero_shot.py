"""The paper's zero-shot heuristics: decisions checked against values computed by hand."""

import csv

import keras
import numpy as np
import pytest
from conftest import TINY, char_tokenizer

import kgpt
from kgpt.analysis import zero_shot
from kgpt.tasks import heuristics
from kgpt_tasks import dprd


class FakeScorer:
    """Known per-token log-probabilities for each (context, continuation) pair."""

    def __init__(self, table):
        self.table = table
        self.asked = []

    def log_probs(self, pairs, sources=None):
        self.asked.extend(pairs)
        return [np.asarray(self.table[p], "float64") for p in pairs]


def example(*segments, label=None, choices=()):
    return kgpt.Example(segments=segments, label=label, choices=choices, source="test")


def task(name):
    return kgpt.TaskRegistry().get(name)


def test_cola_threshold_is_fit_on_train_and_applied_to_dev():
    cola = task("cola")
    heuristic = cola.zero_shot
    assert isinstance(heuristic, heuristics.ThresholdedLogProb) and heuristic.needs_training
    # Average token log-probabilities: (-1 + -2) / 2 = -1.5, etc.
    train = {("", "a"): [-1.0, -2.0], ("", "b"): [-1.0], ("", "c"): [-3.0, -3.0, -3.0], ("", "d"): [-4.0]}
    labels = {"a": "1", "b": "1", "c": "0", "d": "0"}
    train_examples = [example(t, label=labels[t]) for t in "abcd"]
    fitted = heuristic.fit(FakeScorer(train), cola, train_examples)
    # Scores 1:{-1.5, -1.0} 0:{-3.0, -4.0}: any cut in (-3, -1.5) separates them (MCC 1);
    # the search takes the midpoints of neighbouring scores, and the first best is (-3 + -1.5) / 2.
    assert fitted.threshold == pytest.approx(-2.25)
    dev = {("", "e"): [-2.0], ("", "f"): [-2.5]}
    predictions = fitted.predict(FakeScorer(dev), cola, [example("e"), example("f")])
    assert predictions.tolist() == [cola.labels.index("1"), cola.labels.index("0")]


def test_fitting_returns_a_new_heuristic_and_leaves_the_tasks_own_unchanged():
    cola = task("cola")
    registered = cola.zero_shot
    high = {("", "a"): [-1.0], ("", "b"): [-3.0]}
    low = {("", "a"): [-5.0], ("", "b"): [-7.0]}
    train = [example("a", label="1"), example("b", label="0")]
    first = registered.fit(FakeScorer(high), cola, train)
    second = registered.fit(FakeScorer(low), cola, train)
    assert first is not registered and second is not first
    assert (first.threshold, second.threshold) == (pytest.approx(-2.0), pytest.approx(-6.0))
    assert registered.threshold is None and task("cola").zero_shot.threshold is None  # the plugin's object too
    assert first.positive == registered.positive and first.candidates == registered.candidates
    # Heuristics that learn nothing are their own fit.
    sst2 = task("sst2")
    assert sst2.zero_shot.fit(FakeScorer({}), sst2, []) is sst2.zero_shot


def test_cola_predict_needs_a_threshold():
    with pytest.raises(RuntimeError, match="threshold comes from training data"):
        heuristics.ThresholdedLogProb().predict(FakeScorer({}), task("cola"), [example("a")])


def test_sst2_compares_positive_and_negative_after_very():
    sst2 = task("sst2")
    table = {
        ("a fine film very", "positive"): [-1.0],
        ("a fine film very", "negative"): [-2.0, -0.5],  # a word of two tokens: its log-prob is the sum, -2.5
        ("a dull film very", "positive"): [-3.0],
        ("a dull film very", "negative"): [-1.0, -1.5],  # -2.5 > -3.0
    }
    scorer = FakeScorer(table)
    predictions = sst2.zero_shot.predict(scorer, sst2, [example("a fine film"), example("a dull film")])
    assert [sst2.labels[i] for i in predictions] == ["1", "0"]
    assert scorer.asked[0] == ("a fine film very", "positive")


def test_race_picks_the_highest_average_not_the_highest_sum():
    race = task("race")
    choices = ("red", "blue", "green", "gold")
    table = {
        ("doc question?", "red"): [-1.0, -1.0, -1.0],  # average -1.0, sum -3.0
        ("doc question?", "blue"): [-2.0],  # average -2.0, sum -2.0 (the best sum)
        ("doc question?", "green"): [-5.0],
        ("doc question?", "gold"): [-1.5, -0.6],  # average -1.05
    }
    predictions = race.zero_shot.predict(FakeScorer(table), race, [example("doc", "question?", choices=choices)])
    assert predictions.tolist() == [0]


def test_dprd_reads_blocks_and_substitutes_each_candidate(tmp_path):
    (tmp_path / "train.c.txt").write_text(
        "The bee landed on the flower because it had pollen .\nit\nbee,flower\nflower\n\n"
        "Ann thanked Sue because she had helped her .\nshe\nAnn, Sue\nSue\n"
    )
    examples, skipped, read = task("dprd").examples("train", str(tmp_path))
    assert read == 2 and not skipped
    first = examples[0]
    assert first.segments == ("The bee landed on the flower because", "had pollen .")
    assert first.choices == ("bee", "flower") and first.label == 1
    assert examples[1].choices == ("Ann", "Sue") and examples[1].segments[1] == "had helped her ."
    table = {
        ("The bee landed on the flower because bee", "had pollen ."): [-2.0, -2.0, -2.0],
        ("The bee landed on the flower because flower", "had pollen ."): [-1.0, -3.0, -1.0],  # -5/3 > -2
        ("Ann thanked Sue because Ann", "had helped her ."): [-1.0, -1.0],
        ("Ann thanked Sue because Sue", "had helped her ."): [-1.0, -2.0],
    }
    predictions = dprd.TASK.zero_shot.predict(FakeScorer(table), dprd.TASK, examples)
    assert predictions.tolist() == [1, 0]


@pytest.mark.parametrize(
    "text, message",
    [
        ("A sentence with it .\nit\nx,y\n", "expected 4 lines"),
        ("A sentence with it .\nit\nx,y\nz\n", "answer 'z' is not one of the candidates"),
        ("A sentence .\nit\nx,y\nx\n", "pronoun 'it' does not occur in the sentence"),
        ("A sentence with it .\nit\nx y\nx\n", "expected two candidates separated by a comma"),
    ],
)
def test_dprd_malformed_blocks_name_the_line(tmp_path, text, message):
    (tmp_path / "train.c.txt").write_text(text)
    with pytest.raises(kgpt.DataError, match=message) as error:
        task("dprd").examples("train", str(tmp_path))
    assert "train.c.txt:" in str(error.value)


def tiny_lm(seed=0):
    keras.utils.set_random_seed(seed)
    tokenizer = char_tokenizer()
    backbone = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": tokenizer.vocabulary_size(), "dropout": 0.0})
    return kgpt.GPTCausalLM(backbone), tokenizer


def test_scorer_reads_the_right_positions_of_the_lm():
    lm, tokenizer = tiny_lm()
    scorer = zero_shot.Scorer(lm, tokenizer, batch_size=2)
    pairs = [("ab c", "de"), ("a", "bcd efg"), ("abcdefgh ij", "k")]
    got = scorer.log_probs(pairs)
    for (context, continuation), values in zip(pairs, got):
        ctx, cont = tokenizer.encode(context), tokenizer.encode(continuation)
        ids = np.asarray([ctx + cont], "int32")
        logits = keras.ops.convert_to_numpy(lm({"token_ids": ids, "padding_mask": np.ones_like(ids)}))[0]
        log_probs = (
            logits
            - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
            - logits.max(-1, keepdims=True)
        )
        want = [log_probs[len(ctx) - 1 + k, t] for k, t in enumerate(cont)]
        np.testing.assert_allclose(values, want, atol=1e-4)
    # The char vocabulary has no newline token: an empty context makes the first token context.
    [values] = scorer.log_probs([("", "abc")])
    assert len(values) == len(tokenizer.encode("abc")) - 1


def test_evaluate_runs_on_the_embedded_data(tmp_path):
    lm, tokenizer = tiny_lm()
    for name, metric in (("sst2", "accuracy"), ("cola", "matthews")):
        data = task(name).default_data(str(tmp_path / name))
        result = zero_shot.evaluate(lm, tokenizer, task(name), data)
        assert -1.0 <= result[metric] <= 1.0
        assert result["examples"]["used"] == result["examples"]["read"] > 0
    # CoLA's threshold was fit on its training split for that evaluation only.
    assert task("cola").zero_shot.threshold is None


def test_a_text_with_no_tokens_is_named_by_its_file_and_line(tmp_path):
    lm, tokenizer = tiny_lm()
    data = task("cola").default_data(str(tmp_path / "cola"))
    with open(f"{data}/dev.tsv", "a") as f:
        f.write("kgpt\t1\t\t\x01\x02\n")  # not empty, but the tokenizer drops every character
    lines = len(open(f"{data}/dev.tsv").read().splitlines())
    with pytest.raises(kgpt.DataError, match=rf"dev\.tsv:{lines}: nothing to score: '\\x01\\x02' has no tokens\.$"):
        zero_shot.evaluate(lm, tokenizer, task("cola"), data)
    # DPRD scores the text after the pronoun, which was blamed on a choice.
    scorer = kgpt.tasks.heuristics.Scorer(lm, tokenizer)
    example = kgpt.Example(segments=("The cat saw", "\x01"), choices=("it", "him"), label=0, source="f.tsv:7")
    with pytest.raises(
        kgpt.DataError, match=r"^f\.tsv:7 \(the text after the pronoun\): nothing to score: '\\x01' has no tokens\.$"
    ):
        task("dprd").zero_shot.predict(scorer, task("dprd"), [example])


@pytest.mark.parametrize("count", [0, -1, 2.5])
def test_a_count_of_examples_that_is_no_positive_integer_is_refused(count):
    # 0 scored nothing (a mean of nothing: nan); -1 sliced off the last example.
    with pytest.raises((TypeError, ValueError), match="max_examples must be an integer"):
        zero_shot.evaluate(None, None, task("sst2"), "unused", max_examples=count)
    with pytest.raises((TypeError, ValueError), match="max_examples must be an integer"):
        zero_shot.ZeroShotCallback({}, None, every=1, max_examples=count)
    with pytest.raises((TypeError, ValueError), match="every must be an integer"):
        zero_shot.ZeroShotCallback({}, None, every=count)


def test_a_metric_returning_no_number_is_named_before_and_at_a_zero_shot_evaluation(tmp_path):
    import dataclasses

    def mood(labels, predictions):
        return "high"

    broken = dataclasses.replace(task("sst2"), metrics=(mood,))

    class Registry:
        def get(self, name):
            return broken

        def names(self):
            return ["sst2"]

    message = r"^Task 'sst2'.*: its metric 'mood' returned str 'high', not a number"
    with pytest.raises(kgpt.RegistryError, match=message):  # the commands' check of their flags
        zero_shot.check_tasks({"sst2": None}, Registry())
    lm, tokenizer = tiny_lm()
    data = broken.default_data(str(tmp_path / "sst2"))
    with pytest.raises(kgpt.RegistryError, match=message):
        zero_shot.evaluate(lm, tokenizer, broken, data, max_examples=4)


def test_resolve_tasks_looks_names_up_in_the_callers_registry(tmp_path):
    registry = kgpt.TaskRegistry()
    resolved = zero_shot.resolve_tasks({"sst2": None, "cola": "given/dir"}, str(tmp_path), registry)
    assert resolved["sst2"][0] is registry.get("sst2") and resolved["cola"] == (registry.get("cola"), "given/dir")
    assert resolved["sst2"][1].startswith(str(tmp_path / "zero_shot_data" / "sst2"))
    with pytest.raises(ValueError, match="'rte' offers no zero-shot heuristic; tasks that do: cola, dprd"):
        zero_shot.resolve_tasks({"rte": None}, str(tmp_path), registry)


def test_tasks_without_a_heuristic_say_so(tmp_path):
    lm, tokenizer = tiny_lm()
    with pytest.raises(ValueError, match="'rte' offers no zero-shot heuristic"):
        zero_shot.evaluate(lm, tokenizer, task("rte"), str(tmp_path))
    assert {"cola", "sst2", "race", "race-middle", "race-high", "story-cloze", "dprd"} <= set(
        zero_shot.zero_shot_tasks(kgpt.TaskRegistry())
    )


def test_callback_logs_zero_shot_metrics_during_pretraining(tmp_path, capsys, progress):
    lm, tokenizer = tiny_lm()
    lm.compile(optimizer=keras.optimizers.Adam(1e-3))
    data = task("sst2").default_data(str(tmp_path / "sst2"))
    callback = ModelReads(
        {"sst2": (task("sst2"), data)},
        tokenizer,
        every=3,
        csv_path=str(tmp_path / "zero_shot.csv"),
        log_dir=str(tmp_path / "logs"),
        max_examples=20,
    )
    ids = np.random.default_rng(0).integers(1, 40, (16, 17)).astype("int32")
    lm.fit(
        {"token_ids": ids[:, :-1], "padding_mask": np.ones((16, 16), "int32")},
        ids[:, 1:],
        batch_size=2,
        epochs=1,
        verbose=0,
        callbacks=[callback],
    )
    rows = list(csv.DictReader(open(tmp_path / "zero_shot.csv")))
    assert [int(r["step"]) for r in rows] == [3, 6, 8]  # every 3 steps, and at the end
    assert {r["task"] for r in rows} == {"sst2"} and {r["metric"] for r in rows} == {"accuracy"}
    assert (tmp_path / "logs" / "zero_shot").exists()
    logged = capsys.readouterr().out  # kgpt's logger prints to the current stdout
    assert [int(line.split()[3][:-1]) for line in logged.splitlines() if line.startswith("Zero-shot at step")] == [
        3,
        6,
        8,
    ]
    # The model (on JAX: the whole training state, synced) is touched only where an evaluation runs: when the
    # batch after its step begins (batch b begins after step b).
    assert [batch for batch, reads in enumerate(callback.reads_per_batch) if reads] == [3, 6]
    # A second fit() continues from the optimizer's step.
    lm.fit(
        {"token_ids": ids[:4, :-1], "padding_mask": np.ones((4, 16), "int32")},
        ids[:4, 1:],
        batch_size=2,
        epochs=1,
        verbose=0,
        callbacks=[callback],
    )
    assert [int(r["step"]) for r in csv.DictReader(open(tmp_path / "zero_shot.csv"))][-1] == 10


class ModelReads(zero_shot.ZeroShotCallback):
    """Counts, per batch begin, the callback's reads of `self.model` (on the main thread)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads, self.reads_per_batch = 0, []

    @property
    def model(self):
        self.reads += 1
        return super().model

    def on_train_batch_begin(self, batch, logs=None):
        before = self.reads
        super().on_train_batch_begin(batch, logs)
        self.reads_per_batch.append(self.reads - before)
