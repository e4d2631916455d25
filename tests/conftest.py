"""Shared fixtures: tiny models (2 layers, hidden 16) so the suite runs in minutes."""

import keras
import numpy as np
import pytest

import kgpt

TINY = dict(
    vocabulary_size=97,
    num_layers=2,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    max_sequence_length=16,
)


def pytest_report_header(config):
    return f"keras backend: {keras.config.backend()}"


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)


@pytest.fixture
def backbone():
    return kgpt.GPTBackbone(**TINY)


@pytest.fixture
def causal_lm(backbone):
    return kgpt.GPTCausalLM(backbone)


def random_inputs(batch=3, length=12, vocabulary_size=TINY["vocabulary_size"], seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocabulary_size, (batch, length)).astype("int32")
    return {"token_ids": ids, "padding_mask": np.ones_like(ids)}


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def char_tokenizer():
    """A GPTTokenizer over single characters (no merges): a ~140-id vocabulary for fast tests."""
    chars = "abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"-()"
    encoder = {"<unk>": 0}
    for c in chars:
        encoder[c] = len(encoder)
    for c in chars:
        encoder[c + "</w>"] = len(encoder)
    return kgpt.GPTTokenizer(encoder, [])


@pytest.fixture
def tiny_preset(tmp_path):
    """A preset directory (backbone config + weights + tokenizer) with a tiny model."""
    tokenizer = char_tokenizer()
    backbone = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": tokenizer.vocabulary_size(),
                                   "max_sequence_length": 128})
    path = tmp_path / "preset"
    backbone.save_to_preset(str(path))
    tokenizer.save_to_preset(str(path))
    return str(path)
