"""kgpt: GPT-1 generative pre-training and discriminative fine-tuning on Keras 3.

Runs on TensorFlow and JAX (set `KERAS_BACKEND`). See README.md.
"""

from kgpt._quiet import quiet_stderr

with quiet_stderr():  # TensorFlow's C++ start-up lines; see kgpt._quiet
    from kgpt import (batching, callbacks, checkpoint, export, heads, lm_loss, metrics, original, predict, pretrained,
                          readers, transforms, zero_shot)
    from kgpt.backbone import GPT1_CONFIG, NUM_SPECIAL_TOKENS, GPTBackbone, gelu_tanh
    from kgpt.causal_lm import GPTCausalLM
    from kgpt.causal_lm_preprocessor import GPTCausalLMPreprocessor
    from kgpt.finetune import load_finetuned
    from kgpt.hookspecs import hookimpl
    from kgpt.lstm import LSTMBackbone
    from kgpt.optimizers import GPTAdamW, WarmupSchedule, gpt_adamw
    from kgpt.errors import ConfigError
    from kgpt.presets import CheckpointError
    from kgpt.registry import RegistryError, TaskRegistry
    from kgpt.task import DataError, Example, Skipped, Task
    from kgpt.task_model import GPTTaskModel
    from kgpt.task_preprocessor import GPTTaskPreprocessor
    from kgpt.tokenizer import GPTTokenizer

__version__ = "0.1.0"

__all__ = [
    "GPT1_CONFIG",
    "NUM_SPECIAL_TOKENS",
    "CheckpointError",
    "ConfigError",
    "DataError",
    "Example",
    "GPTAdamW",
    "GPTBackbone",
    "GPTCausalLM",
    "GPTCausalLMPreprocessor",
    "GPTTaskModel",
    "GPTTaskPreprocessor",
    "GPTTokenizer",
    "LSTMBackbone",
    "RegistryError",
    "Skipped",
    "Task",
    "TaskRegistry",
    "WarmupSchedule",
    "gelu_tanh",
    "gpt_adamw",
    "batching",
    "callbacks",
    "checkpoint",
    "export",
    "heads",
    "hookimpl",
    "lm_loss",
    "load_finetuned",
    "metrics",
    "original",
    "predict",
    "pretrained",
    "readers",
    "transforms",
    "zero_shot",
]
