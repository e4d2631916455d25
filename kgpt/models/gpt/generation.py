"""`GPTCausalLM.generate`'s parts: prompts checked and packed, the compiled step, the outputs.

Token-id prompts never go through the preprocessor (keras-hub's `generate`
would run it, and detaching it for a call would race with other threads'
calls on text). The compiled generate function is made once per model under a
lock, and a sampler that draws random numbers runs one call at a time (see
`run_compiled`), so one model generates from many threads as it would from one.
"""

import contextlib
import numbers
import threading

import keras
import numpy as np
from keras import ops

from kgpt import checks
from kgpt.models.gpt.causal_lm_inputs import check_length

# keras-hub's make_generate_function sets `generate_function` to the plain step before it compiles it:
# a second thread must not pick up that half-made state.
MAKE_FUNCTION_LOCK = threading.Lock()
# Held while a sampler that draws random numbers generates (see `one_draw_at_a_time`).
_SAMPLER_STATE_LOCK = threading.Lock()


def one_draw_at_a_time(lm, generate_function):
    """`generate_function`, run under a lock when `lm`'s sampler has a random state, and on JAX never
    beside a Keras loop (`kgpt.checks.one_loop_at_a_time`: the loop detaches the variables'
    values, which keras-hub reads before each compiled call).

    A random sampler (top-k, top-p, random) keeps its seed in a variable that
    each call reads and advances: on JAX keras-hub reads it before the
    compiled call and writes it back after, so two threads at once would draw
    the same numbers and one advance would be lost; on TensorFlow the steps of
    two calls would take turns drawing from it. One call at a time gives each
    call the draws it would get from a single thread. Greedy, beam and
    contrastive search hold no state and run concurrently on TensorFlow.
    """
    sampler_lock = _SAMPLER_STATE_LOCK if lm.sampler.variables else contextlib.nullcontext()

    def locked(inputs, stop_token_ids=None):
        with checks.one_loop_at_a_time(), sampler_lock:
            return generate_function(inputs, stop_token_ids=stop_token_ids)

    return locked

def generate_ids(lm, inputs, stop_token_ids, strip_prompt):
    """keras-hub's generate() passes for packed token ids, without the preprocessor: compiled
    generation, then the prompt rolled to the end of each row when `strip_prompt`."""
    generate_function = lm.make_generate_function()
    distribution = keras.distribution.distribution()
    feed = dict(inputs)
    if distribution is not None:
        for key, value in feed.items():
            value = ops.convert_to_tensor(value)
            layout = distribution.get_data_layout(value.shape)
            feed[key] = keras.distribution.distribute_tensor(value, layout) if layout else value
    outputs = generate_function(feed, stop_token_ids=stop_token_ids)
    token_ids = np.asarray(ops.convert_to_numpy(outputs["token_ids"]))
    mask = np.asarray(ops.convert_to_numpy(outputs["padding_mask"])).astype(bool)
    if strip_prompt:
        prompt = np.asarray(inputs["padding_mask"]).astype(bool)
        shifts = -prompt.sum(axis=-1)
        token_ids = np.stack([np.roll(row, n) for row, n in zip(token_ids, shifts)])
        mask = np.stack([np.roll(m, n) ^ np.roll(p, n) for m, p, n in zip(mask, prompt, shifts)])
    return {"token_ids": token_ids, "padding_mask": mask}


def check_stop_token_ids(lm, stop_token_ids):
    """`stop_token_ids` as a tuple of ids in the vocabulary (or None); one id is a list of one."""
    if stop_token_ids is None:
        return None
    if isinstance(stop_token_ids, numbers.Integral) and not isinstance(stop_token_ids, bool):
        stop_token_ids = [stop_token_ids]
    if isinstance(stop_token_ids, (str, bytes)) or not isinstance(stop_token_ids, (list, tuple, np.ndarray)):
        raise TypeError(f"stop_token_ids must be None or a list of token ids, got {stop_token_ids!r}.")
    vocabulary = lm.backbone.vocabulary_size
    return tuple(checks.positive_int(t, "each of stop_token_ids", minimum=0, maximum=vocabulary - 1)
                 for t in stop_token_ids)


def check_packed_prompts(lm, inputs, max_length):
    """keras-hub's dict of right-padded prompts, checked: ids in the vocabulary, room to generate."""
    missing = {"token_ids", "padding_mask"} - set(inputs)
    if missing:
        raise ValueError(f"generate() on a dict needs the keys 'token_ids' and 'padding_mask' "
                         f"(right-padded prompts); missing {sorted(missing)}.")
    ids = checks.token_ids(inputs["token_ids"], "token_ids", lm.backbone.vocabulary_size)
    mask = checks.padding_mask(inputs["padding_mask"], "padding_mask", ids.shape)
    if max_length is not None and max_length != ids.shape[1]:
        raise ValueError(f"max_length={max_length}, but the token_ids are padded to {ids.shape[1]}: the "
                         f"padded width is the generated length. Pad them to {max_length}, or leave out "
                         f"max_length.")
    check_length(lm, ids.shape[1])
    _check_room(mask.sum(axis=-1), ids.shape[1])
    return {"token_ids": ids, "padding_mask": mask}


def pack_prompts(lm, prompts, max_length):
    """A list of token-id prompts, checked and right-padded to `max_length` (default: the model's context)."""
    if isinstance(prompts, np.ndarray):
        prompts = list(prompts)
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"generate() takes a prompt string, a list of them, a list of token-id lists or a "
                        f"dict of padded arrays; got {type(prompts).__name__}.")
    if not prompts:
        raise ValueError("generate() got no prompts.")
    if any(isinstance(p, (str, bytes)) for p in prompts):
        raise TypeError("generate() got a list that mixes strings with token ids: pass all prompts as text, "
                        "or all as lists of token ids.")
    if not all(isinstance(p, (list, tuple, np.ndarray)) for p in prompts):
        raise TypeError("generate() takes token ids as a list of prompts, each a list of ids (e.g. "
                        "[[5, 6, 7]]), not a flat list of numbers.")
    prompts = [checks.token_ids([list(p)], f"prompt {i}", lm.backbone.vocabulary_size)[0]
               for i, p in enumerate(prompts)]
    if max_length is None:
        max_length = lm.backbone.max_sequence_length
    check_length(lm, max_length)
    _check_room(np.array([len(p) for p in prompts]), max_length)
    token_ids = np.zeros((len(prompts), max_length), "int32")
    # Boolean, as the text preprocessor gives it: text and id prompts of
    # one shape then share one compiled generate function.
    padding_mask = np.zeros((len(prompts), max_length), "bool")
    for row, prompt in enumerate(prompts):
        token_ids[row, : len(prompt)] = prompt
        padding_mask[row, : len(prompt)] = 1
    return {"token_ids": token_ids, "padding_mask": padding_mask}


def generate_step(lm, inputs, stop_token_ids=None):
    """One compiled generation pass over a batch (see keras-hub CausalLM)."""
    token_ids, padding_mask = inputs["token_ids"], inputs["padding_mask"]
    # Generation starts where the shortest prompt ends; longer prompts keep
    # their own tokens (the sampler only writes where the mask is 0).
    index = ops.min(ops.sum(ops.cast(padding_mask, "int32"), axis=-1))

    if lm.backbone.supports_cache:
        hidden_states, cache = lm._build_cache(token_ids)

        def step(prompt, cache, index):
            batch_size = ops.shape(prompt)[0]
            current = ops.slice(prompt, [0, index - 1], [batch_size, 1])
            logits, hidden, cache = lm.call_with_cache(current, cache, index - 1)
            return ops.squeeze(logits, 1), ops.squeeze(hidden, 1), cache
    else:
        # Backbones without a key/value cache (the LSTM ablation) rerun the
        # whole sequence each step: quadratic, fine for samples.
        mask = ops.ones_like(token_ids)
        hidden_states = lm.backbone({"token_ids": token_ids, "padding_mask": mask})
        cache = ops.zeros((1,), dtype=lm.compute_dtype)

        def step(prompt, cache, index):
            hidden = lm.backbone({"token_ids": prompt, "padding_mask": mask})
            hidden = ops.take(hidden, index - 1, axis=1)  # [B, H]
            logits = lm.backbone.token_embedding(hidden, reverse=True)
            return logits, hidden, cache

    token_ids = lm.sampler(
        next=step,
        prompt=token_ids,
        cache=cache,
        index=index,
        mask=padding_mask,
        stop_token_ids=stop_token_ids,
        hidden_states=hidden_states,
        model=lm,
    )
    if stop_token_ids is None:
        padding_mask = ops.ones_like(token_ids, dtype="bool")
    else:
        # Keep every generated token up to and including the first stop.
        generated = ops.logical_not(ops.cast(padding_mask, "bool"))
        is_stop = ops.zeros_like(generated)
        for stop in stop_token_ids:
            is_stop = ops.logical_or(is_stop, ops.equal(token_ids, stop))
        is_stop = ops.cast(ops.logical_and(is_stop, generated), "int32")
        stops_before = ops.cumsum(is_stop, axis=-1) - is_stop
        padding_mask = ops.equal(stops_before, 0)
    return {"token_ids": token_ids, "padding_mask": padding_mask}


def _check_room(lengths, max_length):
    """Every prompt has a token, and leaves room for one generated token within `max_length`."""
    if (lengths == 0).any():
        raise ValueError(f"generate() needs at least one token in every prompt; prompt {int(np.argmin(lengths))} "
                         f"has none.")
    if lengths.max() >= max_length:
        raise ValueError(f"Prompt {int(np.argmax(lengths))} has {int(lengths.max())} tokens, leaving no room to "
                         f"generate within max_length={max_length}.")
