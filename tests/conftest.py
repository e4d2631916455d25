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
