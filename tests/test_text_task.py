"""Raw text in, predictions out: heads, the task preprocessor, GPTTaskModel.from_preset/fit/predict on strings."""

import json

import keras
import numpy as np
import pytest
from conftest import TINY, char_tokenizer

import kgpt
import kgpt.testing
from kgpt.tasks import heads, transforms

# --- heads -------------------------------------------------------------------


def test_heads_turn_labels_into_targets_and_outputs_into_predictions():
    head = heads.ClassificationHead(["negative", "positive"])
    assert head.target("positive") == 1 and head.target(" negative ") == 0 and head.target(1) == 1
    assert head.decode(np.array([[0.1, 2.0], [3.0, -1.0]])).tolist() == [1, 0]
    np.testing.assert_allclose(head.probabilities(np.array([[0.0, np.log(3.0)]])), [[0.25, 0.75]], rtol=1e-6)
    assert head.prediction_name(1) == "positive" and head.output_names() == ["negative", "positive"]
    assert heads.RegressionHead().target("3.5") == 3.5
    assert heads.MultipleChoiceHead(4).target(3) == heads.MultipleChoiceHead(4).target("3") == 3
    # Numeric label names: an integer is the name, never a shifted index.
    stars = heads.ClassificationHead(["1", "2", "3"])
    assert stars.target(1) == stars.target("1") == 0 and stars.target(3) == 2
    with pytest.raises(ValueError, match="must be a list of label names"):
        heads.ClassificationHead("ab")


@pytest.mark.parametrize(
    "head, label, message",
    [
        (heads.ClassificationHead(["a", "b"]), "c", r"f.tsv:3: label 'c' is not one of 'a', 'b'"),
        (heads.ClassificationHead(["a", "b"]), 2, r"f.tsv:3: label 2 is not one of"),
        (heads.ClassificationHead(["a", "b"]), True, r"f.tsv:3: label True is not one of"),
        (heads.ClassificationHead(["1", "2", "3"]), 0, r"f.tsv:3: label 0 is not one of '1', '2', '3'"),
        (heads.RegressionHead(), True, r"f.tsv:3: target True is not a number"),
        (heads.RegressionHead(), "nan", r"f.tsv:3: target 'nan' is not a finite number"),
        (heads.RegressionHead(), "inf", r"f.tsv:3: target 'inf' is not a finite number"),
        (heads.RegressionHead(), "1e308", r"f.tsv:3: target '1e308' is beyond float32's range"),  # trained as inf
        (heads.RegressionHead(), "high", r"f.tsv:3: target 'high' is not a number"),
        # float() takes these; a table's reader and other tools do not.
        (heads.RegressionHead(), "1_000", r"f.tsv:3: target '1_000' is not a number"),
        (heads.RegressionHead(), "\u0661\u0662", r"f.tsv:3: target '\u0661\u0662' is not a number"),
        (heads.RegressionHead(), b"1_0", r"f.tsv:3: target b'1_0' is not a number"),
        (heads.MultipleChoiceHead(2), 2, r"f.tsv:3: answer 2 is not a choice index 0..1"),
    ],
)
def test_bad_labels_name_their_source(head, label, message):
    with pytest.raises(kgpt.DataError, match=message):
        head.target(label, "f.tsv:3")


def test_heads_and_transforms_serialize_to_themselves():
    for obj in (
        heads.ClassificationHead(["x", "y", "z"]),
        heads.RegressionHead(),
        heads.MultipleChoiceHead(3),
        transforms.Classification(),
        transforms.Similarity(),
        transforms.MultipleChoice(5),
    ):
        config = json.loads(json.dumps(keras.saving.serialize_keras_object(obj)))
        assert keras.saving.deserialize_keras_object(config) == obj


def test_a_plugin_can_bring_its_own_head():
    @keras.saving.register_keras_serializable(package="test_plugin")
    class Stars(heads.RegressionHead):
        kind = "stars"

        def decode(self, outputs):
            return np.clip(np.round(outputs), 1, 5)

    task = kgpt.Task(
        name="stars",
        transform=transforms.Classification(),
        head=Stars(),
        metrics=("pearson",),
        read=lambda split, data_dir: [],
    )
    kgpt.testing.check_task(task, tokenizer=char_tokenizer())


# --- the task preprocessor ---------------------------------------------------


def test_preprocessor_takes_keras_hub_style_inputs():
    tokenizer = char_tokenizer()
    start, delimiter, extract = tokenizer.start_id, tokenizer.delimiter_id, tokenizer.extract_id
    a, b = tokenizer.encode("ab"), tokenizer.encode("c")
    single = kgpt.GPTTaskPreprocessor(tokenizer, transforms.Classification(), sequence_length=16)
    x = single(["ab", "c"])
    assert x["token_ids"].shape == (2, 1, 4)
    assert x["token_ids"][0, 0].tolist() == [start, *a, extract]
    pair = kgpt.GPTTaskPreprocessor(tokenizer, transforms.Entailment(), sequence_length=16)
    assert pair((["ab"], ["c"]))["token_ids"][0, 0].tolist() == [start, *a, delimiter, *b, extract, 0, 0]
    assert pair.examples([("ab", "c")]) == pair.examples((["ab"], ["c"])) == [(("ab", "c"), ())]
    import tensorflow as tf

    assert pair.examples((tf.constant(["ab"]), np.array(["c"]))) == [(("ab", "c"), ())]
    choice = kgpt.GPTTaskPreprocessor(tokenizer, transforms.MultipleChoice(2), sequence_length=16)
    assert choice.examples((["ctx"], [["yes", "no"]])) == [(("ctx",), ("yes", "no"))]
    assert choice.examples((["art"], ["q"], [["yes", "no"]])) == [(("art", "q"), ("yes", "no"))]
    assert choice((["ab"], [["c", "ab"]]))["token_ids"].shape == (1, 2, 8)
    # Labels pass through; the LM targets are the next tokens of the real positions.
    x, y, weights = single(["ab", "c"], y=np.array([1, 0]))
    np.testing.assert_array_equal(y["lm"], x["token_ids"][..., 1:])
    np.testing.assert_array_equal(weights["lm"], x["padding_mask"][..., 1:])


@pytest.mark.parametrize(
    "transform, inputs, message",
    [
        (transforms.Entailment(), ["only one segment"], r"inputs example 0: entailment needs 2 text segments, got 1"),
        (transforms.Entailment(), (["a", "b"], ["c"]), r"different lengths: \[1, 2\]"),
        (transforms.MultipleChoice(2), (["ctx"], [["only one"]]), r"needs 2 answer choices, got 1"),
        (transforms.MultipleChoice(2), (["ctx"],), r"\(contexts, ..., choices\)"),
        (transforms.Classification(), ["fine", None], r"inputs example 1: expected text, got NoneType None"),
        (transforms.Classification(), [], r"No examples in inputs"),
        (transforms.Entailment(), [["p1", "p2"], ["h1", "h2"]], r"A list of lists is ambiguous"),
        # Predicted or trained on as [start][extract] before; a task's reader counts and skips such rows.
        (transforms.Classification(), ["fine", ""], r"inputs example 1: a text is empty \(''\): leave the example out"),
        (transforms.Entailment(), (["p"], ["   "]), r"inputs example 0: a text is empty \('   '\)"),
        (transforms.MultipleChoice(2), (["ctx"], [["yes", ""]]), r"inputs example 0: a text is empty"),
        # Control characters and a lone byte-order mark: no tokens, [start][extract] predicted as well.
        (transforms.Classification(), ["fine", "\x01\x02"], r"inputs example 1: the text '\\x01\\x02' has no tokens"),
        (transforms.Entailment(), (["p"], ["\ufeff"]), r"inputs example 0: the text '\\ufeff' has no tokens"),
    ],
)
def test_preprocessor_errors_name_the_example(transform, inputs, message):
    preprocessor = kgpt.GPTTaskPreprocessor(char_tokenizer(), transform, sequence_length=16)
    with pytest.raises(ValueError, match=message):
        preprocessor(inputs)


def test_truncation_is_counted_and_reported():
    preprocessor = kgpt.GPTTaskPreprocessor(char_tokenizer(), transforms.Classification(), sequence_length=8)
    backbone = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": char_tokenizer().vocabulary_size()})
    split = preprocessor.encode_batch(["abcdefghij", "ab"])
    assert split.counts["truncated"] == 1 and split.counts["tokens_cut"] == 10 - (8 - 2)
    assert split.view_lengths.ravel().tolist() == [8, 4]
    model = kgpt.GPTTaskModel(backbone, heads.ClassificationHead(["a", "b"]), preprocessor=preprocessor)
    with pytest.warns(
        UserWarning, match=r"1 of 2 examples in inputs are longer than sequence_length=8 tokens: 4 tokens"
    ):
        model.encode(["abcdefghij", "ab"])


# --- GPTTaskModel on raw text ------------------------------------------------

TASKS = {
    "one segment": (
        kgpt.Task(name="tone", transform=transforms.Classification(), labels=("calm", "loud"), read=lambda s, d: []),
        ["quiet now", "LOUD!!!", "so calm", "yes!!"],
        ["calm", "loud", "calm", "loud"],
    ),
    "two segments": (
        kgpt.Task(name="pairs", transform=transforms.Entailment(), labels=("same", "different"), read=lambda s, d: []),
        (["a cat", "a dog", "the sun", "ice"], ["a cat", "a bird", "the sun", "fire"]),
        ["same", "different", "same", "different"],
    ),
    "multiple choice": (
        kgpt.Task(name="pick", transform=transforms.MultipleChoice(2), read=lambda s, d: []),
        (
            ["2 + 2 =", "the sky is", "ice is", "fire is"],
            [["4", "5"], ["blue", "green"], ["hot", "cold"], ["hot", "cold"]],
        ),
        [0, 0, 1, 0],
    ),
}


@pytest.mark.parametrize("kind", list(TASKS))
def test_fit_and_predict_on_raw_strings(tiny_preset, tmp_path, kind):
    task, texts, labels = TASKS[kind]
    model = kgpt.GPTTaskModel.from_preset(tiny_preset, task=task)
    assert model.backbone.vocabulary_size == char_tokenizer().vocabulary_size()  # special tokens already there
    model.compile(optimizer=keras.optimizers.Adam(3e-3))  # losses and metrics stay the head's defaults
    # One batch of one padded length: every call compiles one shape (these tests run on JAX too).
    history = model.fit(texts, labels, batch_size=4, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all() and history.history["loss"][1] < history.history["loss"][0]
    predictions = model.predict(texts)  # logits, as keras-hub's classifiers give
    assert predictions.shape == (4, 2)
    assert np.allclose(model.head.probabilities(predictions).sum(-1), 1.0, atol=1e-5)
    # The same kind of output on the token ids of the same texts (keras-hub's classifiers give logits on both).
    np.testing.assert_allclose(model.predict(model.preprocessor(texts), verbose=0), predictions, rtol=1e-5, atol=1e-5)
    assert len(model.predict_labels(texts)) == 4
    if kind != "two segments":
        return  # the round trip below compiles three more programs per kind on JAX: one kind covers it
    # Saved and loaded: same predictions on text, with no plugin registered anywhere.
    model.save_to_preset(str(tmp_path / "tuned"))
    loaded = kgpt.GPTTaskModel.from_preset(str(tmp_path / "tuned"))
    assert loaded.task_name == task.name and loaded.head == task.head
    np.testing.assert_allclose(loaded.predict(texts), predictions, rtol=1e-5, atol=1e-5)
    assert loaded.predict_labels(texts) == model.predict_labels(texts)
    # Evaluate takes text and labels too.
    assert np.isfinite(loaded.evaluate(texts, labels, verbose=0, return_dict=True)["loss"])
    # And fit's validation_data, in Keras' (x, y) form: ((premises, hypotheses), label names) was read as two text
    # columns of 2 examples with no labels (and (texts, label names) of one segment as a pair without labels).
    history = loaded.fit(texts, labels, validation_data=(texts, labels), batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["val_loss"]).all()


def test_from_preset_adds_special_tokens_and_checks_the_task(tiny_preset, tmp_path):
    tokenizer = char_tokenizer()
    base = kgpt.GPTBackbone(
        vocabulary_size=tokenizer.vocabulary_size() - 3,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=32,
    )
    base.save_to_preset(str(tmp_path / "lm"))
    tokenizer.save_to_preset(str(tmp_path / "lm"))
    task = TASKS["one segment"][0]
    model = kgpt.GPTTaskModel.from_preset(str(tmp_path / "lm"), task=task)
    assert model.backbone.vocabulary_size == tokenizer.vocabulary_size()
    assert model.preprocessor.sequence_length == 32
    with pytest.raises(ValueError, match="is not a fine-tuned task model: pass task=NAME"):
        kgpt.GPTTaskModel.from_preset(str(tmp_path / "lm"))
    model.save_to_preset(str(tmp_path / "tuned"))
    with pytest.raises(ValueError, match=r"fine-tuned for task 'tone', not 'sst2'"):
        kgpt.GPTTaskModel.from_preset(str(tmp_path / "tuned"), task="sst2")


def test_a_table_task_built_in_python_saves_its_columns(tiny_preset, tmp_path):
    # As a kgpt-train --train_file run's preset does: kgpt-predict reads the same columns of a new table by default.
    from kgpt.jobs.predict import trained_columns

    train = tmp_path / "train.csv"
    train.write_text("review,title,stars\ngood film,a,1\nbad film,b,0\n")
    task = (
        kgpt.TaskRegistry()
        .get("text-classification")
        .with_files(train_file=str(train), text_columns=["review", "title"], label_column="stars")
    )
    model = kgpt.GPTTaskModel.from_preset(tiny_preset, task=task)
    model.save_to_preset(str(tmp_path / "tuned"))
    assert trained_columns(str(tmp_path / "tuned")) == ["review", "title"]
    assert kgpt.GPTTaskModel.from_preset(str(tmp_path / "tuned")).preprocessor.columns == ["review", "title"]


def test_text_needs_a_preprocessor_that_fits(backbone):
    model = kgpt.GPTTaskModel(backbone, head=heads.ClassificationHead(["a", "b"]))
    with pytest.raises(ValueError, match="Text inputs need a preprocessor"):
        model.predict(["some text"])
    tokenizer = char_tokenizer()
    with pytest.raises(ValueError, match="tokenizer has 98 ids, more than the backbone's vocabulary_size=97"):
        kgpt.GPTTaskModel(
            backbone,
            heads.ClassificationHead(["a", "b"]),
            preprocessor=kgpt.GPTTaskPreprocessor(tokenizer, transforms.Classification(), sequence_length=16),
        )
    backbone = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": tokenizer.vocabulary_size()})
    with pytest.raises(
        ValueError,
        match=r"The preprocessor's sequence_length is 512, more than the model's context max_sequence_length=16",
    ):
        kgpt.GPTTaskModel(
            backbone,
            heads.ClassificationHead(["a", "b"]),
            preprocessor=kgpt.GPTTaskPreprocessor(tokenizer, transforms.Classification()),
        )
    with pytest.raises(ValueError, match=r"similarity transform makes 2 view\(s\), the model takes 1"):
        kgpt.GPTTaskModel(
            backbone,
            heads.ClassificationHead(["a", "b"]),
            preprocessor=kgpt.GPTTaskPreprocessor(tokenizer, transforms.Similarity(), sequence_length=16),
        )


def test_fit_labels_are_checked(tiny_preset):
    task, texts, _ = TASKS["one segment"]
    model = kgpt.GPTTaskModel.from_preset(tiny_preset, task=task)
    with pytest.raises(ValueError, match="Training or evaluating on text needs labels: pass y"):
        model.fit(texts, verbose=0)
    examples = [
        kgpt.Example(segments=("so calm",), label="calm", source="mine.tsv:2"),
        kgpt.Example(segments=("so loud",), label="noisy", source="mine.tsv:3"),
    ]
    with pytest.raises(kgpt.DataError, match=r"mine.tsv:3: label 'noisy' is not one of 'calm', 'loud'"):
        model.fit(examples, verbose=0)
    with pytest.raises(kgpt.DataError, match=r"inputs label 1: label 'medium' is not one of 'calm', 'loud'"):
        model.fit(texts, ["calm", "medium", "calm", "loud"], verbose=0)
    with pytest.raises(ValueError, match="Got 4 examples but 3 labels"):
        model.fit(texts, ["calm", "loud", "calm"], verbose=0)
    # Keras' "cannot class_weight and sample_weight at the same time" and tf.data messages; steps ignored.
    for kwargs in ({"class_weight": {0: 1.0, 1: 2.0}}, {"validation_split": 0.5}, {"sample_weight": np.ones(4)}):
        with pytest.raises(ValueError, match=rf"^fit on text takes no {next(iter(kwargs))}: kgpt encodes and batches"):
            model.fit(texts, ["calm", "loud", "calm", "loud"], verbose=0, **kwargs)
    with pytest.raises(ValueError, match=r"^predict on text takes no steps: "):
        model.predict(texts, steps=1)


def test_reader_rows_that_are_not_text_name_their_source():
    rows = [kgpt.Example(segments=(None,), label="a", source="f.tsv:7")]
    task = kgpt.Task(name="bad", transform=transforms.Classification(), labels=("a", "b"), read=lambda s, d: rows)
    with pytest.raises(kgpt.DataError, match=r"f.tsv:7: a text field is NoneType None, not text \(task 'bad'\)"):
        task.examples("train", "data")
    silent = kgpt.Task(name="silent", transform=transforms.Classification(), labels=("a", "b"), read=lambda s, d: None)
    with pytest.raises(TypeError, match=r"Task 'silent': read\('train', ...\) returned NoneType"):
        silent.examples("train", "data")


def test_kgpt_predict_names_the_line_of_a_text_with_no_tokens(tmp_path):
    from kgpt.jobs import predict

    path = tmp_path / "in.txt"
    path.write_text("fine\n\x01\x02\n")
    preprocessor = kgpt.GPTTaskPreprocessor(char_tokenizer(), transforms.Classification(), sequence_length=16)
    inputs = predict.read_inputs(str(path), preprocessor.transform, "text", None)
    with pytest.raises(kgpt.DataError, match=rf"^{path}:2: the text '\\x01\\x02' has no tokens"):
        predict.encode(preprocessor, inputs)
    # "No input file" before, for a file that is there; a device is none (reading /dev/zero would never end).
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(kgpt.DataError, match=r"empty\.txt: no examples \(the file is empty\)\.$"):
        predict.read_inputs(str(tmp_path / "empty.txt"), preprocessor.transform, "text")
    with pytest.raises(kgpt.DataError, match=r"^path /dev/null is not a regular file \(a device\)"):
        predict.read_inputs("/dev/null", preprocessor.transform, "text")
    with pytest.raises(kgpt.DataError, match=rf"^path {tmp_path} is a folder: name a file"):
        predict.read_inputs(str(tmp_path), preprocessor.transform, "text")


def test_a_model_fine_tuned_on_one_column_refuses_two_segments():
    preprocessor = kgpt.GPTTaskPreprocessor(
        char_tokenizer(), transforms.Classification(), sequence_length=16, columns=["review"]
    )
    # Classification joins segments: the pair was predicted as one text (kgpt-predict refused it).
    with pytest.raises(
        ValueError, match=r"^inputs example 0: 2 text segment\(s\), where the model was fine-tuned on 1 "
    ):
        preprocessor([("a cab", "bad")])
    preprocessor(["a cab"])
