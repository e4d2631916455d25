"""`kgpt-train`: pre-train a GPT (`--task lm`) or fine-tune it on a task plugin.

    kgpt-train --task scitail                       # embedded demo: pre-train, then fine-tune
    kgpt-train --task lm --corpus 'books/*.txt' --output_dir lm      # paper settings
    kgpt-train --task scitail --data_dir SciTailV1.1 --init lm --output_dir scitail
    kgpt-train --task sst2 --data_dir glue/SST-2 --init gpt1_base_en --output_dir sst2   # the released GPT-1
    kgpt-train --list_tasks
    kgpt-train --list_presets

Every flag is a field of the job's config (`kgpt.jobs.config`), with the
field's help; defaults are the paper's (section 4.1), and the shared ones
(batch size, learning rate, ...) take the pre-training or the fine-tuning
default by task. Without --corpus (lm), or without --init for a task (which
then fine-tunes `--init demo`: the small demo model, pre-trained on the
embedded text first), the run uses small demo settings
(`kgpt.jobs.config.DEMO_*`), printed at the start, which any flag given
explicitly overrides.
"""

import dataclasses
import os
import typing

from absl import app, flags
from absl import logging as absl_logging

from kgpt.cli import common  # first: quiet TensorFlow start-up
from kgpt.io import storage
from kgpt.io.run_folder import CHECKPOINTS, LATEST
from kgpt.jobs import config as config_lib

logger = common.command_logger("train")

CONFIGS = {"lm": config_lib.PretrainConfig, "finetune": config_lib.FinetuneConfig}
# Flags with no config field: they choose what the command does ("verbose" is kgpt.cli.common's).
CLI_ONLY = ("task", "list_tasks", "list_presets", "prepare_only", "recipe", "verbose", "dry_run")


def _flag_type(field):
    types = [t for t in typing.get_args(field.type) if t is not type(None)] or [field.type]
    return types[0]


def _flag_default(name):
    """The flag's default: the field's, or None where the jobs' defaults differ (each job then takes its own)."""
    found = [cls.__dataclass_fields__[name] for cls in CONFIGS.values() if name in cls.__dataclass_fields__]
    if "default" in found[0].metadata["flag"]:
        return found[0].metadata["flag"]["default"], ""
    defaults = [f.default for f in found]
    if len(set(map(repr, defaults))) == 1:
        return defaults[0], ""
    return None, f" (default {defaults[0]} for lm, {defaults[1]} for fine-tuning)"


def define_flags():
    """One flag per field of the jobs' configs, with the field's help; a field whose type has no flag is an error."""
    names = dict.fromkeys(f.name for cls in CONFIGS.values() for f in dataclasses.fields(cls))
    for name in names:
        field = next(cls.__dataclass_fields__[name] for cls in CONFIGS.values() if name in cls.__dataclass_fields__)
        if name == "task":
            continue  # defined below: it picks the job
        spec = {k: v for k, v in field.metadata["flag"].items() if k not in ("kind", "default")}
        default, defaults_help = _flag_default(name)
        help_text = field.metadata["help"] + defaults_help
        kind, choices = field.metadata["flag"].get("kind"), spec.pop("choices", None)
        if kind in ("task_dirs", "list"):
            flags.DEFINE_list(name, default, help_text)
        elif choices:
            flags.DEFINE_enum(name, default, choices, help_text)
        elif _flag_type(field) in (bool, int, float, str):
            define = {
                bool: flags.DEFINE_bool,
                int: flags.DEFINE_integer,
                float: flags.DEFINE_float,
                str: flags.DEFINE_string,
            }[_flag_type(field)]
            define(name, default, help_text, **spec)
        else:
            raise TypeError(f"Config field {name!r} of type {field.type} has no flag type: add one here.")


flags.DEFINE_string("task", "lm", "'lm' to pre-train, or a task name (see --list_tasks).")
flags.DEFINE_bool("list_tasks", False, "List every task with its plugin, kind, labels and metrics, then exit.")
flags.DEFINE_bool(
    "list_presets", False, "List the named pre-trained models (--init NAME) and where they come from, then exit."
)
flags.DEFINE_bool(
    "prepare_only",
    False,
    "lm: learn or load the tokenizer, build the token shards (on every core), "
    "print tokens and tokens/s, and exit without training.",
)
flags.DEFINE_enum(
    "recipe",
    None,
    list(config_lib.RECIPES),
    "Named settings that fill the flags not given: "
    "cpu-small pre-trains (--task lm, on your --corpus) a 4 x 256 model for ~30 minutes on 2 CPU cores, "
    "and fine-tunes (--task NAME) the model it pre-trained; README 'A recipe for a CPU'.",
)
define_flags()

FLAGS = flags.FLAGS


def _values(config_cls, skip=()):
    """The flags given or defaulted for `config_cls`'s fields (not `task`, nor the fields in `skip`)."""
    values = {
        f.name: FLAGS[f.name].value
        for f in dataclasses.fields(config_cls)
        if f.name != "task" and f.name not in skip and FLAGS[f.name].value is not None
    }
    common.refuse_empty_lists(values)
    if values.get("zero_shot") is not None:
        values["zero_shot"] = parse_task_dirs(values["zero_shot"])
    return values


def _fill_unset(values, settings, what, kind="small demo"):
    """Puts `settings` into `values` where the flag was not given, and says which."""
    unset = {k: v for k, v in settings.items() if not FLAGS[k].present}
    values.update(unset)
    if unset:
        logger.info(f"{what}: {kind} settings " + ", ".join(f"{k}={v}" for k, v in unset.items()) + ".")


def _apply_recipe(values, job):
    if FLAGS.recipe is not None:
        _fill_unset(values, config_lib.RECIPES[FLAGS.recipe][job], f"--recipe {FLAGS.recipe}", kind="its")


def pretrain_config_from_flags(**overrides):
    """PretrainConfig from the flags; --recipe, else the demo settings without --corpus, fill unset flags.

    `overrides` are fields a command sets itself (kgpt-analyze zero-shot-curve: `zero_shot`, from its --tasks);
    the flags are only read, never set.
    """
    values = _values(config_lib.PretrainConfig, skip=overrides)
    if FLAGS.recipe is not None and FLAGS.corpus is None:
        raise app.UsageError(
            f"--recipe {FLAGS.recipe} pre-trains on your text: give --corpus (a glob or folder of UTF-8 text files).",
            exitcode=2,
        )
    _apply_recipe(values, "lm")
    if FLAGS.corpus is None:
        _fill_unset(values, config_lib.DEMO_PRETRAIN, "No --corpus: training on the embedded demo text with")
    if values["architecture"] == "lstm":
        values.update(lstm_settings())
    return config_lib.PretrainConfig(**{**values, **overrides})


def lstm_settings():
    """The LSTM's sizes for the flags not given: the recipe's, the demo's without --corpus, else the paper's.

    They replace the transformer's (a recipe's 4 blocks are not 4 LSTM layers).
    """
    if FLAGS.recipe is not None:
        what, settings = f"--recipe {FLAGS.recipe}", config_lib.RECIPES[FLAGS.recipe].get("lstm", {})
    elif FLAGS.corpus is None:
        what, settings = "the demo", config_lib.DEMO_LSTM
    else:
        what, settings = "the paper", config_lib.PAPER_LSTM
    unset = {k: v for k, v in settings.items() if not FLAGS[k].present}
    if unset:
        logger.info(f"The LSTM: {what}'s sizes " + ", ".join(f"{k}={v}" for k, v in unset.items()) + ".")
    return unset


def parse_task_dirs(items, flag="--zero_shot"):
    """`["sst2", "cola=glue/CoLA"]` -> `{"sst2": None, "cola": "glue/CoLA"}`; a usage error naming `flag` for
    an empty name or folder, or a task named twice."""
    parsed = {}
    for item in items:
        name, equals, data_dir = (part.strip() for part in item.partition("="))
        if not name or (equals and not data_dir):
            raise app.UsageError(
                f"{flag}: expected NAME or NAME=DATA_DIR, got {item!r}"
                + (" (drop '=' for the task's embedded data)." if name else "."),
                exitcode=2,
            )
        if name in parsed:
            raise app.UsageError(f"{flag}: task {name!r} is named twice; name it once.", exitcode=2)
        parsed[name] = data_dir or None
    return parsed


def finetune_config_from_flags():
    """FinetuneConfig from the flags; without --init (and --data_dir), --init demo with the demo settings."""
    values = _values(config_lib.FinetuneConfig)
    if (FLAGS.data_dir is not None or FLAGS.train_file is not None) and FLAGS.init is None:
        given = "--data_dir" if FLAGS.data_dir is not None else "--train_file"
        raise app.UsageError(
            f"With {given}, pass --init PRESET_DIR (the --output_dir of kgpt-train --task lm), "
            "--init scratch (no pre-training) or --init demo (the small demo model).",
            exitcode=2,
        )
    # num_heads is not one: the original release's files cannot tell their head count.
    new_model = [f"--{f.name}" for f in dataclasses.fields(config_lib.ModelConfig) if f.name != "num_heads"]
    given = [flag for flag in new_model if FLAGS[flag[2:]].present]
    if given and FLAGS.init != "scratch":
        raise app.UsageError(
            f"{', '.join(given)} set(s) a new model's size or dropout (--init scratch); --init "
            f"{FLAGS.init or 'demo'} keeps its own (its config.json).",
            exitcode=2,
        )
    values["init"] = values.get("init", "demo")
    values["task"] = FLAGS.task if FLAGS.task != "lm" else config_lib.FinetuneConfig.task
    if values["init"] == "demo":
        what = "--init demo" if FLAGS.init else "No --init: --init demo"
        _fill_unset(
            values,
            config_lib.DEMO_FINETUNE,
            f"{what} (the small demo model, pre-trained on the embedded text first), fine-tuned with",
        )
    _apply_recipe(values, "finetune")  # after the demo's: a recipe's settings win over them
    return config_lib.FinetuneConfig(**values)


# Flags every job takes; the others belong to the job whose config has a field of their name.
_COMMON = {"task", "list_tasks", "list_presets", "recipe", "seed", "output_dir", "verbose"}


def check_stage_flags(config_cls, job):
    """Refuses flags given on the command line that the chosen job would ignore."""
    fields = {f.name for f in dataclasses.fields(config_cls)} | ({"prepare_only"} if job == "lm" else set())
    ignored = [
        f"--{flag.name}"
        for flag in FLAGS.get_flags_for_module(__name__)
        if flag.present and flag.name not in fields and flag.name not in _COMMON
    ]
    if ignored:
        other = "fine-tuning (--task NAME)" if job == "lm" else "pre-training (--task lm)"
        hint = {
            "--sequence_length": " (a fine-tuned model's context is --max_length)",
            "--max_length": " (pre-training's context is --sequence_length)",
        }
        hints = "".join(hint.get(name, "") for name in ignored)
        raise app.UsageError(
            f"{', '.join(ignored)} only appl{'y' if len(ignored) > 1 else 'ies'} to {other}; "
            f"remove {'them' if len(ignored) > 1 else 'it'}{hints}.",
            exitcode=2,
        )


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
    absl_logging.set_verbosity(absl_logging.WARNING)  # keep JAX/TF start-up chatter out of the run log
    from kgpt.errors import RegistryError
    from kgpt.tasks.registry import TaskRegistry

    if FLAGS.list_presets:
        from kgpt.io import hub

        for name, preset in hub.PRESETS.items():
            print(f"{name}  {preset['uri']}\n    {preset['description']}")
        print("\nAny hf://OWNER/REPO[@REVISION] holding a kgpt preset or openai-gpt files works too.")
        return
    registry = TaskRegistry()
    if FLAGS.list_tasks:
        print("lm  (built in)  pre-training: next-token prediction on --corpus text\n")
        print(registry.describe())
        if FLAGS.verbose:  # each broken plugin's traceback, for its authors
            for broken in registry.broken:
                print(
                    f"\nTraceback of plugin {broken.plugin!r} ({broken.origin}):\n"
                    f"{registry.format_traceback(broken.plugin).rstrip()}"
                )
        return
    if FLAGS.task != "lm":
        try:
            registry.entry(FLAGS.task)
        except RegistryError as e:
            if FLAGS.verbose:
                raise  # with the plugin's own error chained below it
            cause = f"\n  caused by {type(e.__cause__).__name__}: {e.__cause__}" if e.__cause__ else ""
            raise app.UsageError(
                f"{e}{cause}\n(lm is pre-training; kgpt-train --list_tasks lists the rest.)", exitcode=2
            ) from None
    import keras

    from kgpt.jobs import dry_run, finetune, pretrain

    logger.info(f"kgpt-train --task {FLAGS.task} on Keras {keras.__version__}, backend {keras.config.backend()}")
    if FLAGS.task == "lm":
        check_stage_flags(config_lib.PretrainConfig, "lm")
        if FLAGS.dry_run:
            dry_run.pretrain(pretrain_config_from_flags())
            return
        if FLAGS.prepare_only:
            pretrain.prepare(pretrain_config_from_flags())
            return
        pretrain.pretrain(pretrain_config_from_flags(), registry)
    else:
        check_stage_flags(config_lib.FinetuneConfig, FLAGS.task)
        (dry_run.finetune if FLAGS.dry_run else finetune.finetune)(finetune_config_from_flags(), registry)


_DEVICES = [
    "distribution",
    "model_parallel",
    "dtype",
    "gradient_accumulation_steps",
    "coordinator_address",
    "num_processes",
    "process_id",
    "startup_timeout",
]
GROUPS = {
    "Common": [
        "task",
        "list_tasks",
        "list_presets",
        "recipe",
        *(n for n in config_lib.own_fields(config_lib.RunConfig) if n not in _DEVICES),
        "dry_run",
        "verbose",
    ],
    "Pre-training (--task lm)": [*config_lib.own_fields(config_lib.PretrainConfig), "prepare_only"],
    "Fine-tuning (--task NAME)": [n for n in config_lib.own_fields(config_lib.FinetuneConfig) if n != "task"],
    "Model (lm, and fine-tuning --init scratch)": config_lib.own_fields(config_lib.ModelConfig),
    "Devices, processes and precision": _DEVICES,
}


def several_processes():
    """Whether this run joins other processes (checked before the backends start; the job joins them)."""
    return (
        not FLAGS.list_tasks
        and not FLAGS.list_presets
        and common.several_processes(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
    )


def checkpoints_kept():
    """Where this run keeps its checkpoints (its --output_dir), or None while it has none: the lines for Ctrl-C
    and a full disk name it."""
    if (
        not FLAGS.output_dir
        or FLAGS.dry_run
        or (FLAGS.task == "lm" and (FLAGS.prepare_only or FLAGS.checkpoint_every == 0))
    ):
        return None  # pre-training's --checkpoint_every 0 keeps none; fine-tuning's keeps each epoch's end
    if storage.is_remote(FLAGS.output_dir):  # pushed there after each one; asking the store on the way out could hang
        return FLAGS.output_dir
    return FLAGS.output_dir if os.path.isfile(os.path.join(FLAGS.output_dir, CHECKPOINTS, LATEST)) else None


def run():
    common.run(main, "kgpt-train", __doc__, GROUPS, start=several_processes, resumes=checkpoints_kept)


if __name__ == "__main__":
    run()
