"""The LSTM ablation backbone: causal, tied, savable, and usable wherever GPTBackbone is."""

import keras
import numpy as np
import pytest
from conftest import random_inputs, to_numpy

import kgpt
from kgpt.jobs import finetune_model

SIZES = dict(vocabulary_size=97, hidden_dim=16, lstm_units=24, max_sequence_length=16, dropout=0.0)


def test_outputs_never_depend_on_later_tokens():
    backbone = kgpt.LSTMBackbone(**SIZES)
    x = random_inputs()
    changed = {**x, "token_ids": x["token_ids"].copy()}
    changed["token_ids"][:, 7] = (changed["token_ids"][:, 7] + 1) % 97
    before, after = to_numpy(backbone(x)), to_numpy(backbone(changed))
    np.testing.assert_allclose(before[:, :7], after[:, :7], atol=1e-6)
    assert np.abs(before[:, 7:] - after[:, 7:]).max() > 1e-4


def test_lm_is_tied_generates_and_round_trips(tmp_path):
    lm = kgpt.GPTCausalLM(kgpt.LSTMBackbone(**SIZES))
    x = random_inputs()
    assert to_numpy(lm(x)).shape == (3, 12, 97)
    assert len(lm.weights) == len(lm.backbone.weights)  # the LM head is the token embedding
    lm.compile(sampler="greedy")
    out = lm.generate([[5, 6, 7]], max_length=10)
    assert out["token_ids"].shape == (1, 10) and out["token_ids"][0, :3].tolist() == [5, 6, 7]
    lm.save_to_preset(str(tmp_path))
    loaded = kgpt.GPTCausalLM.from_preset(str(tmp_path))
    assert isinstance(loaded.backbone, kgpt.LSTMBackbone)
    np.testing.assert_array_equal(loaded.score(x["token_ids"]), lm.score(x["token_ids"]))


def test_added_tokens_and_transfer_keep_the_learned_weights():
    backbone = kgpt.LSTMBackbone(**SIZES, num_layers=2)
    grown = backbone.with_added_tokens(3, seed=0)
    table = to_numpy(grown.token_embedding.embeddings)
    np.testing.assert_array_equal(table[:97], to_numpy(backbone.token_embedding.embeddings))
    one = finetune_model.transfer(backbone, 1)
    same = [np.array_equal(to_numpy(a), to_numpy(b)) for a, b in zip(one.weights, backbone.weights)]
    names = [w.path for w in one.weights]
    assert all(s for s, n in zip(same, names) if n.startswith(("token_embedding", "lstm_0")))
    # Kernels are drawn afresh (biases start at constants, equal either way).
    assert not any(s for s, n in zip(same, names) if n.startswith(("lstm_1", "output_projection")) and "kernel" in n)
    with pytest.raises(ValueError, match=r"transfer_layers must be in 0..2"):
        finetune_model.transfer(backbone, 3)


def test_task_model_trains_on_an_lstm_backbone():
    model = kgpt.GPTTaskModel(kgpt.LSTMBackbone(**SIZES), head=kgpt.tasks.heads.ClassificationHead(["a", "b"]))
    ids = np.random.default_rng(0).integers(1, 97, (8, 1, 10)).astype("int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    history = model.fit(x, {"task": np.arange(8) % 2, "lm": ids[..., 1:]}, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert keras.ops.convert_to_numpy(model.predict(x)).shape == (8, 2)


def test_numpy_sizes_build_a_model_with_a_plain_config_and_bad_sizes_are_named():
    import json

    backbone = kgpt.LSTMBackbone(**{k: (np.float32(v) if k == "dropout" else np.int64(v)) for k, v in SIZES.items()})
    config = backbone.get_config()
    assert all(type(config[k]) is type(v) and config[k] == v for k, v in SIZES.items())
    assert json.loads(json.dumps(config))["lstm_units"] == SIZES["lstm_units"]
    assert to_numpy(backbone(random_inputs())).shape == (3, 12, 16)
    with pytest.raises(ValueError, match=r"^lstm_units must be an integer >= 1, got 0\.$"):
        kgpt.LSTMBackbone(**{**SIZES, "lstm_units": 0})
    with pytest.raises(TypeError, match=r"^num_layers must be an integer, got '2' \(str\)\.$"):
        kgpt.LSTMBackbone(**SIZES, num_layers="2")
    with pytest.raises(ValueError, match=r"^dropout must be a number in \[0, 1\), got 1\.5\.$"):
        kgpt.LSTMBackbone(**{**SIZES, "dropout": 1.5})
    # The task model's auxiliary weight saves as a float too.
    model = kgpt.GPTTaskModel(
        backbone, head=kgpt.tasks.heads.ClassificationHead(["a", "b"]), lm_coef=np.float32(0.5), classifier_dropout=0
    )
    config = model.get_config()
    assert type(config["lm_coef"]) is float and type(config["classifier_dropout"]) is float
    json.dumps(config)
