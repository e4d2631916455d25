"""kgpt: GPT-1 generative pre-training and discriminative fine-tuning on Keras 3.

Runs on TensorFlow and JAX (set `KERAS_BACKEND`). See README.md.
"""

from kgpt import log  # the "kgpt" logger prints progress unless the application configures it
from kgpt._quiet import quiet_stderr

with quiet_stderr():  # TensorFlow's C++ start-up lines; see kgpt._quiet
    from kgpt.data import batching, readers
    from kgpt.train import callbacks, checkpoint
    from kgpt.io import export, original, pretrained
    from kgpt.tasks import heads, metrics, transforms
    from kgpt.models import lm_loss
    from kgpt.jobs import predict
    from kgpt.analysis import zero_shot
    from kgpt.models.backbone import GPT1_CONFIG, NUM_SPECIAL_TOKENS, GPTBackbone, gelu_tanh
    from kgpt.models.causal_lm import GPTCausalLM
    from kgpt.data.causal_lm_preprocessor import GPTCausalLMPreprocessor
    from kgpt.jobs.finetune import load_finetuned
    from kgpt.tasks.hookspecs import hookimpl
    from kgpt.models.lstm import LSTMBackbone
    from kgpt.train.optimizers import GPTAdamW, WarmupSchedule, gpt_adamw
    from kgpt.errors import ConfigError
    from kgpt.io.presets import CheckpointError
    from kgpt.tasks.registry import RegistryError, TaskRegistry
    from kgpt.tasks.task import DataError, Example, Skipped, Task
    from kgpt.models.task_model import GPTTaskModel
    from kgpt.data.task_preprocessor import GPTTaskPreprocessor
    from kgpt.data.tokenizer import GPTTokenizer

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
    "log",
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
