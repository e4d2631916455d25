"""`GPTCausalLM.score`'s log-probabilities: of the next tokens of token ids, or of each token of a text."""

import keras
import numpy as np
from keras import ops

from kgpt import checks
from kgpt.models.gpt.causal_lm_inputs import NO_PREPROCESSOR, check_length
from kgpt.models.gpt.keras_hub_scoring import keras_hub_score

try:
    import tensorflow as tf
except ImportError:
    tf = None


def score_ids(lm, token_ids, padding_mask, scoring_mode, layer_intercept_fn, target_ids, batch_size):
    """`GPTCausalLM.score` on token ids: checked, then kgpt's log-probabilities or keras-hub's modes."""
    token_ids = checks.token_ids(token_ids, "token_ids", lm.backbone.vocabulary_size)
    if token_ids.shape[0] == 0 or token_ids.shape[1] < 2:
        raise ValueError(
            "score() needs token_ids of shape [batch >= 1, length >= 2], got "
            f"{token_ids.shape}."
        )
    if padding_mask is None:
        padding_mask = np.ones_like(token_ids)
    padding_mask = checks.padding_mask(padding_mask, "padding_mask", token_ids.shape)
    check_length(lm, token_ids.shape[1])
    inputs = {"token_ids": token_ids, "padding_mask": padding_mask.astype("int32")}
    if scoring_mode == "log_probs":
        with checks.one_loop_at_a_time():
            return log_prob_model(lm).predict(inputs, batch_size=batch_size, verbose=0)
    return keras_hub_score(lm, inputs, scoring_mode, layer_intercept_fn, target_ids)


def score_text(lm, texts, batch_size):
    """`GPTCausalLM.score` on a text (an array) or a list of texts (a list of arrays), as `Scorer` scores them."""
    from kgpt.tasks.heuristics import Scorer

    if lm.preprocessor is None:
        raise ValueError(NO_PREPROCESSOR)
    if tf is not None and isinstance(texts, tf.Tensor):
        texts = texts.numpy()
    if isinstance(texts, np.ndarray):
        texts = texts.item() if texts.ndim == 0 else texts.reshape(-1).tolist()
    single = isinstance(texts, (str, bytes))
    texts = [texts] if single else list(texts)
    texts = [t.decode("utf-8") if isinstance(t, bytes) else t for t in texts]
    tokenizer = lm.preprocessor.tokenizer
    scorer = Scorer(lm, tokenizer, batch_size=batch_size)
    limit = lm.backbone.max_sequence_length
    pairs = []
    for text in texts:
        context, tokens = list(scorer.prefix), tokenizer.encode(text)
        if not context:  # no newline token: the first token only conditions
            context, tokens = tokens[:1], tokens[1:]
        if not tokens:
            raise ValueError(f"Nothing to score in {text!r:.80}: it has too few tokens.")
        if len(context) + len(tokens) > limit:
            newline = " with the newline before it" if scorer.prefix else ""
            raise ValueError(
                f"The text {text!r:.40} is {len(context) + len(tokens)} tokens long{newline}, more than the "
                f"model's context max_sequence_length={limit}; split it."
            )
        pairs.append((context, tokens))
    scores = [s.astype("float32") for s in scorer.log_probs_of_ids(pairs)]
    return scores[0] if single else scores


def log_prob_model(lm):
    """`lm`'s Keras model of `log P(token t+1 | tokens <= t)` `[batch, length - 1]`, made once."""
    scorer = getattr(lm, "_score_model", None)
    if scorer is None:
        ids, mask = lm.input["token_ids"], lm.input["padding_mask"]
        logits = ops.cast(lm.output[:, :-1, :], "float32")
        log_probs = ops.log_softmax(logits, axis=-1)
        targets = ops.expand_dims(ids[:, 1:], -1)
        picked = ops.take_along_axis(log_probs, targets, axis=-1)[..., 0]
        picked = picked * ops.cast(mask[:, 1:], "float32")
        scorer = keras.Model(lm.input, picked, name="scorer")
        # Plain attribute: the scorer shares our layers and must not be
        # tracked (it would be saved twice).
        object.__setattr__(lm, "_score_model", scorer)
    return scorer
