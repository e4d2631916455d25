"""The fine-tuning model: extract-token heads, the auxiliary LM loss, learning a task."""

import keras
import numpy as np
import pytest
from conftest import TINY, to_numpy

import kgpt
from kgpt.tasks import transforms

V = TINY["vocabulary_size"]
S, D, E = V - 3, V - 2, V - 1  # start, delimiter, extract at the end of the vocabulary
LAYOUT = transforms.Layout(S, D, E)


def tiny_backbone(dropout=0.1):
    return kgpt.GPTBackbone(**{**TINY, "dropout": dropout})


def packed(transform, examples, max_length=16):
    """The examples' views, right-padded to the longest: `token_ids`, `padding_mask` `[examples, views, length]`."""
    views = [transforms.build_views(transform, segs, choices, LAYOUT, max_length)[0] for segs, choices in examples]
    token_ids = np.zeros((len(views), len(views[0]), max(len(v) for ex in views for v in ex)), "int32")
    mask = np.zeros_like(token_ids)
    for i, example in enumerate(views):
        for v, ids in enumerate(example):
            token_ids[i, v, : len(ids)], mask[i, v, : len(ids)] = ids, 1
    return {"token_ids": token_ids, "padding_mask": mask}


def targets(x, labels):
    y = {"task": np.asarray(labels), "lm": x["token_ids"][..., 1:]}
    return y, {"task": np.ones(len(labels), "float32"), "lm": x["padding_mask"][..., 1:].astype("float32")}


def test_head_reads_the_extract_token():
    backbone = tiny_backbone()
    model = kgpt.GPTTaskModel(backbone, head=kgpt.tasks.heads.ClassificationHead(["a", "b", "c"]))
    x = packed(transforms.Entailment(), [([[1, 2, 3], [4]], ()), ([[5], [6, 7]], ())])
    hidden = to_numpy(backbone({"token_ids": x["token_ids"][:, 0], "padding_mask": x["padding_mask"][:, 0]}))
    last = x["padding_mask"][:, 0].sum(-1) - 1
    kernel, bias = (to_numpy(w) for w in model.classifier.weights)
    expected = hidden[np.arange(2), last] @ kernel + bias
    np.testing.assert_allclose(model.predict(x), expected, rtol=1e-4, atol=1e-5)
    # Padding after the extract token changes nothing.
    x["token_ids"][x["padding_mask"] == 0] = 11
    np.testing.assert_allclose(model.predict(x), expected, rtol=1e-4, atol=1e-5)


def test_similarity_is_invariant_to_the_order_of_the_sentences():
    model = kgpt.GPTTaskModel(tiny_backbone(), head=kgpt.tasks.heads.ClassificationHead(["a", "b"]), num_views=2)
    a, b = [1, 2, 3, 4], [5, 6]
    ab = packed(transforms.Similarity(), [([a, b], ())])
    ba = packed(transforms.Similarity(), [([b, a], ())])
    assert ab["token_ids"].tolist() != ba["token_ids"].tolist()
    np.testing.assert_allclose(model.predict(ab), model.predict(ba), rtol=1e-5, atol=1e-6)


def test_multiple_choice_scores_each_answer_and_softmax_sums_to_one():
    model = kgpt.GPTTaskModel(tiny_backbone(), head=kgpt.tasks.heads.MultipleChoiceHead(3), num_views=3)
    mc = transforms.MultipleChoice(3)
    x = packed(mc, [([[1, 2], [3]], [[4], [5, 6], [7]]), ([[8]], [[9], [10], [11, 12]])])
    logits = model.predict(x)
    assert logits.shape == (2, 3)
    probabilities = to_numpy(keras.ops.softmax(logits, axis=-1))
    np.testing.assert_allclose(probabilities.sum(-1), [1.0, 1.0], rtol=1e-6)
    # An answer's score does not depend on the other answers.
    changed = packed(mc, [([[1, 2], [3]], [[4], [20, 21], [22]]), ([[8]], [[9], [10], [11, 12]])])
    np.testing.assert_allclose(model.predict(changed)[0, 0], logits[0, 0], rtol=1e-5, atol=1e-6)


def _sgd_step(lm_coef, x, y, sample_weight, weights):
    model = kgpt.GPTTaskModel(
        tiny_backbone(dropout=0.0),
        head=kgpt.tasks.heads.ClassificationHead(["a", "b"]),
        lm_coef=lm_coef,
        classifier_dropout=0.0,
        compile=False,
    )
    model.set_weights(weights)
    model.compile(optimizer=keras.optimizers.SGD(1.0))
    if lm_coef == 0:
        y, sample_weight = {"task": y["task"]}, {"task": sample_weight["task"]}
    model.train_on_batch(x, y, sample_weight=sample_weight)
    return [to_numpy(w) for w in model.weights]


def test_lm_coef_scales_the_lm_gradient_and_zero_removes_it():
    x = packed(transforms.Entailment(), [([[1, 2, 3], [4, 5]], ()), ([[6], [7, 8, 9]], ())])
    y, sample_weight = targets(x, [0, 1])
    start = kgpt.GPTTaskModel(
        tiny_backbone(dropout=0.0), head=kgpt.tasks.heads.ClassificationHead(["a", "b"]), compile=False
    ).get_weights()
    assert (
        "lm"
        not in kgpt.GPTTaskModel(
            tiny_backbone(), kgpt.tasks.heads.ClassificationHead(["a", "b"]), lm_coef=0, compile=False
        ).output
    )
    after = {c: _sgd_step(c, x, y, sample_weight, start) for c in (0.0, 0.5, 1.0)}
    # With SGD(lr=1) each update is minus the gradient of task + c * LM.
    lm_half = [h - z for h, z in zip(after[0.5], after[0.0])]
    lm_full = [f - z for f, z in zip(after[1.0], after[0.0])]
    assert max(np.abs(d).max() for d in lm_half) > 1e-4  # the LM loss does move the weights
    for half, full in zip(lm_half, lm_full):
        np.testing.assert_allclose(full, 2 * half, rtol=1e-3, atol=1e-6)


def test_learns_a_synthetic_task_to_high_accuracy():
    # Label: does token 7 occur in the sentence? Needs attention over all positions.
    rng = np.random.default_rng(0)

    def data(n):
        examples, labels = [], []
        for _ in range(n):
            seq = rng.integers(10, 60, rng.integers(3, 9)).tolist()
            label = int(rng.random() < 0.5)
            if label:
                seq[rng.integers(len(seq))] = 7
            examples.append(([seq], ()))
            labels.append(label)
        return packed(transforms.Classification(), examples), np.asarray(labels)

    x, labels = data(600)
    x_test, labels_test = data(200)
    model = kgpt.GPTTaskModel(tiny_backbone(), head=kgpt.tasks.heads.ClassificationHead(["a", "b"]), compile=False)
    model.compile(optimizer=kgpt.gpt_adamw(1e-2, warmup_steps=10, total_steps=190, decay="linear"))
    y, sample_weight = targets(x, labels)
    model.fit(x, y, sample_weight=sample_weight, batch_size=32, epochs=10, verbose=0)
    accuracy = np.mean(np.argmax(model.predict(x_test), -1) == labels_test)
    assert accuracy > 0.9, accuracy


def test_save_and_load_keep_outputs_and_optimizer(tmp_path):
    model = kgpt.GPTTaskModel(tiny_backbone(), head=kgpt.tasks.heads.RegressionHead(), num_views=2)
    model.compile(lm_loss_chunk_size=7)
    x = packed(transforms.Similarity(), [([[1, 2], [3]], ()), ([[4], [5, 6]], ())])
    y, sample_weight = targets(x, np.asarray([0.5, 4.0], "float32"))
    model.fit(x, y, sample_weight=sample_weight, batch_size=2, epochs=1, verbose=0)
    path = str(tmp_path / "task.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, kgpt.GPTTaskModel) and loaded.head == kgpt.tasks.heads.RegressionHead()
    np.testing.assert_allclose(loaded.predict(x), model.predict(x), rtol=1e-5, atol=1e-6)
    assert int(to_numpy(loaded.optimizer.iterations)) == 1
    assert loaded.loss["lm"].chunk_size == 7  # the LM loss comes back as it was compiled


def test_head_and_views_must_agree():
    with pytest.raises(ValueError, match=r"MultipleChoiceHead\(num_choices=3\) needs num_views=3, got 2"):
        kgpt.GPTTaskModel(tiny_backbone(), head=kgpt.tasks.heads.MultipleChoiceHead(3), num_views=2)
    with pytest.raises(
        ValueError, match=r"head='.*': pass a head object, not a name: kgpt.tasks.heads.ClassificationHead\(labels\)"
    ):
        kgpt.GPTTaskModel(tiny_backbone(), head="classification")
    with pytest.raises(ValueError, match="head must be a kgpt.tasks.heads.Head"):
        kgpt.GPTTaskModel(tiny_backbone(), head=3)
    with pytest.raises(ValueError, match="lm_coef must be a finite number >= 0, got -1"):
        kgpt.GPTTaskModel(tiny_backbone(), head=kgpt.tasks.heads.RegressionHead(), lm_coef=-1)


def test_from_preset_loads_the_backbone_under_the_given_dtype(tmp_path):
    model = kgpt.GPTTaskModel(tiny_backbone(), head=kgpt.tasks.heads.RegressionHead(), num_views=2)
    model.save_to_preset(str(tmp_path / "task"))
    loaded = kgpt.GPTTaskModel.from_preset(str(tmp_path / "task"), dtype="mixed_bfloat16")
    assert loaded.backbone.dtype_policy.name == "mixed_bfloat16"
    assert loaded.backbone.compute_dtype == "bfloat16" and loaded.backbone.variable_dtype == "float32"
    for got, want in zip(loaded.get_weights(), model.get_weights()):  # float32 variables: the saved weights
        np.testing.assert_array_equal(got, want)
    x = packed(transforms.Similarity(), [([[1, 2], [3]], ())])
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=0.05)
    assert kgpt.GPTTaskModel.from_preset(str(tmp_path / "task")).backbone.dtype_policy.name == "float32"
    with pytest.raises(ValueError, match=r"^dtype must name a float or mixed policy .* got 'int8'"):
        kgpt.GPTTaskModel.from_preset(str(tmp_path / "task"), dtype="int8")
