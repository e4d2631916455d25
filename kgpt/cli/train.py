"""`kgpt-train`: pre-train a GPT (`--task lm`) or fine-tune it on a task plugin.

    kgpt-train --task scitail                       # embedded demo: pre-train, then fine-tune
    kgpt-train --task lm --corpus 'books/*.txt' --output_dir lm      # paper settings
    kgpt-train --task scitail --data_dir SciTailV1.1 --init lm --output_dir scitail
    kgpt-train --list_tasks

Flags default to the paper (section 4.1); the shared ones (batch size,
learning rate, ...) take the pre-training or the fine-tuning default by task.
Without --corpus (lm) or --data_dir/--init (tasks) the run uses embedded
data and small demo settings, printed at the start, which any flag given
explicitly overrides.
"""

import dataclasses

from kgpt.cli import common  # first: quiet TensorFlow start-up

from absl import app, flags, logging

from kgpt._quiet import quiet_stderr

with quiet_stderr():  # pre-training's imports start TensorFlow's devices
    from kgpt.jobs import finetune as finetune_lib
    from kgpt.jobs import pretrain as pretrain_lib

_PRE = pretrain_lib.PretrainConfig()
_FINE = finetune_lib.FinetuneConfig()


def _both(name):
    return f"(default {getattr(_PRE, name)} for lm, {getattr(_FINE, name)} for fine-tuning)"


flags.DEFINE_string("task", "lm", "'lm' to pre-train, or a task name (see --list_tasks).")
flags.DEFINE_bool("list_tasks", False, "List every task with its plugin, kind, labels and metrics, then exit.")
flags.DEFINE_string("output_dir", None, "Where the model, logs and metrics go (default: keep nothing). A directory "
                    "holding another run's outputs is refused unless --overwrite; the same command again resumes.")
flags.DEFINE_bool("overwrite", False, "Replace the outputs of another run in --output_dir (other files stay).")
flags.DEFINE_integer("seed", 0, "Random seed.")
# Model size: pre-training and fine-tuning --init scratch.
flags.DEFINE_integer("num_layers", _PRE.num_layers, "Transformer blocks.")
flags.DEFINE_integer("num_heads", _PRE.num_heads, "Attention heads.")
flags.DEFINE_integer("hidden_dim", _PRE.hidden_dim, "Hidden size.")
flags.DEFINE_integer("intermediate_dim", _PRE.intermediate_dim, "Feed-forward inner size.")
flags.DEFINE_float("dropout", _PRE.dropout, "Embedding, attention and residual dropout.")
flags.DEFINE_float("attention_dropout", None, "Dropout on attention probabilities if not --dropout; 0 runs "
                   "attention through keras.ops.dot_product_attention (flash attention on GPUs) in training.")
flags.DEFINE_enum("architecture", _PRE.architecture, ["transformer", "lstm"],
                  "lm: 'lstm' pre-trains the Table 5 ablation (--num_layers LSTM layers of --lstm_units).")
flags.DEFINE_integer("lstm_units", _PRE.lstm_units, "lm: units per LSTM layer with --architecture lstm.")
flags.DEFINE_integer("lm_loss_chunk_size", _PRE.lm_loss_chunk_size,
                     "Tokens whose logits the LM loss holds at once, so training never keeps the whole "
                     "[batch, length, vocabulary] array (kgpt.models.lm_loss); 0: all at once.", lower_bound=0)
# Devices and precision.
flags.DEFINE_enum("distribution", "none", ["none", "data_parallel"],
                  "data_parallel: split every batch over all local GPUs/TPU cores (CPUs without them): "
                  "keras.distribution.DataParallel on JAX, tf.distribute.MirroredStrategy on TensorFlow.")
flags.DEFINE_enum("dtype", None, ["float32", "mixed_bfloat16", "mixed_float16", "bfloat16"],
                  "Dtype policy: mixed_bfloat16 / mixed_float16 compute in 16 bits with float32 weights, "
                  "attention softmax and losses (mixed_float16 adds loss scaling).")
# Optimisation: defaults depend on the task.
flags.DEFINE_integer("batch_size", None, "Sequences (lm) or examples per update (default "
                     f"{_PRE.batch_size} for lm, 32 for fine-tuning, or what a fine-tuned --init was trained with).",
                     lower_bound=1)
flags.DEFINE_float("learning_rate", None, "Peak learning rate " + _both("learning_rate") + ".")
flags.DEFINE_float("weight_decay", None, "Decoupled weight decay, not on biases/gains " + _both("weight_decay") + ".")
# Pre-training.
flags.DEFINE_string("corpus", None, "lm: glob or folder of UTF-8 text files (default: embedded demo text).")
flags.DEFINE_string("tokenizer", None, "lm: 'train' to learn a BPE vocabulary from the corpus, or a folder "
                    "holding one (default: the original GPT-1 vocabulary).")
flags.DEFINE_integer("num_merges", _PRE.num_merges, "lm: merges to learn with --tokenizer train.")
flags.DEFINE_integer("sequence_length", _PRE.sequence_length, "lm: tokens per training window.")
flags.DEFINE_integer("warmup_steps", _PRE.warmup_steps, "lm: linear warm-up updates.")
flags.DEFINE_integer("max_steps", _PRE.max_steps, "lm: total updates; the cosine schedule ends here.")
flags.DEFINE_integer("evaluations", _PRE.evaluations, "lm: validation passes during training.")
flags.DEFINE_float("validation_fraction", _PRE.validation_fraction, "lm: share of tokens held out ...")
flags.DEFINE_integer("validation_tokens", _PRE.validation_tokens, "lm: ... but at most this many tokens.")
flags.DEFINE_integer("checkpoint_every", None, "Steps between checkpoints in OUTPUT_DIR/checkpoint; rerunning the "
                     f"same command resumes (default {_PRE.checkpoint_every} for lm; fine-tuning also checkpoints at "
                     "every epoch end). 0: lm none, fine-tuning epoch ends only.", lower_bound=0)
flags.DEFINE_string("shards_dir", None, "lm: token shards folder (default: OUTPUT_DIR/shards); reused when "
                    "the corpus and tokenizer are unchanged.")
flags.DEFINE_bool("prepare_only", False, "lm: learn or load the tokenizer, build the token shards (on every core), "
                  "print tokens and tokens/s, and exit without training.")
flags.DEFINE_string("prompt", None, "lm: prompt for the sample printed at the end.")
flags.DEFINE_list("zero_shot", None, "lm: tasks evaluated zero-shot during training, as NAME or NAME=DATA_DIR "
                  "(NAME alone uses the task's embedded data), e.g. sst2,cola=glue/CoLA. Written to "
                  "OUTPUT_DIR/zero_shot.csv and TensorBoard.")
flags.DEFINE_integer("zero_shot_every", None, "lm: steps between zero-shot evaluations (default: at each validation).")
flags.DEFINE_integer("zero_shot_examples", None, "lm: examples per zero-shot evaluation (default: all).")
# Fine-tuning.
flags.DEFINE_string("data_dir", None, "Task data in its distributed format (default: the task's embedded data).")
flags.DEFINE_string("init", None, "Preset dir (a --task lm --output_dir, or a fine-tuned --output_dir of the same "
                    "task, whose head is kept), the original GPT-1 release's model/ dir "
                    "(params_*.npy; --num_heads gives its head count), Hugging Face openai-gpt files, "
                    "or 'scratch' for no pre-training. "
                    "Default without --data_dir: pre-train the demo model on the embedded text first.")
flags.DEFINE_integer("transfer_layers", None, "Transfer the embeddings and only the first N blocks (default: all).")
flags.DEFINE_integer("epochs", _FINE.epochs, "Fine-tuning epochs; 0 with a fine-tuned --init evaluates it and "
                     "writes metrics.json and predictions without training.", lower_bound=0)
flags.DEFINE_enum("keep", _FINE.keep, ["last", "best"], "Fine-tuning: the weights saved and scored, from the last "
                  "epoch (the paper) or the epoch with the best dev score on the task's first metric.")
flags.DEFINE_float("warmup_fraction", _FINE.warmup_fraction, "Share of fine-tuning updates for linear warm-up.")
flags.DEFINE_float("lm_coef", _FINE.lm_coef, "Weight of the auxiliary LM loss (0 disables it).")
flags.DEFINE_float("classifier_dropout", _FINE.classifier_dropout, "Dropout before the task head.")
flags.DEFINE_bool("predict_test", False, "Also write test predictions in the benchmark's submission format "
                  "(GLUE: OUTPUT_DIR/submission/RTE.tsv, ...).")
flags.DEFINE_integer("max_length", None, "Fine-tuning: tokens per view; longer ones are truncated and counted "
                     "(default: the model's context).")

FLAGS = flags.FLAGS


def _values(config_cls):
    return {f.name: FLAGS[f.name].value for f in dataclasses.fields(config_cls)
            if f.name in FLAGS and FLAGS[f.name].value is not None}


def _apply_demo(values, demo, what):
    unset = {k: v for k, v in demo.items() if not FLAGS[k].present}
    values.update(unset)
    if unset:
        print(f"{what}: small demo settings " + ", ".join(f"{k}={v}" for k, v in unset.items()) + ".")


def pretrain_config_from_flags():
    """PretrainConfig from the flags; the demo settings fill unset flags without --corpus."""
    values = _values(pretrain_lib.PretrainConfig)
    if FLAGS.corpus is None:
        _apply_demo(values, pretrain_lib.DEMO_SETTINGS, "No --corpus: training on the embedded demo text with")
    if FLAGS.zero_shot:
        values["zero_shot"] = parse_task_dirs(FLAGS.zero_shot)
    return pretrain_lib.PretrainConfig(**values)


def parse_task_dirs(items):
    """`["sst2", "cola=glue/CoLA"]` -> `{"sst2": None, "cola": "glue/CoLA"}`."""
    parsed = {}
    for item in items:
        name, _, data_dir = item.partition("=")
        if not name:
            raise app.UsageError(f"--zero_shot: expected NAME or NAME=DATA_DIR, got {item!r}.", exitcode=2)
        parsed[name.strip()] = data_dir.strip() or None
    return parsed


def finetune_config_from_flags():
    """FinetuneConfig from the flags; demo settings fill unset flags for the embedded run."""
    values = _values(finetune_lib.FinetuneConfig)
    if FLAGS.data_dir is not None and FLAGS.init is None:
        raise app.UsageError("With --data_dir, pass --init PRESET_DIR (the --output_dir of kgpt-train --task lm) "
                             "or --init scratch (no pre-training).", exitcode=2)
    sizes = [f"--{n}" for n in ("num_layers", "hidden_dim", "intermediate_dim") if FLAGS[n].present]
    if sizes and FLAGS.init != "scratch":
        raise app.UsageError(f"{', '.join(sizes)} set(s) the size of a new model (--init scratch); --init "
                             f"{FLAGS.init or '(the demo model)'} has its own.", exitcode=2)
    if FLAGS.init is None:
        _apply_demo(values, finetune_lib.DEMO_SETTINGS, "Embedded run: fine-tuning the demo model with")
    return finetune_lib.FinetuneConfig(**values)


# Flags every job takes; the others belong to the job whose config has a field of their name.
_COMMON = {"task", "list_tasks", "seed", "output_dir", "verbose"}


def check_stage_flags(config_cls, job):
    """Refuses flags given on the command line that the chosen job would ignore."""
    fields = {f.name for f in dataclasses.fields(config_cls)} | ({"prepare_only"} if job == "lm" else set())
    ignored = [f"--{flag.name}" for flag in FLAGS.get_flags_for_module(__name__)
               if flag.present and flag.name not in fields and flag.name not in _COMMON]
    if ignored:
        other = "fine-tuning (--task NAME)" if job == "lm" else "pre-training (--task lm)"
        raise app.UsageError(f"{', '.join(ignored)} only appl{'y' if len(ignored) > 1 else 'ies'} to {other}; "
                             f"remove {'them' if len(ignored) > 1 else 'it'}.", exitcode=2)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
    logging.set_verbosity(logging.WARNING)  # keep JAX/TF start-up chatter out of the run log
    from kgpt.tasks.registry import RegistryError, TaskRegistry

    registry = TaskRegistry()
    if FLAGS.list_tasks:
        print("lm  (built in)  pre-training: next-token prediction on --corpus text\n")
        print(registry.describe())
        return
    if FLAGS.task != "lm":
        try:
            registry.entry(FLAGS.task)
        except RegistryError as e:
            cause = f"\n  caused by {type(e.__cause__).__name__}: {e.__cause__}" if e.__cause__ else ""
            raise app.UsageError(f"{e}{cause}\n(lm is pre-training; kgpt-train --list_tasks lists the rest.)", exitcode=2)
    import keras

    print(f"kgpt-train --task {FLAGS.task} on Keras {keras.__version__}, backend {keras.config.backend()}")
    if FLAGS.task == "lm":
        check_stage_flags(pretrain_lib.PretrainConfig, "lm")
        if FLAGS.prepare_only:
            pretrain_lib.prepare(pretrain_config_from_flags())
            return
        pretrain_lib.pretrain(pretrain_config_from_flags())
    else:
        check_stage_flags(finetune_lib.FinetuneConfig, FLAGS.task)
        finetune_lib.finetune(finetune_config_from_flags(), registry=registry)


GROUPS = {
    "Common": ["task", "list_tasks", "output_dir", "overwrite", "seed", "batch_size", "learning_rate", "weight_decay",
               "checkpoint_every", "verbose"],
    "Pre-training (--task lm)": ["corpus", "tokenizer", "num_merges", "sequence_length", "warmup_steps", "max_steps",
                                 "evaluations", "validation_fraction", "validation_tokens", "shards_dir", "prepare_only", "prompt",
                                 "zero_shot", "zero_shot_every", "zero_shot_examples", "architecture", "lstm_units"],
    "Fine-tuning (--task NAME)": ["data_dir", "init", "epochs", "keep", "transfer_layers", "warmup_fraction", "lm_coef",
                                  "classifier_dropout", "max_length", "predict_test"],
    "Model (lm, and fine-tuning --init scratch)": ["num_layers", "num_heads", "hidden_dim", "intermediate_dim",
                                                   "dropout", "attention_dropout", "lm_loss_chunk_size"],
    "Devices and precision": ["distribution", "dtype"],
}


def run():
    common.run(main, "kgpt-train", __doc__, GROUPS)


if __name__ == "__main__":
    run()
