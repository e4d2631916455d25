"""The memory-lean LM loss: equal to plain logits in value, gradients and training, on both backends."""

import threading

import keras
import numpy as np
import pytest
from conftest import TINY, to_numpy

import kgpt
from kgpt.train import lm_loss, loss_trackers
from kgpt.train.lm_loss import TiedLMLoss, chunked_lm_loss

RNG = np.random.default_rng(0)
HIDDEN = RNG.normal(size=(3, 7, 8)).astype("float32")
TABLE = RNG.normal(size=(13, 8)).astype("float32")
TARGETS = RNG.integers(0, 13, (3, 7)).astype("int32")
WEIGHTS = (RNG.random((3, 7)) > 0.3).astype("float32")


def plain_sums(hidden, table):
    logits = keras.ops.einsum("bth,vh->btv", hidden, table)
    nll = keras.losses.sparse_categorical_crossentropy(TARGETS, logits, from_logits=True)
    hits = keras.ops.cast(keras.ops.argmax(logits, -1) == TARGETS, "float32")
    return keras.ops.stack([keras.ops.sum(nll * WEIGHTS), keras.ops.sum(hits * WEIGHTS)])


def value_and_grads(fn):
    """`(sums, d sums[0] / d hidden, d sums[0] / d table)` on the active backend."""
    if keras.config.backend() == "jax":
        import jax

        (_, sums), grads = jax.value_and_grad(lambda h, t: (fn(h, t)[0], fn(h, t)), argnums=(0, 1), has_aux=True)(
            HIDDEN, TABLE
        )
        return to_numpy(sums), *(to_numpy(g) for g in grads)
    import tensorflow as tf

    _hidden, table = tf.Variable(HIDDEN), tf.Variable(TABLE)

    @tf.function(input_signature=[tf.TensorSpec([None, 7, 8])])  # a dynamic batch, as in Keras' fit
    def step(h):
        with tf.GradientTape() as tape:
            tape.watch(h)
            sums = fn(h, table)
            loss = sums[0]
        return sums, tape.gradient(loss, [h, table])

    sums, (d_hidden, d_table) = step(tf.constant(HIDDEN))
    return to_numpy(sums), to_numpy(d_hidden), to_numpy(d_table)


@pytest.mark.parametrize("chunk_size", [1, 5, None])  # 21 tokens: 21 chunks; 5 chunks of 5, padded by 4; one
def test_chunked_loss_equals_plain_logits_in_value_and_gradient(chunk_size):
    expected = value_and_grads(plain_sums)
    got = value_and_grads(lambda h, t: chunked_lm_loss(h, t, TARGETS, WEIGHTS, chunk_size=chunk_size))
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    evaluation = chunked_lm_loss(HIDDEN, TABLE, TARGETS, WEIGHTS, chunk_size=chunk_size, training=False)
    np.testing.assert_allclose(to_numpy(evaluation), expected[0], rtol=1e-5)


@pytest.mark.parametrize("multiple", [16, 128])  # 13 rows padded to 16 (3 extra) and to 128
def test_padding_the_vocabulary_changes_neither_value_nor_gradients(multiple):
    expected = value_and_grads(plain_sums)
    got = value_and_grads(
        lambda h, t: chunked_lm_loss(h, t, TARGETS, WEIGHTS, chunk_size=5, pad_vocabulary_to=multiple)
    )
    assert got[2].shape == TABLE.shape  # the padded rows' gradient is cut off
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    evaluation = chunked_lm_loss(
        HIDDEN, TABLE, TARGETS, WEIGHTS, chunk_size=5, training=False, pad_vocabulary_to=multiple
    )
    np.testing.assert_allclose(to_numpy(evaluation), expected[0], rtol=1e-5)
    assert lm_loss.vocabulary_multiple() == 1  # on a CPU the loss pads nothing by default
    with pytest.raises(ValueError, match="pad_vocabulary_to must be an integer >= 1, got 0"):
        chunked_lm_loss(HIDDEN, TABLE, TARGETS, WEIGHTS, pad_vocabulary_to=0)


def test_chunked_loss_rejects_bad_arguments():
    with pytest.raises(ValueError, match="chunk_size must be an integer >= 1, got 0"):
        chunked_lm_loss(HIDDEN, TABLE, TARGETS, WEIGHTS, chunk_size=0)
    with pytest.raises(ValueError, match="differ in the last axis"):
        chunked_lm_loss(HIDDEN, TABLE[:, :4], TARGETS, WEIGHTS)
    with pytest.raises(ValueError, match="tied ReversibleEmbedding"):
        TiedLMLoss(keras.layers.Embedding(13, 8))
    restored = TiedLMLoss.from_config(TiedLMLoss(chunk_size=3).get_config())
    assert restored.chunk_size == 3
    with pytest.raises(ValueError, match="needs the tied embedding layer"):
        restored(TARGETS, HIDDEN)


def _train(chunk, dtype=None, validate=True):
    keras.utils.set_random_seed(1)
    if dtype:
        keras.config.set_dtype_policy(dtype)
    try:
        lm = kgpt.GPTCausalLM(kgpt.GPTBackbone(**{**TINY, "dropout": 0.0}))
        if chunk == "logits":  # Keras' own loss (as "auto" reduces it) and metric on the full logits
            lm.compile(
                optimizer=keras.optimizers.SGD(0.5),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight"),
                weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()],
            )
            assert lm._chunked_loss is None
        else:
            lm.compile(optimizer=keras.optimizers.SGD(0.5), lm_loss_chunk_size=chunk)
        ids = np.random.default_rng(0).integers(0, TINY["vocabulary_size"], (10, 17)).astype("int32")
        mask = np.ones((10, 16), "float32")
        mask[:3, 10:] = 0
        x = {"token_ids": ids[:, :-1], "padding_mask": mask.astype("int32")}
        history = lm.fit(
            x,
            ids[:, 1:],
            sample_weight=mask,
            batch_size=5,
            epochs=2,
            verbose=0,
            shuffle=False,
            validation_data=(x, ids[:, 1:], mask) if validate else None,
        )
        return history.history, lm.get_weights()
    finally:
        keras.config.set_dtype_policy("float32")


@pytest.fixture(scope="module")
def trained_in_chunks_of_7():
    """`_train(7)`, unpadded (on a CPU): trained once for the tests that compare with it."""
    assert lm_loss.vocabulary_multiple() == 1
    return _train(7)


def test_causal_lm_trains_the_same_with_and_without_logits(trained_in_chunks_of_7):
    plain, plain_weights = _train("logits")
    for chunk in (7, None):  # batches of 5 x 16 tokens: 12 chunks of 7, padded by 4; or one chunk of 80
        chunked, chunked_weights = trained_in_chunks_of_7 if chunk == 7 else _train(chunk)
        assert (
            set(chunked)
            == set(plain)
            == {"loss", "sparse_categorical_accuracy", "val_loss", "val_sparse_categorical_accuracy"}
        )
        for key in plain:
            np.testing.assert_allclose(chunked[key], plain[key], rtol=1e-5, err_msg=f"{chunk}: {key}")
        for a, b in zip(plain_weights, chunked_weights):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_chunk_size_means_the_same_in_both_models():
    backbone = kgpt.GPTBackbone(**TINY)
    lm = kgpt.GPTCausalLM(backbone)
    model = kgpt.GPTTaskModel(backbone, head=kgpt.tasks.heads.ClassificationHead(["a", "b"]), compile=False)
    for size, expected in (("auto", kgpt.train.lm_loss.DEFAULT_CHUNK_SIZE), (None, None), (64, 64)):
        lm.compile(lm_loss_chunk_size=size)
        model.compile(lm_loss_chunk_size=size)
        assert lm._chunked_loss.chunk_size == model.loss["lm"].chunk_size == expected
    for bad, error, message in (
        (0, ValueError, " >= 1, or None or 'auto', got 0"),
        (-3, ValueError, " >= 1, or None or 'auto', got -3"),
        (1.5, TypeError, ", or None or 'auto', got 1.5"),
    ):
        for compiled in (lm, model):
            with pytest.raises(error, match=f"lm_loss_chunk_size must be an integer{message}"):
                compiled.compile(lm_loss_chunk_size=bad)


def test_evaluation_skips_the_lm_loss_gradients(monkeypatch):
    """Both models' compute_loss tell the LM loss whether a step trains (recorded when the step is traced)."""
    traced = []
    loop = kgpt.train.lm_loss._loop
    monkeypatch.setattr(
        kgpt.train.lm_loss, "_loop", lambda *a, gradients: traced.append(gradients) or loop(*a, gradients=gradients)
    )
    backbone = kgpt.GPTBackbone(**{**TINY, "dropout": 0.0})
    model = kgpt.GPTTaskModel(backbone, head=kgpt.tasks.heads.ClassificationHead(["a", "b"]), compile=False)
    model.compile(optimizer=keras.optimizers.SGD(0.0), lm_loss_chunk_size=5)
    ids = np.random.default_rng(1).integers(0, TINY["vocabulary_size"], (4, 1, 9)).astype("int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    y = {"task": np.array([0, 1, 1, 0]), "lm": ids[..., 1:]}
    model.evaluate(x, y, verbose=0)
    assert traced and not any(traced)
    traced.clear()
    model.fit(x, y, verbose=0)
    assert traced and all(traced)
    lm = kgpt.GPTCausalLM(backbone)
    lm.compile(optimizer=keras.optimizers.SGD(0.0), lm_loss_chunk_size=5)
    traced.clear()
    lm.fit({"token_ids": ids[:, 0], "padding_mask": x["padding_mask"][:, 0]}, ids[:, 0], verbose=0)
    assert traced and all(traced)


def test_an_explicit_training_flag_wins_over_the_compiled_losses_context(monkeypatch):
    asked = []
    monkeypatch.setattr(kgpt.train.lm_loss, "chunked_lm_loss", lambda *a, training: asked.append(training))
    embedding = keras.layers.ReversibleEmbedding(13, 8)
    embedding.build((None,))
    loss = TiedLMLoss(embedding, chunk_size=5)
    with kgpt.train.lm_loss.gradients_wanted(False):
        loss.sums(TARGETS, HIDDEN, WEIGHTS, training=True)
        loss.sums(TARGETS, HIDDEN, WEIGHTS)
    loss.sums(TARGETS, HIDDEN, WEIGHTS)  # the context was reset on the way out
    assert asked == [True, False, True]


def test_the_loss_runs_eagerly_on_a_layer_s_embedding_as_documented():
    embedding = keras.layers.ReversibleEmbedding(13, 8)
    embedding.build((None,))
    embedding.embeddings.assign(TABLE)
    loss = TiedLMLoss(embedding, chunk_size=5, reduction="sum")
    value = loss(TARGETS, HIDDEN, sample_weight=WEIGHTS)  # eagerly, as TiedLMLoss's example calls it
    np.testing.assert_allclose(to_numpy(value), to_numpy(plain_sums(HIDDEN, TABLE))[0], rtol=1e-5)


def test_chunked_loss_under_mixed_bfloat16_tracks_plain_logits():
    plain, _ = _train("logits", "mixed_bfloat16", validate=False)
    chunked, _ = _train(7, "mixed_bfloat16", validate=False)
    np.testing.assert_allclose(chunked["loss"], plain["loss"], rtol=2e-2)


def test_compile_chooses_chunking_only_with_the_default_loss():
    lm = kgpt.GPTCausalLM(kgpt.GPTBackbone(**TINY))
    lm.compile()
    assert lm._chunked_loss.chunk_size == kgpt.train.lm_loss.DEFAULT_CHUNK_SIZE
    assert lm.get_compile_config()["lm_loss_chunk_size"] == kgpt.train.lm_loss.DEFAULT_CHUNK_SIZE
    lm.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))  # "auto": plain logits
    assert lm._chunked_loss is None
    with pytest.raises(ValueError, match="leave loss and weighted_metrics at 'auto'"):
        lm.compile(weighted_metrics=["accuracy"], lm_loss_chunk_size=64)


def test_task_model_lm_output_is_hidden_states_and_chunking_changes_nothing():
    backbone = kgpt.GPTBackbone(**{**TINY, "dropout": 0.0})
    model = kgpt.GPTTaskModel(
        backbone,
        head=kgpt.tasks.heads.ClassificationHead(["a", "b"]),
        num_views=2,
        classifier_dropout=0.0,
        compile=False,
    )
    ids = np.random.default_rng(1).integers(0, TINY["vocabulary_size"], (4, 2, 9)).astype("int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    x["padding_mask"][0, 1, 5:] = 0
    assert to_numpy(model(x)["lm"]).shape == (4, 2, 8, TINY["hidden_dim"])
    y = {"task": np.array([0, 1, 1, 0]), "lm": ids[..., 1:]}
    weights = {"task": np.ones(4, "float32"), "lm": x["padding_mask"][..., 1:].astype("float32")}
    losses = []
    for chunk in (3, None):
        model.compile(optimizer=keras.optimizers.SGD(0.0), lm_loss_chunk_size=chunk)
        losses.append(model.evaluate(x, y, sample_weight=weights, verbose=0, return_dict=True))
    np.testing.assert_allclose(losses[0]["lm_loss"], losses[1]["lm_loss"], rtol=1e-5)
    # The LM loss is the mean next-token cross-entropy over the real tokens, from the tied logits.
    hidden = to_numpy(model(x)["lm"])
    logits = hidden @ to_numpy(backbone.token_embedding.embeddings).T
    nll = to_numpy(keras.losses.sparse_categorical_crossentropy(y["lm"], logits, from_logits=True))
    np.testing.assert_allclose(losses[0]["lm_loss"], (nll * weights["lm"]).sum() / weights["lm"].sum(), rtol=1e-5)
    with pytest.raises(ValueError, match="must be a kgpt.train.lm_loss.TiedLMLoss"):
        model.compile(loss={"task": "sparse_categorical_crossentropy", "lm": "sparse_categorical_crossentropy"})


def bf16_sums(fn):
    """`fn` on bfloat16 hidden states (a mixed-precision model's) and the float32 table."""
    return lambda h, t: fn(keras.ops.cast(h, "bfloat16"), t)


@pytest.mark.parametrize("table", ["random", "zeros", "a multiple"])
def test_padding_changes_nothing_in_bfloat16_nor_on_zero_or_already_padded_tables(table, monkeypatch):
    """A mixed-precision step's loss (bfloat16 hidden, float32 variable), padded as on an accelerator or not."""
    rows = {"random": TABLE, "zeros": np.zeros_like(TABLE), "a multiple": np.concatenate([TABLE, TABLE[:3]])}[table]
    monkeypatch.setattr(__import__(__name__), "TABLE", rows)  # value_and_grads differentiates at TABLE
    results = [
        value_and_grads(
            bf16_sums(lambda h, t: chunked_lm_loss(h, t, TARGETS, WEIGHTS, chunk_size=5, pad_vocabulary_to=multiple))  # noqa: B023 - called at once, in this iteration
        )
        for multiple in (1, 8, 128)
    ]
    for got in results[1:]:
        assert got[2].shape == rows.shape and got[2].dtype == np.float32
        for e, g in zip(results[0], got):
            np.testing.assert_array_equal(g, e)  # the padded rows add exact zeros: not one bit differs
    if table == "zeros":  # every real logit 0: log(13) per weighted token; argmax 0, never a padded row
        np.testing.assert_allclose(results[1][0], [WEIGHTS.sum() * np.log(13), WEIGHTS[TARGETS == 0].sum()], rtol=1e-6)


def test_models_train_the_same_with_the_vocabulary_padded_as_on_an_accelerator(monkeypatch, trained_in_chunks_of_7):
    """The accelerator default (a multiple of 128) forced on this CPU: GPTCausalLM's whole fit, evaluation too."""
    plain, plain_weights = trained_in_chunks_of_7
    multiples, loop = [], lm_loss._loop
    monkeypatch.setattr(lm_loss, "_loop", lambda *a, gradients: multiples.append(a[3]) or loop(*a, gradients=gradients))
    monkeypatch.setattr(lm_loss, "vocabulary_multiple", lambda: lm_loss.VOCABULARY_MULTIPLE)
    padded, padded_weights = _train(7)  # TINY's 97 rows padded to 128
    assert multiples and set(multiples) == {128}  # training and evaluation steps both padded
    for key in plain:
        np.testing.assert_allclose(padded[key], plain[key], rtol=1e-6, err_msg=key)
    for a, b in zip(plain_weights, padded_weights):
        assert a.shape == b.shape
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", [13, 127, -1])  # the first id past the 13 rows, the last padded row, negative
def test_a_target_off_the_vocabulary_is_nan_padded_not_a_padded_row_s_finite_loss(target):
    """Models check their ids; a direct caller's bad target must not read a padded row's -1e30 as a finite loss."""
    targets = TARGETS.copy()
    targets[1, 2] = target
    for training in (False, True):
        sums = to_numpy(
            chunked_lm_loss(
                HIDDEN, TABLE, targets, WEIGHTS, chunk_size=5, training=training, pad_vocabulary_to=np.int64(128)
            )
        )  # a NumPy integer is a number of rows
        assert np.isnan(sums[0]) and sums[1] == to_numpy(plain_sums(HIDDEN, TABLE))[1] - (
            WEIGHTS[1, 2] * (TARGETS[1, 2] == np.argmax(HIDDEN[1, 2] @ TABLE.T))
        )


def test_a_running_loss_traced_by_several_threads_at_once_counts_each_thread_s_update():
    # MirroredStrategy traces a step once per replica, each in its own thread, interleaved: Keras' update and
    # kgpt's settle must pair within a thread.
    lm = kgpt.GPTCausalLM(kgpt.GPTBackbone(**TINY))
    lm.compile(optimizer="adam")
    total, _ = loss_trackers.trackers(lm)
    updated, one_at_a_time = threading.Barrier(2), threading.Lock()

    def replica(value, rows):
        total.update_state(value, sample_weight=rows)
        updated.wait(timeout=30)  # both updates wait before either settles
        with one_at_a_time:  # eager variable updates are not atomic; traced ones are graph ops
            total.settle(None)

    threads = [threading.Thread(target=replica, args=(v, r)) for v, r in ((1.0, 3), (4.0, 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert float(total.result()) == pytest.approx((1.0 * 3 + 4.0 * 1) / 4)
