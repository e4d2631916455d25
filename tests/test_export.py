"""Exports: Hugging Face openai-gpt files (read back by kgpt) and a task model's SavedModel."""

import json
import os

import gpt1_reference
import numpy as np
import pytest
from conftest import TINY, char_tokenizer, to_numpy

import kgpt
from kgpt.io.export import export_task_model

HEADS = 2
SIZES = dict(n_ctx=16, hidden=16, inner=64, n_layer=2)  # Hugging Face's openai-gpt needs inner = 4 x hidden
SENTENCES = ["Hello, world!", "the cat sat on the mat.", "numbers 12 and 3.5; (maybe)?", "unknown é symbol"]


def hugging_face_layout(vocab, n_positions, hidden, n_layer):
    """`OpenAIGPTModel`'s state dict as Hugging Face documents it: Conv1D weights are [in, out]."""
    layout = {"tokens_embed.weight": (vocab, hidden), "positions_embed.weight": (n_positions, hidden)}
    for i in range(n_layer):
        layout.update(
            {
                f"h.{i}.attn.c_attn.weight": (hidden, 3 * hidden),
                f"h.{i}.attn.c_attn.bias": (3 * hidden,),
                f"h.{i}.attn.c_proj.weight": (hidden, hidden),
                f"h.{i}.attn.c_proj.bias": (hidden,),
                f"h.{i}.ln_1.weight": (hidden,),
                f"h.{i}.ln_1.bias": (hidden,),
                f"h.{i}.mlp.c_fc.weight": (hidden, 4 * hidden),
                f"h.{i}.mlp.c_fc.bias": (4 * hidden,),
                f"h.{i}.mlp.c_proj.weight": (4 * hidden, hidden),
                f"h.{i}.mlp.c_proj.bias": (hidden,),
                f"h.{i}.ln_2.weight": (hidden,),
                f"h.{i}.ln_2.bias": (hidden,),
            }
        )
    return layout


def random_backbone(vocab, seed=0):
    """A backbone holding large random weights (attention far from uniform), and those weights in the original order."""
    _, arrays = gpt1_reference.random_checkpoint(vocab=vocab, seed=seed, **SIZES)
    backbone = kgpt.GPTBackbone(
        vocabulary_size=vocab, num_layers=2, num_heads=HEADS, hidden_dim=16, intermediate_dim=64, max_sequence_length=16
    )
    kgpt.models.converters.original_convert.assign(backbone, arrays)
    return backbone, arrays


def outputs(backbone, ids):
    return to_numpy(backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)}))


@pytest.fixture
def tokenizer():
    return char_tokenizer()  # 95 BPE symbols + start, delimiter, extract


def test_hugging_face_export_round_trips(tmp_path, tokenizer):
    backbone, arrays = random_backbone(tokenizer.vocabulary_size())  # with the special tokens' rows
    backbone.save_original(str(tmp_path / "hf"), format="huggingface", tokenizer=tokenizer)
    loaded, loaded_tokenizer, description = kgpt.models.pretrained.load_pretrained(str(tmp_path / "hf"))
    assert description.startswith("Hugging Face checkpoint")
    assert loaded.get_config() == {**backbone.get_config(), "name": loaded.name}
    for want, got in zip(backbone.weights, loaded.weights):
        np.testing.assert_array_equal(to_numpy(got), to_numpy(want), err_msg=want.path)
    ids = np.random.default_rng(0).integers(0, tokenizer.vocabulary_size(), (2, 16)).astype("int32")
    np.testing.assert_allclose(outputs(loaded, ids), outputs(backbone, ids), atol=1e-6, rtol=0)
    reference, _ = gpt1_reference.forward(arrays, ids, HEADS)
    np.testing.assert_allclose(outputs(loaded, ids), reference, atol=1e-5, rtol=1e-5)
    # The tokenizer comes back with the same vocabulary, merges and special-token ids.
    assert loaded_tokenizer.fingerprint() == tokenizer.fingerprint()
    assert [loaded_tokenizer.encode(s) for s in SENTENCES] == [tokenizer.encode(s) for s in SENTENCES]
    assert (loaded_tokenizer.start_id, loaded_tokenizer.extract_id) == (95, 97)


def test_hugging_face_files_have_its_names_shapes_and_config(tmp_path, tokenizer):
    from safetensors.numpy import load_file

    backbone, arrays = random_backbone(tokenizer.vocabulary_size())
    backbone.save_original(str(tmp_path / "hf"), format="huggingface", tokenizer=tokenizer)
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert {n: t.shape for n, t in tensors.items()} == hugging_face_layout(98, 16, 16, 2)
    assert {t.dtype for t in tensors.values()} == {np.dtype("float32")}
    # The original arrays (weights without their leading 1) under their Hugging Face names.
    np.testing.assert_array_equal(tensors["positions_embed.weight"], arrays[0])
    np.testing.assert_array_equal(tensors["tokens_embed.weight"], arrays[1])
    np.testing.assert_array_equal(tensors["h.1.attn.c_attn.weight"], arrays[14][0])
    np.testing.assert_array_equal(tensors["h.1.mlp.c_fc.weight"], arrays[14 + 6][0])
    np.testing.assert_array_equal(tensors["h.1.ln_2.bias"], arrays[25])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert {
        k: config[k]
        for k in (
            "model_type",
            "vocab_size",
            "n_positions",
            "n_ctx",
            "n_embd",
            "n_layer",
            "n_head",
            "afn",
            "layer_norm_epsilon",
            "resid_pdrop",
            "attn_pdrop",
            "embd_pdrop",
            "initializer_range",
        )
    } == {
        "model_type": "openai-gpt",
        "vocab_size": 98,
        "n_positions": 16,
        "n_ctx": 16,
        "n_embd": 16,
        "n_layer": 2,
        "n_head": 2,
        "afn": "gelu",
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.1,
        "attn_pdrop": 0.1,
        "embd_pdrop": 0.1,
        "initializer_range": 0.02,
    }
    # The special tokens as Hugging Face's added tokens, after the 95 BPE symbols.
    hf = tmp_path / "hf"
    assert json.loads((hf / "added_tokens.json").read_text()) == {"_start_": 95, "_delimiter_": 96, "_classify_": 97}
    vocabulary = json.loads((hf / "vocab.json").read_text())
    assert len(vocabulary) == 95 and vocabulary["<unk>"] == 0 and "_start_" not in vocabulary
    decoder = json.loads((hf / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    assert {i: t["content"] for i, t in decoder.items()} == {"95": "_start_", "96": "_delimiter_", "97": "_classify_"}


def test_a_backbone_without_special_rows_exports_the_bare_vocabulary(tmp_path, tokenizer):
    backbone, _ = random_backbone(95)  # a pre-trained LM: no start/delimiter/extract rows
    backbone.save_original(str(tmp_path / "hf"), format="huggingface", tokenizer=tokenizer)
    assert sorted(os.listdir(tmp_path / "hf")) == [
        "config.json",
        "merges.txt",
        "model.safetensors",
        "tokenizer_config.json",
        "vocab.json",
    ]
    loaded, loaded_tokenizer, _ = kgpt.models.pretrained.load_pretrained(str(tmp_path / "hf"))
    assert loaded.vocabulary_size == 95 and loaded_tokenizer.vocabulary_size() == 98
    ids = np.arange(80, dtype="int32").reshape(5, 16)
    np.testing.assert_allclose(outputs(loaded, ids), outputs(backbone, ids), atol=1e-6, rtol=0)


def test_weights_are_written_as_float32(tmp_path):
    from safetensors.numpy import load_file

    backbone = kgpt.GPTBackbone(**{**TINY, "intermediate_dim": 64, "dtype": "bfloat16"})
    backbone.save_original(str(tmp_path / "hf"), format="huggingface")
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert {t.dtype for t in tensors.values()} == {np.dtype("float32")}
    table = to_numpy(backbone.token_embedding.embeddings).astype("float32")
    np.testing.assert_array_equal(tensors["tokens_embed.weight"], table)


def test_an_earlier_export_is_not_overwritten_by_default(tmp_path, tokenizer):
    out = str(tmp_path / "hf")
    with_specials, _ = random_backbone(98, seed=1)
    with_specials.save_original(out, format="huggingface", tokenizer=tokenizer)
    bare, _ = random_backbone(95, seed=2)
    with pytest.raises(FileExistsError, match=r"hf already holds config.json, model.safetensors, vocab.json"):
        bare.save_original(out, format="huggingface", tokenizer=tokenizer)
    bare.save_original(out, format="huggingface", tokenizer=tokenizer, overwrite=True)
    # The earlier export's added tokens would not fit the new vocabulary: they are gone.
    assert "added_tokens.json" not in os.listdir(out) and "special_tokens_map.json" not in os.listdir(out)
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
    loaded = kgpt.GPTBackbone.from_original(out)
    np.testing.assert_array_equal(
        to_numpy(loaded.token_embedding.embeddings), to_numpy(bare.token_embedding.embeddings)
    )
    # An original-format checkpoint would be read instead of the export: refused too.
    bare.save_original(str(tmp_path / "both"))
    with pytest.raises(FileExistsError, match="params_shapes.json, params_0.npy"):
        bare.save_original(str(tmp_path / "both"), format="huggingface")


def test_bad_exports_fail_clearly(tmp_path, tokenizer):
    backbone, _ = random_backbone(98)
    with pytest.raises(ValueError, match="format must be one of 'original', 'huggingface', got 'hf'"):
        backbone.save_original(str(tmp_path / "x"), format="hf")
    narrow = kgpt.GPTBackbone(**TINY)  # intermediate_dim 32 = 2 x hidden
    with pytest.raises(ValueError, match=r"inner size of 4 x hidden \(64\); this backbone's intermediate_dim is 32"):
        narrow.save_original(str(tmp_path / "x"), format="huggingface")
    with pytest.raises(ValueError, match=r"tokenizer: its 95 tokens \(\+ 3 special\) do not fit the backbone's 97"):
        kgpt.GPTBackbone(**{**TINY, "intermediate_dim": 64}).save_original(
            str(tmp_path / "x"), format="huggingface", tokenizer=tokenizer
        )
    lstm = kgpt.LSTMBackbone(vocabulary_size=98, hidden_dim=16, lstm_units=8)
    with pytest.raises(TypeError, match="LSTMBackbone has no Hugging Face openai-gpt format"):
        kgpt.models.converters.original_convert.save_huggingface(lstm, str(tmp_path / "x"))
    assert not os.path.exists(tmp_path / "x")  # nothing written by a refused export


# --- SavedModel of a task model ----------------------------------------------------


def padded_inputs(batch, views, length, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, TINY["vocabulary_size"], (batch, views, length)).astype("int32")
    mask = (np.arange(length) < rng.integers(1, length + 1, (batch, views, 1))).astype("int32")
    return {"token_ids": ids * mask, "padding_mask": mask}


def test_saved_model_serves_the_task_output_only(tmp_path):
    import tensorflow as tf

    model = kgpt.GPTTaskModel(
        kgpt.GPTBackbone(**TINY), head=kgpt.tasks.heads.ClassificationHead(["a", "b", "c"]), num_views=2, lm_coef=0.5
    )
    assert set(model.output) == {"task", "lm"}
    export_task_model(model, str(tmp_path / "served"), verbose=False)
    served = tf.saved_model.load(str(tmp_path / "served"))
    for batch, length, seed in ((3, 5, 0), (2, 11, 1)):  # batch and length are dynamic
        x = padded_inputs(batch, 2, length, seed)
        want = model.task_predictor().predict(x, verbose=0)
        assert want.shape == (batch, 3)
        np.testing.assert_allclose(served.serve(x).numpy(), want, atol=1e-5, rtol=1e-5)
    signature = served.signatures["serving_default"]
    assert {n: s.shape.as_list() for n, s in signature.structured_input_signature[1].items()} == {
        "token_ids": [None, 2, None],
        "padding_mask": [None, 2, None],
    }
    # One output, the logits: no [batch, views, length - 1, hidden] LM states.
    assert [s.shape.as_list() for s in signature.structured_outputs.values()] == [[None, 3]]


def test_saved_model_export_refuses_other_formats_and_models(tmp_path):
    model = kgpt.GPTTaskModel(kgpt.GPTBackbone(**TINY), head=kgpt.tasks.heads.RegressionHead())
    with pytest.raises(ValueError, match="format must be 'tf_saved_model', got 'onnx'"):
        export_task_model(model, str(tmp_path / "x"), format="onnx")
    with pytest.raises(TypeError, match="model must be a kgpt.GPTTaskModel, got GPTBackbone"):
        export_task_model(model.backbone, str(tmp_path / "x"))
    with pytest.raises(ValueError, match="input_signature is fixed"):
        export_task_model(model, str(tmp_path / "x"), input_signature=[])


def test_causal_lm_saved_model_serves_logits_on_either_backend(tmp_path):
    import tensorflow as tf

    lm = kgpt.GPTCausalLM(kgpt.GPTBackbone(**TINY))
    lm.export(str(tmp_path / "lm"), verbose=False)  # on JAX, through jax2tf with the length bounded by the context
    served = tf.saved_model.load(str(tmp_path / "lm"))
    for batch, length, seed in ((3, 5, 0), (2, TINY["max_sequence_length"], 1)):  # batch and length are dynamic
        x = {name: value[:, 0] for name, value in padded_inputs(batch, 1, length, seed).items()}
        np.testing.assert_allclose(served.serve(x).numpy(), to_numpy(lm(x)), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="format must be 'tf_saved_model', got 'onnx'"):
        lm.export(str(tmp_path / "x"), format="onnx")
