import keras
import numpy as np
import pytest
from conftest import TINY, one_backend, random_inputs, to_numpy

import kgpt


def test_output_shape_and_tied_embedding(backbone):
    out = backbone(random_inputs(batch=3, length=12))
    assert tuple(out.shape) == (3, 12, TINY["hidden_dim"])
    assert isinstance(backbone.token_embedding, keras_hub_reversible())
    assert backbone.token_embedding.tie_weights


def keras_hub_reversible():
    import keras_hub

    return keras_hub.layers.ReversibleEmbedding


def test_architecture_matches_gpt1(backbone):
    layer = backbone.transformer_layers[0]
    assert isinstance(layer, kgpt.layers.decoder_block.GPTDecoderBlock)
    assert layer.layer_norm_epsilon == 1e-5
    assert layer.dropout == 0.1
    x = np.linspace(-3, 3, 7).astype("float32")
    tanh_gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(to_numpy(layer.activation(x)), tanh_gelu, atol=1e-6)
    # Post-LN: a freshly initialised block's output is layer-normed (mean 0, variance 1 per token).
    out = to_numpy(layer(np.random.default_rng(0).normal(size=(2, 5, TINY["hidden_dim"])).astype("float32")))
    np.testing.assert_allclose(out.mean(-1), 0, atol=1e-5)
    np.testing.assert_allclose(out.var(-1), 1, atol=1e-3)
    # No final layer norm: the output of the last block is the output.
    assert not any(isinstance(layer, keras.layers.LayerNormalization) for layer in backbone.layers)


def test_no_keras_hub_private_attributes_are_used():
    """kgpt owns its decoder block: nothing reaches into keras-hub's (or Keras') private sublayers."""
    import pathlib
    import re

    root = pathlib.Path(kgpt.__file__).parent
    private = re.compile(r"\._(self_attention|feedforward|softmax|dropout|(query|key|value|output)_dense)")
    hits = [
        f"{p.relative_to(root)}:{i}"
        for p in root.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if private.search(line)
    ]
    assert not hits
    assert "keras_hub.layers import TransformerDecoder" not in (root / "models" / "gpt" / "gpt_backbone.py").read_text()


@pytest.mark.parametrize("attention_dropout", [None, 0.0])
def test_block_cache_equals_the_full_pass(attention_dropout):
    """Feeding a block one position at a time through its key/value cache gives the full pass's states."""
    block = kgpt.layers.decoder_block.GPTDecoderBlock(
        num_heads=2, intermediate_dim=32, dropout=0.1, attention_dropout=attention_dropout
    )
    x = np.random.default_rng(0).normal(size=(2, 6, 16)).astype("float32")
    full = to_numpy(block(x))
    cache = np.zeros((2, 2, 6, 2, 8), "float32")
    steps = []
    for t in range(6):
        y, cache = block(x[:, t : t + 1], cache=cache, cache_update_index=t)
        steps.append(to_numpy(y))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_attention_dropout_zero_takes_the_fused_path_with_the_same_result():
    explicit = kgpt.GPTBackbone(**TINY)
    fused = kgpt.GPTBackbone(**TINY, attention_dropout=0.0)
    fused.set_weights(explicit.get_weights())
    assert fused.transformer_layers[0].attention_probs_dropout.rate == 0.0
    x = random_inputs(batch=2, length=12)
    x["padding_mask"][1, 7:] = 0
    np.testing.assert_allclose(to_numpy(fused(x)), to_numpy(explicit(x)), atol=1e-5)


def test_init_is_normal_002():
    backbone = kgpt.GPTBackbone(**dict(TINY, vocabulary_size=4000, hidden_dim=64, num_heads=4))
    table = to_numpy(backbone.token_embedding.embeddings)
    assert abs(table.std() - 0.02) < 0.001
    assert abs(table.mean()) < 0.001


def test_initializer_range_sets_every_embedding_and_kernel_and_is_saved():
    sizes = dict(TINY, vocabulary_size=4000, hidden_dim=64, num_heads=4)
    backbone = kgpt.GPTBackbone(**sizes, initializer_range=0.1)
    for weights in (
        backbone.token_embedding.embeddings,
        backbone.position_embedding.position_embeddings,
        backbone.transformer_layers[0].feedforward_intermediate_dense.kernel,
    ):
        assert abs(to_numpy(weights).std() - 0.1) < 0.005, weights.path
    assert backbone.get_config()["initializer_range"] == 0.1
    assert kgpt.GPTBackbone.from_config(backbone.get_config()).initializer_range == 0.1
    new_rows = to_numpy(backbone.with_added_tokens(200, seed=0).token_embedding.embeddings)[-200:]
    assert abs(new_rows.std() - 0.1) < 0.01  # special tokens drawn like the rest
    old = backbone.get_config()
    del old["initializer_range"]  # a preset saved before the option: the paper's 0.02
    assert kgpt.GPTBackbone.from_config(old).initializer_range == 0.02
    for bad in (0, -0.1):
        with pytest.raises(ValueError, match="initializer_range must be a finite number > 0"):
            kgpt.GPTBackbone(**sizes, initializer_range=bad)


def test_causality(backbone):
    x = random_inputs(batch=2, length=12)
    base = to_numpy(backbone(x))
    for t in range(11):
        changed = {k: v.copy() for k, v in x.items()}
        changed["token_ids"][:, t + 1] = (changed["token_ids"][:, t + 1] + 1) % TINY["vocabulary_size"]
        out = to_numpy(backbone(changed))
        np.testing.assert_allclose(out[:, : t + 1], base[:, : t + 1], atol=1e-6)
        assert not np.allclose(out[:, t + 1], base[:, t + 1], atol=1e-4)


@pytest.mark.parametrize("pad_id", [0, 5])
def test_right_padding_leaves_real_positions_unchanged(backbone, pad_id):
    x = random_inputs(batch=1, length=9)
    alone = to_numpy(backbone(x))
    ids = np.full((1, 16), pad_id, "int32")
    ids[:, :9] = x["token_ids"]
    mask = np.zeros((1, 16), "int32")
    mask[:, :9] = 1
    padded = to_numpy(backbone({"token_ids": ids, "padding_mask": mask}))
    np.testing.assert_allclose(padded[:, :9], alone, atol=1e-5)


def test_padding_mask_hides_masked_keys(backbone):
    # A masked token must not influence any later position, whatever its id.
    x = random_inputs(batch=1, length=10)
    x["padding_mask"][:, 3] = 0
    base = to_numpy(backbone(x))
    x["token_ids"][:, 3] = (x["token_ids"][:, 3] + 7) % TINY["vocabulary_size"]
    other = to_numpy(backbone(x))
    np.testing.assert_allclose(other[:, 4:], base[:, 4:], atol=1e-5)


@one_backend("tensorflow")  # the same Keras layers on both; JAX spends 30 s drawing the 117M initial weights
def test_paper_configuration_weight_count():
    assert kgpt.GPTBackbone.gpt1().count_params() == 116_534_784
    assert kgpt.GPTBackbone.gpt1(num_special_tokens=3).count_params() == 116_534_784 + 3 * 768


def test_with_added_tokens_copies_weights(backbone):
    grown = backbone.with_added_tokens(3, seed=0)
    assert grown.vocabulary_size == TINY["vocabulary_size"] + 3
    assert grown.count_params() == backbone.count_params() + 3 * TINY["hidden_dim"]
    x = random_inputs()
    np.testing.assert_allclose(to_numpy(grown(x)), to_numpy(backbone(x)), atol=1e-6)
    new_rows = to_numpy(grown.token_embedding.embeddings)[-3:]
    assert new_rows.std() > 0.005
    special = dict(
        x, token_ids=np.full((1, 4), TINY["vocabulary_size"] + 2, "int32"), padding_mask=np.ones((1, 4), "int32")
    )
    assert tuple(grown(special).shape) == (1, 4, TINY["hidden_dim"])
    with pytest.raises(ValueError, match="num_tokens"):
        backbone.with_added_tokens(-1)


def test_bad_head_count():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        kgpt.GPTBackbone(**dict(TINY, num_heads=3))


def test_get_config_round_trip(backbone):
    config = backbone.get_config()
    for key, value in TINY.items():
        assert config[key] == value
    clone = kgpt.GPTBackbone.from_config(config)
    assert isinstance(clone, kgpt.GPTBackbone)
    assert clone.count_params() == backbone.count_params()


def test_keras_file_round_trip(backbone, tmp_path):
    x = random_inputs()
    path = tmp_path / "backbone.keras"
    backbone.save(path)
    loaded = keras.saving.load_model(path)  # safe_mode on: no code is run
    assert isinstance(loaded, kgpt.GPTBackbone)
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(backbone(x)), atol=0)


def test_fused_attention_matches_the_explicit_path():
    # attention_dropout=0 sends attention through keras.ops.dot_product_attention;
    # with the paper's 0.1 Keras computes the softmax itself. Same weights, same states.
    explicit = kgpt.GPTBackbone(**TINY)
    fused = kgpt.GPTBackbone(**TINY, attention_dropout=0.0)
    fused.set_weights(explicit.get_weights())
    x = random_inputs()
    x["padding_mask"][0, 8:] = 0
    got, want = to_numpy(fused(x)), to_numpy(explicit(x))
    np.testing.assert_allclose(got[0, :8], want[0, :8], atol=1e-5)
    np.testing.assert_allclose(got[1:], want[1:], atol=1e-5)
    assert kgpt.GPTBackbone.from_config(fused.get_config()).attention_dropout == 0.0


def test_numpy_sizes_and_rates_build_a_model_with_a_plain_config(tmp_path):
    import json

    sizes = {key: np.int64(value) for key, value in TINY.items()}
    backbone = kgpt.GPTBackbone(**sizes, dropout=np.float32(0.0), initializer_range=np.float64(0.05))
    x = random_inputs()
    out = to_numpy(backbone(x))
    assert out.shape == (3, 12, TINY["hidden_dim"])
    config = backbone.get_config()
    for key, value in TINY.items():
        assert type(config[key]) is int and config[key] == value, key
    assert type(config["dropout"]) is float and type(config["initializer_range"]) is float
    assert json.loads(json.dumps(config))["vocabulary_size"] == TINY["vocabulary_size"]
    clone = kgpt.GPTBackbone.from_config(config)
    clone.set_weights(backbone.get_weights())
    np.testing.assert_allclose(to_numpy(clone(x)), out, atol=0)
    backbone.save_to_preset(str(tmp_path / "preset"))
    saved = json.loads((tmp_path / "preset" / "config.json").read_text())["config"]
    assert {key: saved[key] for key in TINY} == TINY
    loaded = kgpt.GPTBackbone.from_preset(str(tmp_path / "preset"))
    np.testing.assert_allclose(to_numpy(loaded(x)), out, atol=0)
