"""`kgpt.GPTTokenizer`: GPT-1's BPE tokenizer (`kgpt.tokenizers.gpt1`) named for the GPT backbone, and reading
the tokenizer of any folder kgpt takes.

As keras-hub's model tokenizers (e.g. `GPT2Tokenizer`) subclass its generic
ones with `backbone_cls`, `GPTTokenizer` is GPT-1's tokenizer layer with the
backbone named, registered as "kgpt>GPTTokenizer" (the name presets hold).
"""

import keras

from kgpt.errors import CheckpointError, ConfigError
from kgpt.models.gpt.gpt_backbone import GPTBackbone
from kgpt.tokenizers.gpt1.tokenizer import GPT1Tokenizer
from kgpt.tokenizers.loading import load_tokenizer


@keras.saving.register_keras_serializable(package="kgpt")
class GPTTokenizer(GPT1Tokenizer):
    """Text <-> token ids with the GPT-1 BPE vocabulary, as a keras-hub `Tokenizer`.

    Calling the layer (or `tokenize()`) on a string gives an int32 NumPy
    array of ids; on a list of strings or a rank-1 string tensor, a list of
    id lists. Inside a `tf.data` pipeline or a `tf.function` the exact Python
    algorithm runs through `tf.py_function` (ftfy, spaCy's rules and the
    original BPE have no faithful TensorFlow ops), giving a dense int32
    vector for a scalar string and a `tf.RaggedTensor` for a batch, which
    keras-hub's packers take. `detokenize()` is the inverse: ids in any
    form -> a string or a list of strings (see `decode()` for the spacing).

    `encode()`/`decode()` are the plain-Python API on single texts.
    `special_tokens` are the paper's three added tokens (`_start_`,
    `_delimiter_`, `_classify_`; `start_token_id`, `delimiter_token_id`,
    `extract_token_id`, also as `start_id`, `delimiter_id`, `extract_id`).
    GPT-1's language model has no beginning- or end-of-text token, so
    `end_token_id` is None (generation runs to `max_length`) and padding uses
    id 0 (`pad_token_id`, `<unk>`), which the padding mask hides.

    Args:
        encoder: dict of BPE symbol -> id, ids `0..n-1` (`<unk>` is 0 in the
            original files); None for an empty tokenizer that
            `load_assets(directory)` fills (how presets are loaded).
        merges: list of `(left, right)` symbol pairs in rank order (None
            with `encoder=None`).
        splitter: `"spacy"` (the original's word splitting) or `"regex"`
            (the default here, for vocabularies built in code; `gpt1()` and
            the loaders take the one their files record, spaCy for the
            original files).

    Example:
    ```python
    tokenizer = kgpt.GPTTokenizer.gpt1()  # the original files and algorithm, shipped
    ids = tokenizer.encode("Hello world!")
    tokenizer.decode(ids)  # 'hello world !'
    tokenizer.vocabulary_size()  # 40481 (40478 + start, delimiter, extract)

    tokenizer("Hello world!")  # array([3570, 1276, 267], dtype=int32)
    tokenizer(["Hello world!", "Hi"])  # [[3570, 1276, 267], [3569]]
    tokenizer.detokenize([[3570, 1276]])  # ['hello world']

    ds = tf.data.Dataset.from_tensor_slices(["Hello world!", "Hi"])
    ds = ds.batch(2).map(tokenizer)  # tf.RaggedTensor batches

    tokenizer.save_to_preset("my_preset")  # tokenizer.json + assets/tokenizer/
    kgpt.GPTTokenizer.from_preset("my_preset")
    ```
    """

    backbone_cls = GPTBackbone


def read_tokenizer(path, flag=None):
    """The tokenizer in the folder `path`: a kgpt GPT-1 preset, the original BPE files, or any keras-hub
    tokenizer preset (`kgpt.tokenizers.loading.load_tokenizer`).

    With `flag` (e.g. `"--tokenizer"`), a folder that holds no tokenizer kgpt
    can read is a `kgpt.ConfigError` naming the flag.
    """
    try:
        return load_tokenizer(path, GPTTokenizer)
    except (CheckpointError, OSError) as e:
        if flag is None:
            raise
        raise ConfigError(f"{flag}={path}: {e}") from e
