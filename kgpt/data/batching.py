"""Length-bucketed batches of encoded task examples: compute on real tokens, not on padding.

A split is kept as its real tokens only (`EncodedSplit`: one flat int32 array
and the offsets of every view), never as a padded `[examples, views, length]`
array. Each training epoch:

1. the examples are shuffled (from the seed and the epoch number, so a run is
   reproducible) and cut into pools of `POOL_BATCHES` batches;
2. each pool is sorted by length and cut into batches, so a batch holds
   examples of similar length;
3. the batches are shuffled across pools;
4. each batch is padded to its longest view, rounded up to one of a fixed
   set of lengths (`bucket_length`: multiples of 4 up to 64, then 8 steps
   per doubling), never one shape per batch.

Where every padded length costs a compilation (XLA: JAX, or TensorFlow with
`jit_compile`), the plan knows what compiling costs (`length_plan`): a
compilation is worth some number of steps (`compile_batches`: measured in
the run on JAX, `kgpt.train.compile_cost`; `COMPILE_BATCHES` where it is
not), compiling may take at most `COMPILE_SHARE` of the run
(`max_lengths_for`), and within that the plan
keeps the few lengths, read from the split's length histogram, that make
compiling plus computing the padded batches cheapest. A row padded to `L`
costs `row_cost(L, attention_length)`: `L` positions, plus attention's
scores, which grow with `L` squared. The lengths are a fixed
set per split, each compiled once and reused by every epoch (and by the next
run, through the persistent compilation cache: `kgpt.jobs.run`).

Evaluation batches are sorted by length and the predictions put back in the
split's order. Only the last pool of an epoch can give a partial batch.
"""

import array
import bisect
import collections
import dataclasses
import functools
import hashlib
import math

import numpy as np

from kgpt import checks
from kgpt.errors import DataError

POOL_BATCHES = 100  # batches per length-sorted pool: larger packs tighter, smaller shuffles more
# With compilation, where the run does not measure it: one XLA compilation of a task model's train step takes
# about as long as this many of its steps (the 2 x 64 model with GPT-1's vocabulary on JAX on a CPU,
# docs/performance.md). Compiling may take at most COMPILE_SHARE of a run.
COMPILE_BATCHES = 8
COMPILE_SHARE = 0.25


def bucket_length(length, limit=None):
    """The padded length of a batch whose longest view has `length` tokens.

    Multiples of 4 up to 64; above, 8 lengths per doubling (multiples of 8 to
    128, of 16 to 256, of 32 to 512, ...), so rounding up wastes at most 1/8
    beyond 32 tokens and a 512-token model sees at most 40 shapes. Never
    above `limit`.

    Example:
    ```python
    [bucket_length(n) for n in (3, 39, 65, 130, 300)]  # [4, 40, 72, 144, 320]
    ```
    """
    granule = max(4, 1 << max(0, (int(length) - 1).bit_length() - 4))
    padded = -(-int(length) // granule) * granule
    return padded if limit is None else min(padded, max(int(limit), int(length)))


@dataclasses.dataclass
class EncodedSplit:
    """A split as real tokens: every example's views, concatenated, with what happened to its rows.

    Attributes:
        name: the split's name.
        tokens: int32 `[total tokens]`, every view of every example in order.
        offsets: int64 `[examples * num_views + 1]`: view `v` of example `i`
            is `tokens[offsets[i * num_views + v]:offsets[i * num_views + v + 1]]`.
        num_views: views per example.
        targets: the head's targets `[examples]`, or None when unlabeled.
        uids: the dataset's id of each example (else its `file:line`).
        counts: read, used, skipped (+ reasons), truncated, tokens_cut.
        limit: the longest a view may be (the preprocessor's `max_length`).
    """

    name: str
    tokens: np.ndarray
    offsets: np.ndarray
    num_views: int
    targets: np.ndarray | None
    uids: list
    counts: dict
    limit: int | None = None

    def __len__(self):
        return (len(self.offsets) - 1) // self.num_views

    @functools.cached_property
    def fingerprint(self):
        """A hash of the tokens and targets: the same examples, encoded the same way, give the same one. A checkpoint
        is refused when the training split's changed, every process checks it reads what process 0 reads, and a
        rerun that scores another dev split says so."""
        digest = hashlib.sha256()
        for values in (self.tokens, self.offsets, self.targets):
            if values is not None:
                digest.update(np.ascontiguousarray(values).tobytes())
        return digest.hexdigest()[:16]

    @functools.cached_property
    def view_lengths(self):
        """`[examples, num_views]` real tokens per view."""
        return np.diff(self.offsets).reshape(-1, self.num_views)

    @functools.cached_property
    def lengths(self):
        """`[examples]` the longest view of each example."""
        return self.view_lengths.max(axis=1)

    @functools.cached_property
    def starts(self):
        """`[examples, num_views]` where each view starts in `tokens`."""
        return self.offsets[:-1].reshape(-1, self.num_views)

    def padded_length(self, indices, plan=None):
        """The length a batch of these examples is padded to: its bucket length, or the next in `plan`."""
        length = bucket_length(self.lengths[np.asarray(indices)].max(), self.limit)
        if plan is None:
            return length
        return plan[min(bisect.bisect_left(plan, length), len(plan) - 1)]  # the last is the split's longest

    def inputs(self, indices, length=None):
        """`{"token_ids", "padding_mask"}` `[len(indices), num_views, length]` for these examples, right-padded.

        `length` defaults to the bucket length of their longest view.
        """
        indices = np.asarray(indices)
        lengths = self.view_lengths[indices]  # [B, K]
        if length is None:
            length = bucket_length(lengths.max(), self.limit)
        token_ids = np.zeros((len(indices), self.num_views, length), "int32")
        starts = self.starts[indices]
        for row in range(len(indices)):
            for view in range(self.num_views):
                n, start = lengths[row, view], starts[row, view]
                token_ids[row, view, :n] = self.tokens[start : start + n]
        padding_mask = (np.arange(length) < lengths[..., None]).astype("int32")
        return {"token_ids": token_ids, "padding_mask": padding_mask}

    def batch(self, indices, lm=True, targets=True, plan=None, length=None, real=None):
        """One training batch `(x, y, sample_weight)` for `GPTTaskModel`, or `x` alone without targets.

        `y = {"task": targets, "lm": next tokens}` and the LM's sample weight
        is 1 on real next tokens only (the auxiliary loss ignores padding).
        Padded to `length`, default `padded_length(indices, plan)`. `real`, a
        boolean per row, marks the rows that count: the others (filling a
        batch to split evenly over devices) weigh 0 in every loss.
        """
        x = self.inputs(indices, length or self.padded_length(indices, plan))
        if not targets:
            return x
        if self.targets is None:
            raise DataError(f"Split {self.name!r} has no labels to train or evaluate on.")
        y = {"task": self.targets[np.asarray(indices)]}
        counts = np.ones(len(indices), "float32") if real is None else np.asarray(real, "float32")
        sample_weight = {"task": counts}
        if lm:
            y["lm"] = x["token_ids"][..., 1:]
            sample_weight["lm"] = x["padding_mask"][..., 1:].astype("float32") * counts[:, None, None]
        return x, y, sample_weight

    def real_share(self, batches, plan=None):
        """Real tokens / computed positions when the split is fed as `batches` (lists of indices)."""
        computed = sum(len(b) * self.num_views * self.padded_length(b, plan) for b in batches)
        return float(self.view_lengths.sum() / max(computed, 1))

    def padded_share(self):
        """Real tokens / computed positions when every example is padded to the split's longest view."""
        view_lengths = self.view_lengths
        return float(view_lengths.sum() / max(view_lengths.size * view_lengths.max(), 1))


class SplitBuilder:
    """Collects encoded examples into an `EncodedSplit` without padding them.

    Example:
    ```python
    builder = SplitBuilder("dev", num_views=1)
    builder.add([[5, 6, 7]], target=1, uid="dev.tsv:2")
    split = builder.build(counts={"read": 1})
    ```
    """

    def __init__(self, name, num_views, limit=None):
        self.name, self.num_views, self.limit = name, num_views, limit
        self.tokens = array.array("i")
        self.offsets = array.array("q", [0])
        self.targets, self.uids = [], []

    def add(self, views, target=None, uid=""):
        if len(views) != self.num_views:
            raise ValueError(f"Expected {self.num_views} views, got {len(views)}.")
        for view in views:
            self.tokens.extend(view)
            self.offsets.append(len(self.tokens))
        self.targets.append(target)
        self.uids.append(uid)

    def build(self, counts=None, target_dtype="int32"):
        labelled = [t is not None for t in self.targets]
        if any(labelled) and not all(labelled):
            first = labelled.index(False)
            raise DataError(f"{self.uids[first]}: unlabeled example in the labeled split {self.name!r}.")
        targets = np.asarray(self.targets, target_dtype) if labelled and all(labelled) else None
        return EncodedSplit(
            self.name,
            np.frombuffer(self.tokens, "int32").copy(),
            np.frombuffer(self.offsets, "int64").copy(),
            self.num_views,
            targets,
            list(self.uids),
            dict(counts or {}),
            self.limit,
        )


def batch_indices(lengths, batch_size, seed=None, epoch=0, pool_batches=POOL_BATCHES):
    """Lists of example indices, one per batch.

    With a `seed`: shuffled pools of `pool_batches` batches, each sorted by
    length, cut into batches, and the batches shuffled; the order depends on
    `(seed, epoch)` only. Without: sorted by length (evaluation), ties in
    split order.

    Example:
    ```python
    batch_indices(np.array([5, 1, 9, 2]), 2)  # [array([1, 3]), array([0, 2])]
    ```
    """
    lengths = np.asarray(lengths)
    batch_size = checks.batch_size(batch_size, allow_none=False)
    if seed is None:
        order = np.argsort(lengths, kind="stable")
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    rng = np.random.default_rng([int(seed), int(epoch)])
    permutation = rng.permutation(len(lengths))
    pool = pool_batches * batch_size
    batches = []
    for start in range(0, len(permutation), pool):
        chunk = permutation[start : start + pool]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def row_cost(length, attention_length=None):
    """What one row padded to `length` costs a step, in positions: `length * (1 + length / attention_length)`.

    A row's work is per position (its matmuls, the LM head) plus
    attention's `[heads, length, length]` scores, softmax and dropout masks,
    per position and per position it attends to; `attention_length` is the
    length at which the two are equal (`kgpt.train.compile_cost.attention_length`).
    None: positions alone (the cost plans had before it was measured).

    Example:
    ```python
    row_cost(128, attention_length=128)  # 256.0: twice the positions' own cost
    ```
    """
    return length if not attention_length else length * (1 + length / attention_length)


def max_lengths_for(jit_compile, num_batches, epochs=1, compile_batches=COMPILE_BATCHES, dearest=1.0):
    """How many padded lengths a feed of `num_batches` batches per epoch, for `epochs`, may use (None: no limit).

    Without compilation (TensorFlow's default on a CPU) a new length costs
    nothing; with it (JAX, XLA) each costs one compilation of about
    `compile_batches` average batches, and all of them together at most
    `COMPILE_SHARE` of the run (compiling and `epochs` epochs of steps). A
    run's step costs at most `dearest` average batches (`dearest_batch`; 1:
    the run of every batch at its own bucket length, a bound every plan
    keeps), so this many is an upper bound: `length_plan` keeps each plan's
    compiling within the share of its own run.
    """
    if not jit_compile:
        return None
    return max(
        1,
        int(
            COMPILE_SHARE
            / (1 - COMPILE_SHARE)
            * num_batches
            * max(1, epochs)
            * max(dearest, 1.0)
            / max(compile_batches, 1)
        ),
    )


def max_lengths_of(jit_compile, split, batch_size, epochs=1, compile_batches=COMPILE_BATCHES, attention_length=None):
    """`max_lengths_for` a feed of `split` in batches of `batch_size`, its dearest batch priced by `row_cost`."""
    dearest = dearest_batch(split.lengths, batch_size, split.limit, attention_length)
    return max_lengths_for(jit_compile, math.ceil(len(split) / batch_size), epochs, compile_batches, dearest)


def dearest_batch(lengths, batch_size, limit=None, attention_length=None):
    """A batch of the longest rows padded to the longest, in average batches (at their bucket lengths).

    1 where a row's cost is its positions (`attention_length` None): plans
    made before attention was priced keep the budget they had.
    """
    if not attention_length:
        return 1.0
    lengths = np.asarray(lengths)
    batches = batch_indices(lengths, batch_size)
    average = sum(len(b) * row_cost(bucket_length(lengths[b].max(), limit), attention_length) for b in batches) / len(
        batches
    )
    return min(batch_size, len(lengths)) * row_cost(int(lengths.max()), attention_length) / max(average, 1e-9)


def compile_batches(compile_seconds, step_seconds, step_rows, step_length, split, batch_size, attention_length=None):
    """A compilation measured against a step of `step_rows` rows of `step_length`, in average batches of `split`.

    An average batch is one of `split`'s length-sorted batches at its
    bucket length; a step's time is taken to grow as its rows'
    `row_cost(length, attention_length)`. The figure is rounded to a power
    of 2 (at least 1), so that small timing noise does not change the plan,
    and so the programs, between runs (a heavily loaded machine still can).

    Example:
    ```python
    compile_batches(30.0, 0.5, 32, 256, split, 32)  # 60 steps of 32 x 256: 128 if the average batch is 32 x 128
    ```
    """
    batches = batch_indices(split.lengths, batch_size)
    average = sum(len(b) * split.num_views * row_cost(split.padded_length(b), attention_length) for b in batches) / len(
        batches
    )
    step_cost = step_rows * split.num_views * row_cost(step_length, attention_length)
    steps = compile_seconds / max(step_seconds, 1e-9) * step_cost / max(average, 1)
    return 2 ** max(0, round(math.log2(max(steps, 1))))


def length_plan(
    lengths,
    batch_size,
    seed=None,
    limit=None,
    max_lengths=None,
    compile_batches=COMPILE_BATCHES,
    epochs=1,
    attention_length=None,
):
    """The padded lengths a feed's batches are rounded up to, at most `max_lengths` of them.

    Takes the bucket lengths an epoch's batches need (epoch 0's order with a
    `seed`, the length-sorted order without): all of them when `max_lengths`
    is None (nothing compiles). Otherwise the plan with at most `max_lengths`
    lengths, the longest always among them, whose estimated run time is
    least: each length costs `compile_batches` average batches (its
    compilation, once), and each epoch (`epochs`) every batch costs its rows'
    `row_cost(padded length, attention_length)`; a plan of several lengths
    spends at most `COMPILE_SHARE` of its own estimated run compiling. An
    exact dynamic program over the few dozen bucket lengths
    (`compile_batches=0`: the plan of `max_lengths` lengths that computes
    least).
    The longest is the split's longest view itself, not rounded up (it is
    the one length every plan has). A later epoch's batch rounds up to the
    next kept length.

    Example:
    ```python
    length_plan(np.array([5, 6, 30, 31]), 1, max_lengths=2)  # (8, 31)
    ```
    """
    rows = collections.Counter()
    lengths = np.asarray(lengths)
    top = bucket_length(lengths.max(), limit)
    batches = batch_indices(lengths, batch_size, seed, 0)
    for batch in batches:
        length = bucket_length(lengths[batch].max(), limit)
        rows[int(lengths.max()) if length == top else length] += len(batch)
    needed = sorted(rows)
    if max_lengths is None:
        return tuple(needed)
    # cost[s][j]: the least cost of the batches of needed[:j + 1] with s lengths, the last needed[j]; the rows of
    # needed[i..j] all padded to needed[j] cost span[i][j].
    count = len(needed)
    most = min(max_lengths, count)
    price = [row_cost(n, attention_length) for n in needed]
    below = np.concatenate([[0], np.cumsum([rows[n] for n in needed])])  # rows of needed[:i]
    span = [[(below[j + 1] - below[i]) * price[j] for j in range(count)] for i in range(count)]
    cost = [[math.inf] * count for _ in range(most + 1)]
    back = [[-1] * count for _ in range(most + 1)]
    for j in range(count):
        cost[1][j] = span[0][j]
    for s in range(2, most + 1):
        for j in range(count):
            for i in range(j):
                if cost[s - 1][i] + span[i + 1][j] < cost[s][j]:
                    cost[s][j], back[s][j] = cost[s - 1][i] + span[i + 1][j], i
    # A compilation in the same units: `compile_batches` batches of the average cost of a batch.
    per_batch = sum(rows[n] * p for n, p in zip(needed, price)) / len(batches)
    compiling = [s * compile_batches * per_batch for s in range(1, most + 1)]
    total = [max(1, epochs) * cost[s][count - 1] + compiling[s - 1] for s in range(1, most + 1)]
    # One length is always allowed (the longest); more only while their compilations stay within the share.
    total = [t if s == 1 or compiling[s - 1] <= COMPILE_SHARE * t else math.inf for s, t in enumerate(total, 1)]
    s = 1 + int(np.argmin(total))  # the fewest lengths among equally cheap plans
    kept, j = [], count - 1
    while j >= 0:
        kept.append(needed[j])
        j, s = back[s][j], s - 1
    return tuple(sorted(kept))


def filled(indices, multiple):
    """`(rows, real)`: `indices` with copies of its first row appended up to a multiple of `multiple`, and how
    many of them are real. A batch split over devices must split evenly; the copies weigh 0 (`EncodedSplit.batch`)
    and their predictions are dropped."""
    indices = np.asarray(indices)
    extra = -len(indices) % multiple
    return (np.concatenate([indices, np.repeat(indices[:1], extra)]) if extra else indices), len(indices)


def dataset(
    split,
    batch_size,
    seed=None,
    lm=True,
    targets=True,
    first_epoch=0,
    max_lengths=None,
    skip=0,
    shards=(0, 1, 1),
    pad_to=1,
    micro_batches=1,
    epochs=1,
    compile_batches=COMPILE_BATCHES,
    attention_length=None,
):
    """A `tf.data.Dataset` of length-bucketed batches of `split` (see `EncodedSplit.batch`).

    With a `seed`, every complete pass over the dataset (every Keras epoch)
    draws the next epoch's order: epoch `first_epoch`, then `first_epoch +
    1`, ... A pass left unfinished (Keras reads one batch to build the model
    before the first epoch) does not count. Without a seed, batches come
    sorted by length, the same on every pass. Batches are padded to the
    lengths of `length_plan(..., max_lengths, compile_batches, epochs, attention_length)`
    (`epochs`: how many passes its compilations serve). `skip` leaves out the first
    batches of epoch `first_epoch` (a run resumed mid-epoch); the dataset
    then holds the rest of that epoch only.

    For several devices and processes (`kgpt.parallel.distribute.feed`): each
    batch is filled to a multiple of `pad_to` x `micro_batches` rows (`filled`),
    cut into `micro_batches` consecutive micro-batches (gradient accumulation),
    and of each only the rows of batch shards `shards = (first, stop, total)`
    are kept. Every process and micro-batch of a batch gets the batch's
    padded length, so the batches are the same whatever the slicing.
    """
    import tensorflow as tf

    views = split.num_views
    ids = tf.TensorSpec((None, views, None), tf.int32)
    x_spec = {"token_ids": ids, "padding_mask": ids}
    if targets:
        target_dtype = tf.float32 if split.targets is not None and split.targets.dtype.kind == "f" else tf.int32
        y_spec = {"task": tf.TensorSpec((None,), target_dtype)}
        w_spec = {"task": tf.TensorSpec((None,), tf.float32)}
        if lm:
            y_spec["lm"] = tf.TensorSpec((None, views, None), tf.int32)
            w_spec["lm"] = tf.TensorSpec((None, views, None), tf.float32)
        signature = (x_spec, y_spec, w_spec)
    else:
        signature = x_spec
    epoch = [first_epoch]
    num_batches = math.ceil(len(split) / batch_size)  # the same count in every order
    if not 0 <= skip < num_batches:
        raise ValueError(f"skip must be in 0..{num_batches - 1} (batches per epoch), got {skip}.")
    plan = length_plan(
        split.lengths, batch_size, seed, split.limit, max_lengths, compile_batches, epochs, attention_length
    )
    first, stop, total = shards

    def generate():
        order = batch_indices(split.lengths, batch_size, seed, epoch[0])
        for i, indices in enumerate(order):
            if i < skip:
                continue
            if seed is not None and i == len(order) - 1:
                epoch[0] += 1  # the pass reached its last batch: the next one is the next epoch
            rows, real = filled(indices, pad_to * micro_batches)
            length = split.padded_length(indices, plan)
            size = len(rows) // micro_batches
            begin, end = size * first // total, size * stop // total
            for j in range(micro_batches):
                at = np.arange(j * size + begin, j * size + end)
                yield split.batch(rows[at], lm=lm, targets=targets, length=length, real=at < real)

    data = tf.data.Dataset.from_generator(generate, output_signature=signature)
    return data.apply(tf.data.experimental.assert_cardinality((num_batches - skip) * micro_batches)).prefetch(2)


def predict_outputs(predictor, split, batch_size, verbose=0, feed=None, pad_to=1):
    """`predictor`'s outputs for every example of `split`, in the split's order (batches sorted by length).

    With a compiling predictor, as few padded lengths as `max_lengths_for`
    allows. `verbose` is Keras' (1: a progress bar). With several devices
    or processes (`kgpt.parallel.distribute.predict_outputs`), `feed` turns a
    builder of a process's rows into the dataset and batches are filled to
    a multiple of `pad_to` rows, whose extra outputs are dropped here.
    """
    batches = batch_indices(split.lengths, batch_size)
    max_lengths = max_lengths_for(getattr(predictor, "jit_compile", False), math.ceil(len(split) / batch_size))

    def make(first, stop, total):
        return dataset(
            split, batch_size, targets=False, max_lengths=max_lengths, shards=(first, stop, total), pad_to=pad_to
        )

    outputs = predictor.predict(feed(make) if feed else make(0, 1, 1), verbose=verbose)
    kept = np.concatenate([np.arange(len(filled(b, pad_to)[0])) < len(b) for b in batches])
    if len(kept) != len(outputs):
        raise ValueError(
            f"The predictor gave {len(outputs)} rows for {len(kept)} (filled batches of {len(split)} examples)."
        )
    result = np.empty_like(outputs[kept])
    result[np.concatenate(batches)] = outputs[kept]
    return result
