"""The token stream `benchmarks/reference_efficiency.py` feeds every implementation (the part without torch)."""

import importlib.util
import pathlib

import numpy as np
import pytest

from kgpt.jobs.pretrain import validation_windows as kgpt_validation_windows

SCRIPT = pathlib.Path(__file__).parent.parent / "benchmarks" / "reference_efficiency.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("reference_efficiency", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_windows_tile_the_stream(bench):
    tokens = np.arange(23)
    windows = bench.training_windows(tokens, 5)
    # Each window's inputs start where the last one's ended; its last token is the next one's first.
    assert windows.tolist() == [
        [0, 1, 2, 3, 4, 5],
        [5, 6, 7, 8, 9, 10],
        [10, 11, 12, 13, 14, 15],
        [15, 16, 17, 18, 19, 20],
    ]
    assert windows.dtype == np.int32
    with pytest.raises(ValueError, match="no window"):
        bench.training_windows(np.arange(5), 5)


def test_validation_windows_are_kgpt_trains(bench):
    tokens = np.arange(100, 141)
    x, y, _ = kgpt_validation_windows(tokens, 8)
    windows = bench.validation_windows(tokens, 8)
    np.testing.assert_array_equal(windows[:, :-1], x["token_ids"])
    np.testing.assert_array_equal(windows[:, 1:], y)


def test_batch_order_is_seeded_permutations_end_to_end(bench):
    order = bench.batch_order(7, 17, seed=3)
    assert len(order) == 17
    assert sorted(order[:7]) == list(range(7)) and sorted(order[7:14]) == list(range(7))
    assert set(order[14:]) <= set(range(7)) and len(set(order[14:])) == 3
    np.testing.assert_array_equal(order, bench.batch_order(7, 17, seed=3))
    assert not np.array_equal(order, bench.batch_order(7, 17, seed=4))


def test_evaluation_steps(bench):
    assert bench.evaluation_steps(240, 8) == [0, 30, 60, 90, 120, 150, 180, 210, 240]
    assert bench.evaluation_steps(10, 3) == [0, 3, 7, 10]
    with pytest.raises(ValueError):
        bench.evaluation_steps(5, 6)


def test_batches_read_the_saved_order(bench, tmp_path):
    windows = np.arange(40, dtype=np.int32).reshape(10, 4)
    np.save(tmp_path / "train_windows.npy", windows)
    np.save(tmp_path / "order.npy", np.array([9, 2, 5, 0, 7, 1]))
    bench.write_json(str(tmp_path / "config.json"), {"batch_size": 2})
    np.testing.assert_array_equal(bench.batches(str(tmp_path), 1, 3), windows[[5, 0, 7, 1]])


def test_unigram_loss(bench):
    # Counts + 1 over a vocabulary of 4: token 0 seen 3 times -> 4/8, token 3 never -> 1/8.
    loss = bench.unigram_loss(np.array([0, 0, 0, 1]), np.array([0, 3]), 4)
    assert loss == pytest.approx(-(np.log(4 / 8) + np.log(1 / 8)) / 2)


def _curve(losses):
    return {
        "curve": [{"step": 50 * i, "val_loss": v} for i, v in enumerate(losses)],
        "tokens_per_s": 1000.0,
        "steps_per_s": 1.0,
        "train_seconds": 1.0,
        "wall_seconds": 2.0,
        "versions": "test",
    }


def test_table_of_kgpt_runs_alone_and_beside_the_reference(bench, tmp_path, capsys):
    bench.write_json(str(tmp_path / "config.json"), {"unigram_val_loss": 7.0})
    curves = {("kgpt-jax", 1): [9.0, 7.5], ("kgpt-tensorflow", 1): [9.0, 7.4], ("reference", 0): [9.1, 7.45]}
    for (name, seed), losses in curves.items():
        bench.write_json(str(tmp_path / f"curve_{name}_seed{seed}.json"), _curve(losses))
    # Without a reference run there is nothing to compare: the curves alone, no verdict.
    assert bench.table(str(tmp_path), [("kgpt-jax", 1), ("kgpt-tensorflow", 1)], 0.05)
    assert "| 50 | 7.5000 | 7.4000 |" in capsys.readouterr().out
    assert not bench.table(str(tmp_path), list(curves), 0.05)  # both start 0.1 below the reference
    out = capsys.readouterr().out
    assert "kgpt-jax vs ref s0: largest |difference| 0.1000 nats" in out and "MISSES" in out
    assert "kgpt-tensorflow vs ref s0: largest |difference| 0.1000 nats" in out


def test_several_seeds_compare_means_and_report_only_reads_runs_of_the_saved_settings(bench, tmp_path, capsys):
    settings = {"unigram_val_loss": 7.0, "max_steps": 50}
    bench.write_json(str(tmp_path / "config.json"), settings)
    curves = {
        ("kgpt-tensorflow", 0): [9.0, 7.50],
        ("kgpt-tensorflow", 1): [9.0, 7.40],
        ("reference", 0): [9.1, 7.40],
        ("reference", 1): [9.1, 7.44],
    }
    for (name, seed), losses in curves.items():
        bench.write_json(
            str(tmp_path / f"curve_{name}_seed{seed}.json"),
            {**_curve(losses), "implementation": name, "seed": seed, "settings": settings},
        )
    # A run with other settings, and one from before curves recorded theirs: both left out, and said.
    bench.write_json(
        str(tmp_path / "curve_kgpt-jax_seed0.json"),
        {**_curve([1.0, 1.0]), "implementation": "kgpt-jax", "seed": 0, "settings": {"max_steps": 9}},
    )
    bench.write_json(str(tmp_path / "curve_kgpt-jax_seed1.json"), _curve([1.0, 1.0]))
    bench.write_json(str(tmp_path / "config.json"), {**settings, "reference_threads": 3})  # speed only: kept
    runs = bench.saved_runs(str(tmp_path))
    assert runs == list(curves)
    assert "Left out 2 curve(s)" in capsys.readouterr().out
    # Means 9.0 / 7.45 against 9.1 / 7.42: the first evaluation is 0.1 apart, run against run or not.
    assert not bench.table(str(tmp_path), runs, 0.05)
    out = capsys.readouterr().out
    assert "| 50 | 7.4500 (0.0707) | 7.4200 (0.0283) | +0.0300 +- 0.0539 |" in out
    assert "kgpt-tensorflow (mean of 2) vs the reference (mean of 2): largest |difference| 0.1000 nats (step 0)" in out
    assert "MISSES" in out and "s0 - ref s0" not in out  # no run-against-run differences
    assert bench.table(str(tmp_path), runs, 0.11)


def test_initial_table_compares_the_untrained_losses_means(bench, tmp_path, capsys):
    for name, losses in {"kgpt-jax": [9.5, 9.7], "reference": [9.4, 9.6, 9.5]}.items():
        bench.write_json(str(tmp_path / f"initial_{name}.json"), {"implementation": name, "losses": losses})
    bench.initial_table(str(tmp_path), ["kgpt-jax", "reference"])
    out = capsys.readouterr().out
    # Means 9.6 and 9.5; sds 0.1414 and 0.1; standard error sqrt(0.02 / 2 + 0.01 / 3) = 0.1155.
    assert "| kgpt-jax | 2 | 9.6000 | 0.1414 | +0.1000 +- 0.1155 |" in out
    assert "| reference | 3 | 9.5000 | 0.1000 |  |" in out
