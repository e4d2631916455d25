"""The settings of the two training jobs, and the demo settings of the embedded runs.

`ModelConfig` (the size of a new model) and `RunConfig` (what every run
takes: where it writes, devices, optimisation) are declared once; the jobs'
configs add their own fields: `PretrainConfig` (`kgpt-train --task lm`) and
`FinetuneConfig` (`kgpt-train --task NAME`). Defaults are the paper's
(section 4.1). Each field's `help` is also its `kgpt-train` flag's help
(`kgpt.cli.train` defines one flag per field), so a field cannot lack a flag.
Configs are frozen: a command builds one from its flags, and a value decided
later is a new config (`dataclasses.replace`), never a change under a run.

The generic checks of settings (`check_integers`, `check_settings`) live
here too: a job's `check_config` calls them once, at its entry.

This module imports no Keras: `kgpt-train --help` reads it.
"""

import dataclasses
import typing

from kgpt.checks import positive_int
from kgpt.errors import ConfigError

KEEP = ("last", "best")  # the weights a fine-tuning saves and scores (--keep)
SEEDS = (0, 2**32 - 1)  # what keras.utils.set_random_seed takes
MODEL_PARALLEL = 2  # devices per model with --distribution model_parallel when --model_parallel is not given


def option(value, help, **flag):
    """A config field: its default `value`, its help, and in `flag` what its flag needs beyond them.

    `flag` may hold `choices` (an enum flag), `lower_bound` (the flag's
    minimum, and `check_integers`'), `kind="task_dirs"` (a list flag of NAME
    or NAME=DIR), `kind="list"` (a comma-separated list flag) and `default`
    (the flag's own default).
    """
    return dataclasses.field(default=value, metadata={"help": help, "flag": flag})


def default(cls, name, value):
    """`cls`'s field `name` (help, flag) with another default: a job's own default for a shared setting."""
    return dataclasses.field(default=value, metadata=cls.__dataclass_fields__[name].metadata)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The size of a new model (pre-training, or fine-tuning `init="scratch"`)."""

    num_layers: int = option(12, "Transformer blocks (with --architecture lstm, LSTM layers: 1 unless given).")
    num_heads: int = option(
        12, "Attention heads; also the head count of an original-format --init, whose shapes cannot tell it."
    )
    hidden_dim: int = option(768, "Hidden size.")
    intermediate_dim: int = option(3072, "Feed-forward inner size.")
    dropout: float = option(0.1, "Embedding, attention and residual dropout.")
    initializer_range: float = option(
        0.02,
        "Standard deviation of the normal initialisation of every embedding and "
        "kernel: the paper's 0.02 (for width 768); about hidden_dim**-0.5 lets a "
        "narrow model learn from context sooner (README, 'A recipe for a CPU'). The "
        "transformer's: an LSTM keeps 0.02 and Keras's LSTM initialisers.",
    )
    attention_dropout: float | None = option(
        None,
        "Dropout on attention probabilities if not --dropout; 0 runs "
        "attention through keras.ops.dot_product_attention (flash attention on "
        "GPUs) in training.",
    )


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What every training run takes: where it writes, its devices, and its optimisation."""

    output_dir: str | None = option(
        None,
        "Where the model, logs and metrics go (default: keep nothing). A directory "
        "holding another run's outputs is refused unless --overwrite; the same command "
        "again resumes.",
    )
    overwrite: bool = option(False, "Replace the outputs of another run in --output_dir (other files stay).")
    seed: int = option(0, "Random seed.")
    distribution: str = option(
        "none",
        "data_parallel: split every batch over every GPU/TPU core (CPUs without them) "
        "of every process: keras.distribution.DataParallel on JAX, tf.distribute's "
        "MirroredStrategy (one host) or MultiWorkerMirroredStrategy (several) on TensorFlow. "
        "model_parallel (JAX): split each model over --model_parallel devices, the batch over "
        "the rest. With several processes, none means data_parallel.",
        choices=["none", "data_parallel", "model_parallel"],
    )
    model_parallel: int | None = option(
        None,
        f"Devices each model is split over with --distribution model_parallel (default {MODEL_PARALLEL}; a divisor "
        f"of all the run's devices).",
        lower_bound=1,
    )
    coordinator_address: str | None = option(
        None,
        "Several processes (hosts): process 0's HOST:PORT, the same on "
        "every process, with --num_processes and --process_id; 'auto' lets "
        "jax.distributed find them (Cloud TPU, SLURM, Open MPI, Kubernetes). "
        "Default: SLURM, Open MPI or Cloud TPU variables (JAX), TF_CONFIG "
        "(TensorFlow), else one process. TensorFlow puts process i at PORT + i "
        "of that host, or takes every process's address, comma-separated.",
    )
    num_processes: int | None = option(None, "Processes in the run (with --coordinator_address).", lower_bound=1)
    process_id: int | None = option(
        None, "This process, 0..num_processes - 1; process 0 writes the outputs.", lower_bound=0
    )
    startup_timeout: int = option(
        300,
        "Seconds a process waits for the others to join before it stops with an error naming the coordinator.",
        lower_bound=1,
    )
    dtype: str | None = option(
        None,
        "Dtype policy (default: Keras' global one, float32): mixed_bfloat16 / "
        "mixed_float16 compute in 16 bits with float32 weights, attention softmax and losses "
        "(mixed_float16 adds loss scaling).",
        choices=["float32", "mixed_bfloat16", "mixed_float16", "bfloat16"],
    )
    batch_size: int | None = option(
        None,
        "Sequences (lm) or examples per update; None in fine-tuning: 32, or what a fine-tuned --init was trained with.",
        lower_bound=1,
    )
    learning_rate: float = option(6.25e-5, "Peak learning rate (warm-up, then cosine (lm) or linear decay to 0).")
    weight_decay: float = option(0.01, "Decoupled weight decay, not on biases/gains.")
    checkpoint_every: int = option(
        0,
        "Steps between checkpoints in OUTPUT_DIR/checkpoint; rerunning the same command "
        "resumes (fine-tuning also checkpoints at every epoch end). 0: lm none, "
        "fine-tuning epoch ends only.",
        lower_bound=0,
    )
    lm_loss_chunk_size: int = option(
        1024,
        "Tokens whose logits the LM loss holds at once, so training never keeps "
        "the whole [batch, length, vocabulary] array (kgpt.train.lm_loss); 0: all at "
        "once.",
        lower_bound=0,
    )
    gradient_accumulation_steps: int = option(
        1,
        "Micro-batches each update is accumulated over: --batch_size is "
        "still the update's batch, computed in pieces of batch_size / N "
        "(the paper's 64 x 512 tokens on a small device).",
        lower_bound=1,
    )
    compilation_cache: str | None = option(
        None,
        "Folder where JAX keeps the XLA programs a run compiles, so the next "
        "run with the same shapes loads them instead of compiling (they are "
        "checked against JAX's version and the program); 'none': off. Default: "
        "$KGPT_COMPILATION_CACHE, else $JAX_COMPILATION_CACHE_DIR, else "
        "$XDG_CACHE_HOME/kgpt/xla (~/.cache/kgpt/xla). TensorFlow ignores it.",
    )
    log_every: str = option(
        "auto",
        "A progress line (step, loss, tokens/s, time left) every N steps ('100') or "
        "seconds ('60s'); 'auto': every 60 s when the output is not a terminal (a terminal "
        "shows Keras' progress bar); '0': none.",
    )

    @property
    def model_devices(self):
        """The devices each model is split over with `distribution="model_parallel"` (`model_parallel`, else
        `MODEL_PARALLEL`)."""
        return MODEL_PARALLEL if self.model_parallel is None else self.model_parallel

    def run_part(self):
        """The `RunConfig` of this config (a job's): what `kgpt.jobs.run` takes, read once at the job's entry."""
        return RunConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(RunConfig)})


@dataclasses.dataclass(frozen=True)
class PretrainConfig(RunConfig, ModelConfig):
    """Language-model pre-training (`kgpt.jobs.pretrain`)."""

    batch_size: int = default(RunConfig, "batch_size", 64)
    learning_rate: float = default(RunConfig, "learning_rate", 2.5e-4)
    checkpoint_every: int = default(RunConfig, "checkpoint_every", 500)
    corpus: str | None = option(
        None,
        "UTF-8 text files: a glob in quotes ('books/**/*.txt' reaches subfolders) or a folder (its *.txt files; "
        "what else it holds is named, not read). Default: embedded demo text.",
    )
    tokenizer: str | None = option(
        None,
        "'train' to learn a BPE vocabulary from the corpus, or a folder holding one "
        "(default: the original GPT-1 vocabulary).",
    )
    num_merges: int = option(40_000, "Merges to learn with --tokenizer train.")
    architecture: str = option(
        "transformer",
        "'lstm' pre-trains the Table 5 ablation: --num_layers LSTM layers of "
        "--lstm_units (the paper's 1 x 2048; the demo's and a --recipe's own sizes where "
        "those flags are not given).",
        choices=["transformer", "lstm"],
    )
    lstm_units: int = option(2048, "Units per LSTM layer with --architecture lstm.")
    sequence_length: int = option(512, "Tokens per training window (and the model's context).")
    warmup_steps: int = option(2000, "Linear warm-up updates.")
    max_steps: int = option(10_000, "Total updates; the cosine schedule ends here.")
    evaluations: int = option(10, "Validation passes during training.")
    validation_fraction: float = option(0.1, "Share of tokens held out ...")
    validation_tokens: int = option(262_144, "... but at most this many tokens (512 windows of 512).")
    shards_dir: str | None = option(
        None,
        "Token shards folder (default: OUTPUT_DIR/shards, or a temporary one); "
        "reused when the corpus and tokenizer are unchanged.",
    )
    sample_tokens: int = option(40, "Length of the generated sample printed at the end (0: none).")
    prompt: str | None = option(None, "Prompt for that sample (default: the first words of the held-out text).")
    zero_shot: dict | None = option(
        None,
        "Tasks evaluated zero-shot during training, as NAME or NAME=DATA_DIR "
        "(NAME alone uses the task's embedded data), e.g. sst2,cola=glue/CoLA. Written to "
        "OUTPUT_DIR/zero_shot.csv and TensorBoard.",
        kind="task_dirs",
    )
    zero_shot_every: int | None = option(None, "Steps between zero-shot evaluations (default: at each validation).")
    zero_shot_examples: int | None = option(None, "Examples per split in those evaluations (default: all).")


@dataclasses.dataclass(frozen=True)
class FinetuneConfig(RunConfig, ModelConfig):
    """Discriminative fine-tuning of a registered task (`kgpt.jobs.finetune`)."""

    task: str = option("scitail", "A registered task (kgpt-train --list_tasks).")
    data_dir: str | None = option(None, "Task data in its distributed format (default: the task's embedded data).")
    init: str | None = option(
        "demo",
        "Preset dir (a --task lm --output_dir, or a fine-tuned --output_dir of the same "
        "task, whose head is kept), gpt1_base_en (the released GPT-1, from the Hugging Face "
        "Hub; --list_presets), hf://OWNER/REPO[@REVISION], the original GPT-1 release's model/ "
        "dir (params_*.npy; --num_heads gives its head count), Hugging Face openai-gpt files, "
        "'scratch' for no "
        "pre-training, or 'demo': pre-train the small demo model on the embedded text first "
        "(the default without --data_dir).",
        default=None,
    )
    transfer_layers: int | None = option(
        None, "Transfer the embeddings and only the first N blocks (default: all; paper Figure 2 left)."
    )
    pretrained_weights: bool = option(
        True,
        "--nopretrained_weights: --init's architecture and tokenizer with fresh "
        "weights (the Table 5 'no pre-training' ablation).",
    )
    epochs: int = option(
        3,
        "Fine-tuning epochs; 0 with a fine-tuned --init evaluates it and writes metrics.json and "
        "predictions without training.",
        lower_bound=0,
    )
    warmup_fraction: float = option(0.002, "Share of updates for linear warm-up (then linear decay to 0).")
    lm_coef: float = option(0.5, "Weight of the auxiliary LM loss, lambda in L3 = L2 + lambda L1 (0 disables it).")
    classifier_dropout: float = option(0.1, "Dropout before the task head.")
    max_length: int | None = option(
        None,
        "Tokens per view; longer ones are truncated and counted (default: the "
        "model's context, or a fine-tuned --init's own).",
    )
    predict_test: bool = option(
        False,
        "Also write test predictions in the benchmark's submission format (GLUE: OUTPUT_DIR/submission/RTE.tsv, ...).",
    )
    scratch_baseline: bool | None = option(
        None,
        "Also fine-tune the same model from fresh weights (Table 5's 'no "
        "pre-training') and print both results side by side; its outputs go to "
        "OUTPUT_DIR/no_pretraining. Default: on with --init demo, off otherwise.",
    )
    lora_rank: int | None = option(
        None,
        "Train rank-R LoRA factors on the attention's query and value projections "
        "(and the task head) instead of every weight; the saved model has them merged "
        "(docs/lora-int8.md).",
        lower_bound=1,
    )
    keep: str = option(
        "last",
        "The weights saved and scored: from the last epoch (the paper) or the epoch with the "
        "best dev score on the task's first metric.",
        choices=list(KEEP),
    )
    # Your own files, for the tasks that take them (text-classification, text-regression, multiple-choice):
    # docs/your-data.md. Relative paths are under --data_dir when it is given.
    train_file: str | None = option(
        None,
        "Your training table (.csv, .tsv or .jsonl; a header row names the "
        "columns) for --task text-classification, text-regression or multiple-choice.",
    )
    validation_file: str | None = option(None, "Your validation table, scored after every epoch (same columns).")
    test_file: str | None = option(None, "Your test table: predicted, and scored when it has the label column.")
    text_columns: list | None = option(
        None, "The text column (or the pair, A,B; multiple-choice: the context column(s)) of the tables.", kind="list"
    )
    label_column: str | None = option(
        None,
        "The label (text-classification: any strings, the set read from "
        "--train_file), number (text-regression) or answer (multiple-choice: a "
        "choice index from 0, or the right choice's text) column.",
    )
    choice_columns: list | None = option(None, "multiple-choice: the answer-choice columns, two or more.", kind="list")
    metrics: list | None = option(
        None,
        "Those tasks' metrics instead of their defaults, the first the headline "
        "(--keep best): accuracy, f1, matthews, pearson, spearman.",
        kind="list",
    )


# The embedded runs: small models a 2-core CPU trains in a couple of minutes, not the paper's 117M one.
# Explicit settings (flags given, config fields passed) override them. The demo text
# (kgpt.data.demo_world) has a few hundred words, so a vocabulary learned from it keeps the softmax
# small; N(0, 128**-0.5) instead of the paper's 0.02 gets a model this narrow off the unigram loss
# (README, 'A recipe for a CPU').
DEMO_PRETRAIN = dict(
    tokenizer="train",
    num_merges=1000,
    num_layers=2,
    num_heads=4,
    hidden_dim=128,
    intermediate_dim=512,
    initializer_range=0.088,
    sequence_length=64,
    batch_size=16,
    learning_rate=1e-3,
    warmup_steps=50,
    max_steps=800,
    evaluations=5,
)
DEMO_FINETUNE = dict(learning_rate=5e-4, batch_size=16, epochs=5)
# The LSTM that kgpt-analyze pre-trains beside the demo transformer (the paper's has 2048 units).
DEMO_LSTM = dict(num_layers=1, lstm_units=512)
# --architecture lstm without the demo or a recipe: the paper's single layer, not the transformer's 12.
PAPER_LSTM = dict(num_layers=1, lstm_units=2048)


# Named settings chosen by measurement, for a purpose the paper's defaults do not fit: `--recipe NAME`
# fills the flags not given. "lm" is pre-training on the user's --corpus; "finetune" is fine-tuning a
# model that recipe pre-trained; "lstm" replaces "lm"'s sizes with --architecture lstm. cpu-small: ~30
# minutes of pre-training on 2 CPU cores whose validation perplexity falls (the initialisation is what
# gets it off the unigram loss). Its fine-tuning takes 16x the paper's 6.25e-5 and 6 epochs: at 2.5e-4 x 3
# neither a pre-trained nor a fresh model of this size left the majority class on CoLA.
# docs/results/cpu-small/README.md has what it gave and the commands.
RECIPES = {
    "cpu-small": {
        "lm": dict(
            tokenizer="train",
            num_merges=8000,
            num_layers=4,
            num_heads=4,
            hidden_dim=256,
            intermediate_dim=1024,
            initializer_range=0.0625,
            sequence_length=64,
            batch_size=32,
            learning_rate=1e-3,
            warmup_steps=100,
            max_steps=1600,
            evaluations=8,
        ),
        "finetune": dict(learning_rate=1e-3, batch_size=32, epochs=6),
        # Table 5's LSTM beside it: one layer like the paper's. 512 units fit the same 30 minutes (1.2 s a
        # step against the transformer's 1.4 here; 1,024 units took 2.5 s) with 1.6M LSTM weights against
        # the transformer's 3.2M in blocks (the paper's ratio: 23M against 85M).
        "lstm": dict(num_layers=1, lstm_units=512),
    },
}


def demo_pretrain_config(**overrides):
    """The embedded pre-training run: `PretrainConfig` of `DEMO_PRETRAIN`, then `overrides`."""
    return PretrainConfig(**{**DEMO_PRETRAIN, **overrides})


# Where and how a run executes, not what it computes: never recorded, so a run resumes on another number of
# processes or devices (its batches are the same global batches).
PLACEMENT_FIELDS = (
    "coordinator_address",
    "num_processes",
    "process_id",
    "startup_timeout",
    "model_parallel",
    "log_every",
    "compilation_cache",
)


def recorded_settings(config, drop):
    """`config` as a run records it (`run.json`, checkpoints): without the fields in `drop` (where it writes,
    not what it computes)."""
    settings = dataclasses.asdict(config)
    for key in (*drop, *PLACEMENT_FIELDS):
        settings.pop(key, None)
    return settings


def own_fields(cls):
    """Names of the fields `cls` declares itself (not those of its bases)."""
    inherited = {f.name for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)}
    return [f.name for f in dataclasses.fields(cls) if f.name not in inherited]


def setting(check, value, name, *args, **kwargs):
    """`check(value, name, ...)` (a `kgpt.checks` function) for a setting: its error, which names the setting and
    what was given, a `ConfigError`."""
    try:
        return check(value, name, *args, **kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None


def setting_int(value, name, minimum=1, allow_none=False, maximum=None):
    """`kgpt.checks.positive_int` for a setting (`setting`)."""
    return setting(positive_int, value, name, minimum, maximum, allow_none=allow_none)


def check_settings(config, check, *names):
    """Raises `ConfigError` unless `check` (a `kgpt.checks` function) takes each setting in `names`."""
    for name in names:
        setting(check, getattr(config, name), name)


def check_model_sizes(config, built=True):
    """Raises `ConfigError` unless the sizes of `config` (a `ModelConfig`) are integers of 1 or more and, when a
    transformer is `built` from them, `num_heads` divides `hidden_dim`."""
    check_integers(config, num_layers=1, num_heads=1, hidden_dim=1, intermediate_dim=1)
    if built and config.hidden_dim % config.num_heads:
        raise ConfigError(
            f"hidden_dim {config.hidden_dim} must be a multiple of num_heads {config.num_heads}: each "
            f"head takes an equal share."
        )


def check_integers(config, *names, **ranges):
    """Raises `ConfigError` unless each setting named is an integer in its range; one typed `int | None` may be None.

    A setting in `names` takes its minimum from its field's `lower_bound`, the
    bound its flag has too; one in `ranges` (a field without `lower_bound`)
    gives its minimum, or a `(minimum, maximum)` range.

    Example: `check_integers(config, "batch_size", "epochs", seed=SEEDS)`
    """
    fields = {f.name: f for f in dataclasses.fields(config)}
    for name in ranges:
        if "lower_bound" in fields[name].metadata["flag"]:  # one number for the flag and the check
            raise TypeError(f"{name} has a lower_bound in its field: name it without a minimum.")
    bounds = {**{name: fields[name].metadata["flag"]["lower_bound"] for name in names}, **ranges}
    for name, bound in bounds.items():
        minimum, maximum = bound if isinstance(bound, tuple) else (bound, None)
        optional = type(None) in typing.get_args(fields[name].type)
        setting_int(getattr(config, name), name, minimum, allow_none=optional, maximum=maximum)
