"""`kgpt-train`: pre-train (and, as tasks arrive, fine-tune) from the command line.

    kgpt-train --task lm                          # embedded demo text, small model
    kgpt-train --task lm --corpus 'books/*.txt' --output_dir out   # paper settings

Flags default to the paper (section 4.1). Without --corpus the run uses the
embedded demo text with the small settings of `kgpt.pretrain.DEMO_SETTINGS`,
which any flag given explicitly overrides.
"""

import dataclasses
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported

from absl import app, flags, logging

from kgpt import pretrain as pretrain_lib

TASKS = ("lm",)
_DEFAULTS = pretrain_lib.PretrainConfig()

flags.DEFINE_string("task", "lm", "Task to train. Available: " + ", ".join(TASKS) + ".")
flags.DEFINE_string("corpus", None, "Glob or folder of UTF-8 text files (default: embedded demo text).")
flags.DEFINE_string("output_dir", None, "Directory for model.keras, tokenizer/, history.csv, metrics.json.")
flags.DEFINE_integer("num_layers", _DEFAULTS.num_layers, "Transformer blocks.")
flags.DEFINE_integer("num_heads", _DEFAULTS.num_heads, "Attention heads.")
flags.DEFINE_integer("hidden_dim", _DEFAULTS.hidden_dim, "Hidden size.")
flags.DEFINE_integer("intermediate_dim", _DEFAULTS.intermediate_dim, "Feed-forward inner size.")
flags.DEFINE_float("dropout", _DEFAULTS.dropout, "Embedding, attention and residual dropout.")
flags.DEFINE_integer("sequence_length", _DEFAULTS.sequence_length, "Tokens per training window.")
flags.DEFINE_integer("batch_size", _DEFAULTS.batch_size, "Windows per update.")
flags.DEFINE_float("learning_rate", _DEFAULTS.learning_rate, "Peak learning rate.")
flags.DEFINE_integer("warmup_steps", _DEFAULTS.warmup_steps, "Linear warm-up updates.")
flags.DEFINE_float("weight_decay", _DEFAULTS.weight_decay, "Decoupled weight decay (not on biases/gains).")
flags.DEFINE_integer("max_steps", _DEFAULTS.max_steps, "Total updates; the cosine schedule ends here.")
flags.DEFINE_integer("evaluations", _DEFAULTS.evaluations, "Validation passes during training.")
flags.DEFINE_float("validation_fraction", _DEFAULTS.validation_fraction, "Share of tokens held out.")
flags.DEFINE_string("prompt", None, "Prompt for the sample printed at the end.")
flags.DEFINE_integer("seed", _DEFAULTS.seed, "Random seed.")

FLAGS = flags.FLAGS


def config_from_flags():
    """PretrainConfig from the flags; the demo settings fill unset flags without --corpus."""
    values = {f.name: FLAGS[f.name].value for f in dataclasses.fields(pretrain_lib.PretrainConfig)
              if f.name in FLAGS}
    if FLAGS.corpus is None:
        demo = {k: v for k, v in pretrain_lib.DEMO_SETTINGS.items() if not FLAGS[k].present}
        values.update(demo)
        print("No --corpus: training on the embedded demo text with small settings "
              + ", ".join(f"{k}={v}" for k, v in demo.items()) + ".")
    return pretrain_lib.PretrainConfig(**values)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    if FLAGS.task not in TASKS:
        raise app.UsageError(
            f"Unknown task {FLAGS.task!r}. Available: {', '.join(TASKS)}. "
            "(Fine-tuning tasks arrive with the task-plugin registry.)"
        )
    logging.set_verbosity(logging.WARNING)  # keep JAX/TF start-up chatter out of the run log
    import keras

    print(f"kgpt-train --task {FLAGS.task} on Keras {keras.__version__}, backend {keras.config.backend()}")
    pretrain_lib.pretrain(config_from_flags())


def run():
    app.run(main)


if __name__ == "__main__":
    run()
