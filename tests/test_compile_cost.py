"""A compilation's cost, measured in the run: the model is left as it was, and a cached program counts its compile time."""

import types

import keras
import numpy as np
import pytest

import kgpt
from kgpt.data import batching
from kgpt.train import compile_cost
from tests.conftest import TINY

JAX = keras.config.backend() == "jax"


def tiny_split(lengths=(3, 9, 14, 5, 16, 7, 11, 4)):
    rng = np.random.default_rng(0)
    builder = batching.SplitBuilder("train", 1, limit=16)
    for i, n in enumerate(lengths):
        builder.add([rng.integers(1, 90, n).tolist()], target=i % 2, uid=f"row{i}")
    return builder.build()


def compiled_model():
    model = kgpt.GPTTaskModel(kgpt.GPTBackbone(**TINY), head=kgpt.tasks.heads.ClassificationHead(["a", "b"]))
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    return model


def state_of(model):
    return [np.array(v) for v in (*model.variables, *model.optimizer.variables)]


def test_compile_batches_converts_to_average_batches_rounded_to_a_power_of_two():
    split = tiny_split(
        (4, 4, 4, 4, 16, 16, 16, 16)
    )  # batches of 4: one at 4 tokens, one at 16: 40 positions on average
    # 10 s against a 0.1 s step of 64 positions: 100 such steps, 160 average batches: 128 (a power of 2).
    assert batching.compile_batches(10.0, 0.1, 4, 16, split, 4) == 128
    assert batching.compile_batches(0.0, 0.1, 4, 16, split, 4) == 1  # a free compilation still counts one batch
    # Measured on a short step, priced with attention: the average batch's longer rows cost more than their positions.
    assert batching.compile_batches(10.0, 0.1, 4, 4, split, 4) == 32  # 100 steps of 16 positions: 40 batches of 40
    assert batching.compile_batches(10.0, 0.1, 4, 4, split, 4, attention_length=4) == 16  # 100 x 32 / 176: 18
    # Dearer compilations, fewer lengths allowed; never fewer than one.
    assert (
        batching.max_lengths_for(True, 100, 3, compile_batches=1)
        > batching.max_lengths_for(True, 100, 3)
        > batching.max_lengths_for(True, 100, 3, compile_batches=64)
        == 1
    )


def test_attention_length_follows_the_models_shape():
    """Where attention's cost per row catches up with the rest: later with a larger LM head, never without attention."""
    from kgpt.models.lstm.lstm_backbone import LSTMBackbone

    backbone = kgpt.GPTBackbone(**TINY)
    tiny = compile_cost.attention_length(backbone)
    shape = {name: getattr(backbone, name) for name in ("num_layers", "num_heads", "hidden_dim", "intermediate_dim")}
    wide_vocabulary = compile_cost.attention_length(types.SimpleNamespace(**shape, vocabulary_size=4001))
    assert 0 < compile_cost.attention_length(backbone, lm_head=False) < tiny < wide_vocabulary
    lstm = LSTMBackbone(vocabulary_size=97, hidden_dim=16, lstm_units=16, max_sequence_length=16)
    assert compile_cost.attention_length(lstm) is None


@pytest.mark.skipif(not JAX, reason="measured on JAX only: TensorFlow's steps are traced, not XLA-compiled, on a CPU")
def test_measuring_leaves_the_model_as_it_was_and_fit_reuses_the_program():
    import jax

    split = tiny_split((3, 9, 14, 5, 16, 7, 11, 4) * 3)  # enough batches that building (fit reads one) ends no pass
    keras.utils.set_random_seed(3)
    model = compiled_model()
    keras.utils.set_random_seed(3)
    twin = compiled_model()  # the same weights and dropout seeds
    data = batching.dataset(split, 4, seed=1, max_lengths=1)  # every batch at the longest length: the measured one
    plain = twin.fit(data, epochs=1, verbose=0).history["loss"]  # a fit that compiles its own train step
    before = state_of(model)
    cost = compile_cost.compile_batches(model, split, 4)
    assert cost >= 1 and cost & (cost - 1) == 0  # a power of 2
    assert all(np.array_equal(a, b) for a, b in zip(before, state_of(model)))
    compiles = []

    def listen(event, duration, **kwargs):
        compiles.append(event == "/jax/core/compile/backend_compile_duration")

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        measured = model.fit(batching.dataset(split, 4, seed=1, max_lengths=1), epochs=1, verbose=0).history["loss"]
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert not any(compiles)  # fit ran the train step the measurement compiled
    np.testing.assert_allclose(measured, plain, rtol=1e-6)  # same weights, optimizer steps and dropout masks


@pytest.mark.skipif(not JAX, reason="JAX's persistent cache")
def test_a_program_from_the_persistent_cache_counts_what_compiling_it_cost(monkeypatch):
    import jax

    model = compiled_model()
    model.make_train_function()
    step = model.train_function

    def from_cache(state, data):  # what JAX reports when it loads a program instead of compiling it
        jax.monitoring.record_event_duration_secs("/jax/compilation_cache/compile_time_saved_sec", 100.0)
        jax.monitoring.record_event_duration_secs("/jax/compilation_cache/cache_retrieval_time_sec", 0.5)
        return step(state, data)

    monkeypatch.setattr(model, "train_function", from_cache)
    split = tiny_split()
    compile_seconds, step_seconds = compile_cost.measure(model, split.batch(np.arange(4), length=16))
    assert compile_seconds >= 100.5 and 0 < step_seconds < 100


def test_where_nothing_compiles_the_default_cost_is_used():
    model = compiled_model()
    if JAX:
        model.jit_compile = False
    before = state_of(model) if model.built else None
    assert compile_cost.compile_batches(model, tiny_split(), 4) == batching.COMPILE_BATCHES
    assert compile_cost.measure(model, tiny_split().batch(np.arange(4), length=16)) is None
    if before is not None:
        assert all(np.array_equal(a, b) for a, b in zip(before, state_of(model)))


def test_a_run_records_the_figure_and_a_resumed_run_plans_with_it(tmp_path, progress, monkeypatch):
    import inspect
    import json

    from test_use_trained import config, make_preset, write_data

    from kgpt.jobs import finetune as finetune_lib
    from kgpt.jobs import finetune_training

    preset, out = make_preset(tmp_path / "preset"), tmp_path / "out"
    data = write_data(tmp_path / "data", sizes=(("train", 16), ("dev", 4), ("test", 2)))
    finetune_lib.finetune(config(preset, data, str(out), epochs=1))
    latest = json.loads((out / "checkpoint" / "latest.json").read_text())["checkpoint"]
    state_file = out / "checkpoint" / latest / "state.json"
    state = json.loads(state_file.read_text())
    cost = state["compile_batches"]
    assert cost >= 1 and cost & (cost - 1) == 0
    if not JAX:
        assert cost == batching.COMPILE_BATCHES  # nothing compiles per length: nothing measured
    assert state["attention_length"] > 0
    # The same command again resumes the finished run: its plan comes from the checkpoint's figures, not new ones.
    state["compile_batches"] = 1 << 20  # so dear that a compiling backend keeps one length
    state["attention_length"] = 7.5
    state_file.write_text(json.dumps(state))
    priced = []
    plan = batching.length_plan

    def spy(*args, **kwargs):  # the training split's plans (a seed): predictions plan their own program's lengths
        arguments = inspect.signature(plan).bind(*args, **kwargs).arguments
        if arguments.get("seed") is not None:
            priced.append(arguments.get("attention_length"))
        return plan(*args, **kwargs)

    monkeypatch.setattr(batching, "length_plan", spy)
    _, results = finetune_lib.finetune(config(preset, data, str(out), epochs=1))
    lengths = results["real_token_share"]["train_padded_lengths"]
    assert len(lengths) == 1 if JAX else len(lengths) > 1
    assert priced and set(priced) == {7.5}
    # A checkpoint from before a row's attention was priced planned by positions: so does its resumed run.
    del state["attention_length"]
    assert finetune_training.Training._attention_length(None, state) is None
