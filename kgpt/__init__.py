"""kgpt: GPT-1 generative pre-training and discriminative fine-tuning on Keras 3.

Runs on TensorFlow and JAX (set `KERAS_BACKEND`). See README.md.

The facade holds classes, functions and constants, each also reachable under
the module that defines it; a module is used by its own path, never through
the facade (`from kgpt.tasks import transforms`, `from kgpt.data import
readers`). `kgpt.log` is the one module here: `kgpt.log.to_stdout()`.

The names below are imported on first use (PEP 562), so that `import kgpt`
and the commands' `--help` start without Keras, TensorFlow or JAX. The first
of them used imports them all, which registers every kgpt Keras class
(`keras.saving.load_model` and keras-hub presets then find them); so does
`import kgpt` in a program that has imported Keras already.
"""

import importlib
import sys

from kgpt import log  # noqa: F401 - `kgpt.log.to_stdout()` shows progress as the commands do; see kgpt.log

__version__ = "0.1.0"

# Public name -> the module that defines it.
_NAMES = {
    "GPT1_CONFIG": "kgpt.models.gpt.gpt_backbone",
    "NUM_SPECIAL_TOKENS": "kgpt.models.gpt.gpt_backbone",
    "GPTBackbone": "kgpt.models.gpt.gpt_backbone",
    "GPTDecoderBlock": "kgpt.layers.decoder_block",
    "gelu_tanh": "kgpt.layers.decoder_block",
    "GPTCausalLM": "kgpt.models.gpt.gpt_causal_lm",
    "GPTTaskModel": "kgpt.models.gpt.gpt_task_model",
    "LSTMBackbone": "kgpt.models.lstm.lstm_backbone",
    "GPTCausalLMPreprocessor": "kgpt.models.gpt.gpt_causal_lm_preprocessor",
    "GPTTaskPreprocessor": "kgpt.models.gpt.gpt_task_preprocessor",
    "GPTTokenizer": "kgpt.models.gpt.gpt_tokenizer",
    "read_tokenizer": "kgpt.models.gpt.gpt_tokenizer",
    "KerasHubTokenizer": "kgpt.tokenizers.keras_hub_adapter",
    "GPTAdamW": "kgpt.train.optimizers",
    "WarmupSchedule": "kgpt.train.optimizers",
    "gpt_adamw": "kgpt.train.optimizers",
    "ConfigError": "kgpt.errors",
    "CheckpointError": "kgpt.errors",
    "upload_preset": "kgpt.io.hub",
    "RegistryError": "kgpt.errors",
    "TaskRegistry": "kgpt.tasks.registry",
    "DataError": "kgpt.errors",
    "Example": "kgpt.tasks.task",
    "Skipped": "kgpt.tasks.task",
    "Task": "kgpt.tasks.task",
    "hookimpl": "kgpt.tasks.hookspecs",
    "load_finetuned": "kgpt.jobs.finetune",
}

# Modules that register Keras classes which no name above imports (the heads and transformations
# a saved task model names, the LM loss its compile config names).
_REGISTERING = ("kgpt.tasks.heads", "kgpt.tasks.transforms", "kgpt.train.lm_loss")

__all__ = sorted([*_NAMES, "log"], key=lambda n: (n[0].islower(), n))


def _load_all():
    """Imports every public name into the package, under quiet TensorFlow start-up."""
    from kgpt._quiet import quiet_stderr

    with quiet_stderr():  # TensorFlow's C++ start-up lines; see kgpt._quiet
        for module in _REGISTERING:
            importlib.import_module(module)
        for name, module in _NAMES.items():
            globals()[name] = getattr(importlib.import_module(module), name)


def __getattr__(name):
    if name not in _NAMES:
        raise AttributeError(f"module 'kgpt' has no attribute {name!r}")
    _load_all()
    return globals()[name]


def __dir__():
    return sorted({*globals(), *_NAMES})


if "keras" in sys.modules:  # Keras' start-up is paid already: register kgpt's classes for its loaders now
    _load_all()
