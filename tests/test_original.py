"""Loading the original GPT-1 release format (and Hugging Face's), checked against a NumPy forward pass."""

import json
import os
import random
import shutil

import gpt1_reference
import keras
import numpy as np
import pytest
from conftest import TINY, char_tokenizer, to_numpy

import kgpt
from kgpt.models.converters.original import array_names

SIZES = dict(vocab=120, n_ctx=16, hidden=24, inner=96, n_layer=2)
HEADS = 3


def write_original(directory, shapes, arrays, num_shards=10):
    """The release's layout, written independently of kgpt: one flat vector cut into shards."""
    os.makedirs(directory, exist_ok=True)
    flat = np.concatenate([a.ravel() for a in arrays])
    for i, shard in enumerate(np.array_split(flat, num_shards)):
        np.save(os.path.join(directory, f"params_{i}.npy"), shard)
    with open(os.path.join(directory, "params_shapes.json"), "w") as f:
        json.dump(shapes, f)


@pytest.fixture
def checkpoint(tmp_path):
    shapes, arrays = gpt1_reference.random_checkpoint(**SIZES)
    write_original(tmp_path / "model", shapes, arrays)
    return str(tmp_path / "model"), shapes, arrays


def hidden_and_logits(backbone, ids):
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    hidden = keras.ops.convert_to_numpy(backbone(x))
    logits = keras.ops.convert_to_numpy(kgpt.GPTCausalLM(backbone)(x))
    return hidden, logits


def test_original_checkpoint_matches_the_numpy_reference(checkpoint):
    path, _, arrays = checkpoint
    backbone = kgpt.GPTBackbone.from_original(path, num_heads=HEADS)
    assert (backbone.num_layers, backbone.hidden_dim, backbone.intermediate_dim) == (2, 24, 96)
    assert (backbone.vocabulary_size, backbone.max_sequence_length) == (120, 16)
    ids = np.random.default_rng(1).integers(0, 120, (3, 16)).astype("int32")
    hidden, logits = hidden_and_logits(backbone, ids)
    want_hidden, want_logits = gpt1_reference.forward(arrays, ids, HEADS)
    np.testing.assert_allclose(hidden, want_hidden, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(logits, want_logits, atol=1e-5, rtol=1e-5)
    # A different head count is a different model: the test can tell them apart.
    wrong, _ = gpt1_reference.forward(arrays, ids, 2)
    assert np.abs(wrong - want_hidden).max() > 1e-2


def test_special_token_rows_are_appended(checkpoint):
    path, _, arrays = checkpoint
    backbone = kgpt.GPTBackbone.from_original(path, num_heads=HEADS, num_special_tokens=3, seed=0)
    table = keras.ops.convert_to_numpy(backbone.token_embedding.embeddings)
    assert table.shape == (123, 24)
    np.testing.assert_array_equal(table[:120], arrays[1])
    assert 0.005 < table[120:].std() < 0.05  # N(0, 0.02), as the original fine-tuning code


def test_seeded_special_token_rows_leave_the_global_random_state_alone(checkpoint):
    path, _, _ = checkpoint

    def load_then_draw(seed):
        keras.utils.set_random_seed(5)
        table = kgpt.GPTBackbone.from_original(path, num_heads=HEADS, num_special_tokens=3, seed=seed)
        return table.token_embedding.embeddings, (random.random(), np.random.rand(), float(keras.random.uniform(())))

    tables, draws = zip(*[load_then_draw(seed) for seed in (None, 0, 0, 1)])
    assert draws[1] == draws[0]  # the global generators go on as if no seed had been given
    tables = [keras.ops.convert_to_numpy(t) for t in tables[1:]]
    np.testing.assert_array_equal(tables[0], tables[1])
    assert not np.allclose(tables[0][120:], tables[2][120:])
    # NumPy's generator draws them, the same on every backend: N(0, 0.02) from default_rng(seed).
    drawn = np.random.default_rng(0).normal(0.0, 0.02, (3, 24)).astype("float32")
    np.testing.assert_array_equal(tables[0][120:], drawn)


def test_export_writes_the_original_format(checkpoint, tmp_path):
    path, shapes, arrays = checkpoint
    backbone = kgpt.GPTBackbone.from_original(path, num_heads=HEADS)
    out = tmp_path / "exported"
    (out).mkdir()
    np.save(out / "params_11.npy", np.zeros(3, "float32"))  # stale shard from an older export
    backbone.save_original(str(out))
    assert json.loads((out / "params_shapes.json").read_text()) == shapes
    assert sorted(os.listdir(out)) == sorted(["params_shapes.json"] + [f"params_{i}.npy" for i in range(10)])
    flat = np.concatenate([np.load(out / f"params_{i}.npy", allow_pickle=False) for i in range(10)])
    np.testing.assert_array_equal(flat, np.concatenate([a.ravel() for a in arrays]))


def test_export_writes_the_tokenizer_files_beside_special_token_rows(tmp_path):
    tokenizer = char_tokenizer()  # 95 BPE symbols + start, delimiter, extract
    backbone = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": tokenizer.vocabulary_size()})
    backbone.save_original(str(tmp_path / "release"), tokenizer=tokenizer)
    encoder = json.loads((tmp_path / "release" / "encoder_bpe_40000.json").read_text())
    assert len(encoder) == 95 and "_start_" not in encoder  # the release's files never hold the special tokens
    loaded, loaded_tokenizer, _ = kgpt.models.pretrained.load_pretrained(str(tmp_path / "release"), num_heads=2)
    assert loaded_tokenizer.fingerprint() == tokenizer.fingerprint()
    for want, got in zip(backbone.weights, loaded.weights):
        np.testing.assert_array_equal(to_numpy(got), to_numpy(want))


def write_huggingface(directory, arrays, n_head=HEADS, prefix=""):
    from safetensors.numpy import save_file

    names = ["positions_embed.weight", "tokens_embed.weight"]
    layer = [
        "attn.c_attn.weight",
        "attn.c_attn.bias",
        "attn.c_proj.weight",
        "attn.c_proj.bias",
        "ln_1.weight",
        "ln_1.bias",
        "mlp.c_fc.weight",
        "mlp.c_fc.bias",
        "mlp.c_proj.weight",
        "mlp.c_proj.bias",
        "ln_2.weight",
        "ln_2.bias",
    ]
    n_layer = (len(arrays) - 2) // 12
    names += [f"h.{i}.{n}" for i in range(n_layer) for n in layer]
    tensors = {prefix + n: (a[0] if a.ndim == 3 else a) for n, a in zip(names, arrays)}
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, "model.safetensors"))
    config = {
        "model_type": "openai-gpt",
        "n_layer": n_layer,
        "n_head": n_head,
        "n_embd": arrays[1].shape[1],
        "n_positions": arrays[0].shape[0],
        "vocab_size": arrays[1].shape[0],
        "afn": "gelu",
    }
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_hugging_face_files_load_to_the_same_model(tmp_path, prefix):
    _, arrays = gpt1_reference.random_checkpoint(**SIZES)
    write_huggingface(tmp_path / "hf", arrays, prefix=prefix)
    backbone = kgpt.GPTBackbone.from_original(str(tmp_path / "hf"))  # n_head read from config.json
    assert backbone.num_heads == HEADS
    ids = np.arange(10, dtype="int32")[None]
    hidden, logits = hidden_and_logits(backbone, ids)
    want_hidden, want_logits = gpt1_reference.forward(arrays, ids, HEADS)
    np.testing.assert_allclose(hidden, want_hidden, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(logits, want_logits, atol=1e-5, rtol=1e-5)


def test_original_tokenizer_loads_from_a_directory(tmp_path):
    shipped = os.path.join(os.path.dirname(kgpt.__file__), "assets", "gpt1_bpe")
    gpt1 = kgpt.GPTTokenizer.gpt1()
    assert kgpt.GPTTokenizer.from_original(shipped).fingerprint() == gpt1.fingerprint()
    hf = tmp_path / "hf"
    hf.mkdir()
    shutil.copy(os.path.join(shipped, "encoder_bpe_40000.json"), hf / "vocab.json")
    shutil.copy(os.path.join(shipped, "vocab_40000.bpe"), hf / "merges.txt")
    assert kgpt.GPTTokenizer.from_original(str(hf)).encode("Hello world!") == gpt1.encode("Hello world!")


# --- every corrupt-file case, with its message -------------------------------


def corrupt(path, shapes, arrays, how):
    if how == "no files":
        for name in os.listdir(path):
            os.remove(os.path.join(path, name))
    elif how == "bad json":
        with open(os.path.join(path, "params_shapes.json"), "w") as f:
            f.write("[[16, 24], [120, 24]")
    elif how == "array count":
        write_original(path, shapes[:-1], arrays[:-1])
    elif how == "wrong shape":
        shapes[9] = [95]
        arrays[9] = arrays[9][:95]
        write_original(path, shapes, arrays)
    elif how == "missing last shard":
        os.remove(os.path.join(path, "params_9.npy"))
    elif how == "missing middle shard":
        os.remove(os.path.join(path, "params_4.npy"))
    elif how == "truncated shard":
        data = open(os.path.join(path, "params_3.npy"), "rb").read()
        open(os.path.join(path, "params_3.npy"), "wb").write(data[: len(data) // 2])
    elif how == "pickled shard":
        np.save(os.path.join(path, "params_2.npy"), np.array([{"x": 1}], dtype=object), allow_pickle=True)
    elif how == "vocabulary":
        with open(os.path.join(path, "encoder_bpe_40000.json"), "w") as f:
            json.dump({f"t{i}": i for i in range(119)}, f)
    elif how == "heads":
        pass


CASES = {
    "no files": "holds neither the original release (params_shapes.json + params_0..9.npy) nor Hugging Face",
    "bad json": "params_shapes.json is not valid JSON",
    "array count": "25 arrays; a GPT-1 checkpoint has 2 embeddings + 12 per layer",
    "wrong shape": "array 9 (h0/mlp/c_fc/b) has shape [95], expected [96]",
    "missing last shard": "the 9 shard(s) params_0..8.npy hold",
    "missing middle shard": "without gaps; params_4.npy is missing",
    "truncated shard": "params_3.npy is not a readable .npy array",
    "pickled shard": "params_2.npy is not a readable .npy array",
    "vocabulary": "encoder_bpe_40000.json has 119 tokens but the checkpoint's token embedding has 120 rows",
    "heads": "hidden size 24 is not divisible by num_heads=5",
}


@pytest.mark.parametrize("how", list(CASES))
def test_corrupt_original_checkpoints_fail_clearly(checkpoint, how):
    path, shapes, arrays = checkpoint
    corrupt(path, list(shapes), list(arrays), how)
    with pytest.raises(kgpt.CheckpointError) as error:
        kgpt.GPTBackbone.from_original(path, num_heads=5 if how == "heads" else HEADS)
    assert CASES[how] in str(error.value)


def test_corrupt_hugging_face_files_fail_clearly(tmp_path):
    _, arrays = gpt1_reference.random_checkpoint(**SIZES)
    write_huggingface(tmp_path / "hf", arrays[:-12], n_head=HEADS)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "n_layer": 2}))
    with pytest.raises(kgpt.CheckpointError, match=r"says n_layer=2, but .*model.safetensors holds blocks 0\."):
        kgpt.GPTBackbone.from_original(str(tmp_path / "hf"))
    weights = tmp_path / "hf" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(kgpt.CheckpointError, match="model.safetensors is not a readable safetensors file"):
        kgpt.GPTBackbone.from_original(str(tmp_path / "hf"))


def test_added_tokens_elsewhere_than_kgpt_puts_them_fail_clearly(tmp_path):
    _, arrays = gpt1_reference.random_checkpoint(**SIZES)  # 120 token rows
    write_huggingface(tmp_path / "hf", arrays)
    (tmp_path / "hf" / "vocab.json").write_text(json.dumps({f"t{i}": i for i in range(117)}))
    added = {"_start_": 117, "_classify_": 118, "_delimiter_": 119}
    (tmp_path / "hf" / "added_tokens.json").write_text(json.dumps(added))
    with pytest.raises(kgpt.CheckpointError, match="added_tokens.json: kgpt's tokenizer reads .*'_delimiter_': 118"):
        kgpt.GPTBackbone.from_original(str(tmp_path / "hf"))
    (tmp_path / "hf" / "added_tokens.json").write_text(json.dumps({"_start_": 117}))
    with pytest.raises(kgpt.CheckpointError, match="added_tokens.json"):
        kgpt.GPTBackbone.from_original(str(tmp_path / "hf"))


def test_mismatched_tokenizer_files_fail_clearly(tmp_path):
    (tmp_path / "encoder_bpe_40000.json").write_text(json.dumps({"a": 0, "b": 1, "a</w>": 2}))
    (tmp_path / "vocab_40000.bpe").write_text("#version: 0.2\na b\n")
    with pytest.raises(ValueError, match=r"vocab_40000.bpe:2: merge 'a b' makes 'ab', which the encoder file lacks"):
        kgpt.GPTTokenizer.from_original(str(tmp_path))


def test_the_real_release_shapes_give_the_paper_model():
    shipped = os.path.join(os.path.dirname(kgpt.__file__), "assets", "gpt1_bpe", "params_shapes.json")
    shapes = json.load(open(shipped))  # the release's own file (MIT), shipped with kgpt
    sizes = kgpt.models.converters.original.sizes_from_shapes(shapes, shipped)
    paper = {k: kgpt.GPT1_CONFIG[k] for k in sizes}
    assert sizes == paper
    names = array_names(12)
    assert len(names) == len(shapes) == 146 and names[:3] == ["positions", "tokens", "h0/attn/c_attn/w"]


@pytest.mark.parametrize("sizes", [dict(TINY), kgpt.GPT1_CONFIG, dict(TINY, num_layers=10**9)])
def test_the_original_count_is_the_backbones(sizes):
    """The original release's arrays (`expected_shapes`) and the backbone's (`weight_shapes`) hold the same weights:
    the dry run counts with the one, a preset's check with the other."""
    config = kgpt.GPTBackbone.check_config(
        {"dropout": 0.1, "attention_dropout": None, "initializer_range": 0.02, "dtype": None, **sizes}
    )
    assert kgpt.models.converters.original.weight_count(**config) == kgpt.GPTBackbone.min_weight_count(config)
    if sizes is kgpt.GPT1_CONFIG:
        assert kgpt.GPTBackbone.min_weight_count(config) == 116_534_784
