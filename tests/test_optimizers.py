import math

import numpy as np
import pytest
from conftest import to_numpy

import kgpt


def test_warmup_then_cosine_to_zero():
    s = kgpt.WarmupSchedule(2.5e-4, warmup_steps=2000, total_steps=12000)
    values = {step: float(to_numpy(s(step))) for step in (0, 1000, 2000, 7000, 12000, 20000)}
    assert values[0] == 0.0
    assert math.isclose(values[1000], 1.25e-4, rel_tol=1e-5)
    assert math.isclose(values[2000], 2.5e-4, rel_tol=1e-5)
    assert math.isclose(values[7000], 1.25e-4, rel_tol=1e-4)  # cosine midpoint
    assert values[12000] < 1e-12 and values[20000] < 1e-12


def test_warmup_then_linear_decay():
    s = kgpt.WarmupSchedule(6.25e-5, warmup_steps=10, total_steps=110, decay="linear")
    assert math.isclose(float(to_numpy(s(5))), 3.125e-5, rel_tol=1e-5)
    assert math.isclose(float(to_numpy(s(60))), 3.125e-5, rel_tol=1e-5)
    assert float(to_numpy(s(110))) == 0.0


def test_no_horizon_holds_peak():
    s = kgpt.WarmupSchedule(1e-3, warmup_steps=10)
    assert math.isclose(float(to_numpy(s(10_000))), 1e-3, rel_tol=1e-6)


def test_schedule_errors():
    with pytest.raises(ValueError, match="decay must be one of 'cosine', 'linear', got 'step'"):
        kgpt.WarmupSchedule(1e-3, 10, 100, decay="step")
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be an integer >= 1, got 0"):
        kgpt.WarmupSchedule(1e-3, 10, 100, gradient_accumulation_steps=0)
    with pytest.raises(ValueError, match="total_steps"):
        kgpt.WarmupSchedule(1e-3, 100, 10)


@pytest.mark.parametrize(
    "arguments, error, match",
    [
        ((-1e-3, 10), ValueError, "peak_learning_rate must be a finite number >= 0, got -0.001"),
        ((float("nan"), 10), ValueError, "peak_learning_rate must be a finite number >= 0, got nan"),
        ((float("inf"), 10), ValueError, "peak_learning_rate must be a finite number >= 0, got inf"),
        (("1e-3", 10), ValueError, "peak_learning_rate must be a finite number >= 0, got '1e-3'"),
        ((1e-3, -1), ValueError, "warmup_steps must be an integer >= 0, got -1"),
        ((1e-3, 2.5), TypeError, r"warmup_steps must be an integer, got 2.5 \(float\)"),
        ((1e-3, 10, 100.0), TypeError, r"total_steps must be an integer, or None, got 100.0"),
        ((1e-3, 10, -5), ValueError, r"total_steps must be an integer >= 0, or None, got -5"),
    ],
)
def test_schedule_refuses_bad_rates_and_step_counts(arguments, error, match):
    with pytest.raises(error, match=match):
        kgpt.WarmupSchedule(*arguments)


def test_schedule_takes_numpy_numbers_as_python_ones():
    s = kgpt.WarmupSchedule(np.float32(1e-3), np.int64(10), np.int64(100))
    assert s.get_config() == {
        "peak_learning_rate": float(np.float32(1e-3)),
        "warmup_steps": 10,
        "total_steps": 100,
        "decay": "cosine",
    }
    assert all(type(v) in (float, int, str) for v in s.get_config().values())


@pytest.mark.parametrize(
    "arguments, error, match",
    [
        (dict(learning_rate=-1.0), ValueError, "learning_rate must be a finite number >= 0, got -1.0"),
        (dict(learning_rate=float("nan")), ValueError, "learning_rate must be a finite number >= 0, got nan"),
        (dict(warmup_steps=100, total_steps=10), ValueError, r"total_steps \(10\) must be >= warmup_steps \(100\)"),
        (dict(warmup_steps=20.0), TypeError, "warmup_steps must be an integer, got 20.0"),
        (dict(total_steps=-1), ValueError, "total_steps must be an integer >= 0, or None, got -1"),
        (dict(weight_decay=-0.01), ValueError, "weight_decay must be a finite number >= 0, got -0.01"),
        (dict(global_clipnorm=0), ValueError, "global_clipnorm must be a finite number > 0, got 0"),
        (dict(gradient_accumulation_steps=0), ValueError, "gradient_accumulation_steps must be an integer >= 1"),
    ],
)
def test_gpt_adamw_refuses_bad_arguments_naming_them(arguments, error, match):
    with pytest.raises(error, match=match):
        kgpt.gpt_adamw(**arguments)


def test_gpt_adamw_takes_no_clipping():
    assert kgpt.gpt_adamw(global_clipnorm=None).global_clipnorm is None


def test_weight_decay_skips_biases_and_layer_norm(causal_lm):
    # Zero gradients make Adam's step exactly 0, leaving only the decay.
    optimizer = kgpt.gpt_adamw(learning_rate=0.5, warmup_steps=0, weight_decay=0.1)
    variables = causal_lm.trainable_variables
    rng = np.random.default_rng(0)
    for v in variables:  # biases and offsets start at 0, where decay is invisible
        v.assign(rng.normal(1.0, 0.1, v.shape).astype("float32"))
    before = [to_numpy(v).copy() for v in variables]
    optimizer.apply([np.zeros(v.shape, "float32") for v in variables], variables)
    decayed, kept = set(), set()
    for v, old in zip(variables, before):
        new = to_numpy(v)
        if np.allclose(new, old):
            kept.add(v.name)
        else:
            np.testing.assert_allclose(new, old * (1 - 0.5 * 0.1), rtol=1e-5)
            decayed.add(v.name)
    assert kept == {"bias", "gamma", "beta"}
    assert decayed == {"embeddings", "kernel"}
