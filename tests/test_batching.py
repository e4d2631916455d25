"""Length-bucketed batches: few shapes, real tokens, reproducible order, outputs unchanged by padding."""

import math

import numpy as np
import pytest

import kgpt
from kgpt.data import batching


def split_of(lengths, num_views=1, targets=True):
    builder = batching.SplitBuilder("train", num_views, limit=512)
    for i, n in enumerate(lengths):
        views = [list(range(1, n + 1)) for _ in range(num_views)]
        builder.add(views, target=i % 2 if targets else None, uid=f"row{i}")
    return builder.build({"read": len(lengths)})


def mnli_like_lengths(n=4000, seed=0):
    """View lengths drawn like MNLI's with the GPT-1 vocabulary: mean ~39, a long tail to ~230."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(mean=3.51, sigma=0.55, size=n), 8, 230).astype(int)


def test_bucket_lengths_are_few_and_tight():
    padded = {n: batching.bucket_length(n) for n in range(1, 513)}
    assert all(p >= n for n, p in padded.items())
    assert all((p - n) / n <= 1 / 8 for n, p in padded.items() if n > 32)
    assert len(set(padded.values())) <= 40
    assert [batching.bucket_length(n) for n in (3, 39, 65, 130, 300)] == [4, 40, 72, 144, 320]
    assert batching.bucket_length(300, limit=310) == 310  # never beyond the model's limit


def test_epochs_are_reproducible_shuffled_and_complete():
    lengths = mnli_like_lengths(1000)
    first = batching.batch_indices(lengths, 32, seed=7, epoch=0)
    assert [b.tolist() for b in first] == [b.tolist() for b in batching.batch_indices(lengths, 32, seed=7, epoch=0)]
    second = batching.batch_indices(lengths, 32, seed=7, epoch=1)
    assert [b.tolist() for b in first] != [b.tolist() for b in second]
    for batches in (first, second):
        assert sorted(np.concatenate(batches).tolist()) == list(range(1000))
        assert sum(len(b) < 32 for b in batches) <= 1  # only the last pool can leave a partial batch
    # Batches are not in length order: short and long ones alternate across the epoch.
    longest = [lengths[b].max() for b in first]
    assert longest != sorted(longest)


def test_real_token_share_on_realistic_lengths():
    split = split_of(mnli_like_lengths(4000))
    bucketed = split.real_share(batching.batch_indices(split.lengths, 32, seed=0))
    assert 0.9 <= bucketed <= 1.0
    assert split.padded_share() < 0.25  # what padding every example to the longest computed
    shapes = {batching.bucket_length(split.lengths[b].max()) for b in batching.batch_indices(split.lengths, 32, 0)}
    assert len(shapes) <= 30


def test_batch_inputs_and_lm_targets():
    split = split_of([3, 5], num_views=2)
    x, y, weights = split.batch([1, 0])
    assert x["token_ids"].shape == (2, 2, 8)
    np.testing.assert_array_equal(x["token_ids"][0, 0], [1, 2, 3, 4, 5, 0, 0, 0])
    np.testing.assert_array_equal(x["padding_mask"][1, 1], [1, 1, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(y["task"], [1, 0])
    np.testing.assert_array_equal(y["lm"], x["token_ids"][..., 1:])
    np.testing.assert_array_equal(weights["lm"], x["padding_mask"][..., 1:])
    assert set(split.batch([0], lm=False)[1]) == {"task"}


def test_unlabeled_mixed_with_labeled_rows_is_an_error():
    builder = batching.SplitBuilder("dev", 1)
    builder.add([[1, 2]], target=1, uid="dev.tsv:2")
    builder.add([[1, 2]], target=None, uid="dev.tsv:3")
    with pytest.raises(kgpt.DataError, match="dev.tsv:3: unlabeled example in the labeled split 'dev'"):
        builder.build()


def test_dataset_draws_a_new_order_each_epoch():
    split = split_of(list(range(4, 40)))
    data = batching.dataset(split, 8, seed=3)
    assert int(data.cardinality()) == 5

    def one_epoch():
        return [tuple(x["padding_mask"].numpy()[:, 0].sum(-1).tolist()) for x, _, _ in data]

    next(iter(data))  # Keras reads a batch to build the model: not an epoch
    first, second = one_epoch(), one_epoch()
    for epoch in (first, second):
        assert sorted(n for batch in epoch for n in batch) == list(range(4, 40))  # every example once
    assert first != second  # each pass over the dataset is the next epoch's order
    expected = [tuple(split.lengths[b].tolist()) for b in batching.batch_indices(split.lengths, 8, 3, epoch=0)]
    assert first == expected  # the first complete pass is epoch 0


def test_predictions_do_not_depend_on_batching(backbone):
    """Bucketed, length-sorted batches give each example the outputs of one padded array, in split order."""
    model = kgpt.GPTTaskModel(backbone, head=kgpt.tasks.heads.ClassificationHead(["a", "b", "c"]), num_views=1)
    rng = np.random.default_rng(0)
    builder = batching.SplitBuilder("dev", 1, limit=16)
    for n in (9, 3, 14, 5, 3, 11, 7):
        builder.add([rng.integers(1, 90, n).tolist()], target=0)
    split = builder.build()
    padded = split.inputs(np.arange(len(split)), length=16)
    expected = model.predict(padded)
    np.testing.assert_allclose(
        batching.predict_outputs(model.task_predictor(), split, 3), expected, rtol=1e-5, atol=1e-5
    )


def test_length_plan_pads_least_within_its_budget():
    """The plan's lengths are the subset (with the longest) that pads the fewest positions: checked by brute force."""
    import itertools

    lengths = mnli_like_lengths(600, seed=3)
    batches = batching.batch_indices(lengths, 16, seed=5)
    needed = sorted({batching.bucket_length(lengths[b].max()) for b in batches})
    needed[-1] = int(lengths.max())  # the longest length is the split's longest view, not its bucket
    split = split_of(lengths)

    def positions(plan):
        return sum(len(b) * split.padded_length(b, plan) for b in batches)

    for budget in (1, 2, 3, 4):
        plan = batching.length_plan(lengths, 16, seed=5, max_lengths=budget, compile_batches=0)
        assert len(plan) == budget and plan[-1] == needed[-1]
        best = min(
            positions(subset + (needed[-1],))
            for k in range(budget)
            for subset in itertools.combinations(needed[:-1], k)
        )
        assert positions(plan) == best
    assert batching.length_plan(lengths, 16, seed=5) == tuple(needed)  # no budget: every bucket length


def test_a_plan_that_prices_attention_costs_least_and_pads_long_batches_less():
    """A row padded to L costs L (1 + L / attention_length): the plan is still the cheapest (brute force), and a
    larger quadratic term (a shorter attention_length) moves its lengths up, to pad the long batches less."""
    import itertools

    lengths = mnli_like_lengths(600, seed=3)
    batches = batching.batch_indices(lengths, 16, seed=5)
    needed = sorted({batching.bucket_length(lengths[b].max()) for b in batches})
    needed[-1] = int(lengths.max())
    split = split_of(lengths)

    def cost(plan, attention):
        return sum(len(b) * batching.row_cost(split.padded_length(b, plan), attention) for b in batches)

    assert batching.row_cost(128, 128) == 256 and batching.row_cost(128) == 128
    plans = {}
    for attention in (None, 64, 16):
        for budget in (2, 3, 4):
            plan = batching.length_plan(
                lengths, 16, seed=5, max_lengths=budget, compile_batches=0, attention_length=attention
            )
            assert len(plan) == budget and plan[-1] == needed[-1]
            best = min(
                cost(subset + (needed[-1],), attention) for subset in itertools.combinations(needed[:-1], budget - 1)
            )
            assert cost(plan, attention) == pytest.approx(best)
            plans[attention, budget] = plan
    for budget in (2, 3, 4):
        by_positions, by_time = plans[None, budget], plans[16, budget]
        assert all(t >= p for t, p in zip(by_time, by_positions))
    assert plans[16, 4] != plans[None, 4]
    # With compilations to pay for, a dear attention buys more long lengths, and compiling stays within its share.
    lengths = skewed_lengths(3000)
    budget = batching.max_lengths_for(True, 94, epochs=3)  # 94 batches an epoch, 8 steps a compilation
    by_positions, by_time = (
        batching.length_plan(lengths, 32, seed=0, max_lengths=budget, epochs=3, attention_length=a) for a in (None, 30)
    )
    assert len(by_positions) <= len(by_time) <= budget and by_time[-1] == by_positions[-1] == 230
    assert sum(n >= 100 for n in by_time) > sum(n >= 100 for n in by_positions)
    compiling = len(by_time) * batching.COMPILE_BATCHES
    assert compiling <= batching.COMPILE_SHARE * (compiling + 3 * 94)


def test_each_plan_compiles_within_a_quarter_of_its_own_run(monkeypatch):
    """30 batches of 32 for 3 epochs: priced by time, long batches cost several average ones, so the budget allows
    more lengths; the plan still keeps its compilations within a quarter of its own estimated run."""
    lengths = skewed_lengths(960, seed=4)
    split = split_of(lengths)
    order = batching.batch_indices(lengths, 32, seed=0)
    plans = {}
    for attention in (None, 30):
        dearest = batching.dearest_batch(lengths, 32, attention_length=attention)
        assert dearest == 1 if attention is None else dearest > 2
        for compile_batches in (8, 16):
            budget = batching.max_lengths_for(True, 30, 3, compile_batches, dearest)
            plan = batching.length_plan(
                lengths,
                32,
                seed=0,
                max_lengths=budget,
                compile_batches=compile_batches,
                epochs=3,
                attention_length=attention,
            )
            average = sum(len(b) * batching.row_cost(split.padded_length(b), attention) for b in order) / len(order)
            steps = 3 * sum(len(b) * batching.row_cost(split.padded_length(b, plan), attention) for b in order)
            compiling = len(plan) * compile_batches * average
            assert len(plan) == 1 or compiling <= batching.COMPILE_SHARE * (compiling + steps) + 1e-6
            assert plan[-1] == 230 and len(plan) <= budget
            plans[attention, compile_batches] = plan
    assert len(plans[30, 8]) > len(plans[None, 8]) and len(plans[30, 16]) > len(plans[None, 16]) == 1
    # The share binds where the budget does not: at 32 batches a compilation, 3 lengths would make the fastest run,
    # but their compiling would exceed a quarter of it.
    unbounded = dict(max_lengths=40, compile_batches=32, epochs=3, attention_length=30)
    assert batching.length_plan(lengths, 32, seed=0, **unbounded) == (230,)
    monkeypatch.setattr(batching, "COMPILE_SHARE", 0.99)
    assert len(batching.length_plan(lengths, 32, seed=0, **unbounded)) == 3


def test_compiling_backends_spend_at_most_a_quarter_of_an_epoch_compiling():
    assert batching.max_lengths_for(False, 10_000) is None  # TensorFlow without XLA: lengths are free
    assert batching.max_lengths_for(True, 5) == 1  # a small task: one compiled program
    for batches in (17, 94, 12_272):
        lengths = batching.max_lengths_for(True, batches)
        compiling = lengths * batching.COMPILE_BATCHES
        assert compiling <= batching.COMPILE_SHARE * (compiling + batches) or lengths == 1


def skewed_lengths(n, seed=0):
    """A skewed histogram: most views short, a tail of long ones, one at the limit."""
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([rng.integers(8, 40, int(n * 0.8)), rng.integers(40, 200, n - int(n * 0.8) - 1), [230]])
    return rng.permutation(lengths)


def test_a_compile_aware_plan_keeps_few_lengths_and_most_positions_real():
    """Fine-tuning's 3 epochs in batches of 32, compiled (JAX): a handful of lengths, compiling <= 25% of the run."""
    for n, least in ((3000, 0.80), (12_000, 0.85)):  # 94 and 375 batches per epoch
        for lengths in (mnli_like_lengths(n, seed=1), skewed_lengths(n)):
            split = split_of(lengths)
            batches = math.ceil(n / 32)
            budget = batching.max_lengths_for(True, batches, epochs=3)
            plan = batching.length_plan(split.lengths, 32, seed=0, limit=512, max_lengths=budget, epochs=3)
            assert 1 < len(plan) <= budget
            compiling = len(plan) * batching.COMPILE_BATCHES
            assert compiling <= batching.COMPILE_SHARE * (compiling + 3 * batches)
            for epoch in (0, 1):  # later epochs round up to the same lengths
                order = batching.batch_indices(split.lengths, 32, seed=0, epoch=epoch)
                assert split.real_share(order, plan) >= least
    # Dearer compilations buy fewer lengths; free ones every length the budget allows.
    fewer = batching.length_plan(split.lengths, 32, seed=0, max_lengths=budget, compile_batches=40, epochs=3)
    more = batching.length_plan(split.lengths, 32, seed=0, max_lengths=budget, compile_batches=0, epochs=3)
    assert len(fewer) < len(plan) < len(more) == min(budget, len(batching.length_plan(split.lengths, 32, seed=0)))


def test_a_planned_feed_covers_every_example_exactly_once_in_its_planned_lengths():
    lengths = skewed_lengths(300, seed=2)
    builder = batching.SplitBuilder("train", 1, limit=512)
    for i, n in enumerate(lengths):
        builder.add([[i + 1] + [7] * (int(n) - 1)], target=i % 2, uid=f"row{i}")  # the first id names the example
    split = builder.build()
    plan = batching.length_plan(split.lengths, 16, seed=3, limit=512, max_lengths=3, attention_length=20)
    for epoch in (0, 1):
        seen = []
        for x, _, _ in batching.dataset(
            split, 16, seed=3, first_epoch=epoch, max_lengths=3, attention_length=20
        ).as_numpy_iterator():
            assert x["token_ids"].shape[-1] in plan
            rows = x["token_ids"][:, 0, 0] - 1
            np.testing.assert_array_equal(x["padding_mask"][:, 0].sum(-1), lengths[rows])  # nothing cut
            seen.extend(rows.tolist())
        assert sorted(seen) == list(range(len(split)))
