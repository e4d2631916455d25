"""kgpt-analyze MODE: the paper's section 5 analyses from the command line.

Modes: zero-shot (Table 4-style zero-shot scores of one model), zero-shot-curve
(Figure 2 right: zero-shot scores during pre-training), transfer (Figure 2
left: fine-tuning with 0..N transferred blocks), ablations (Table 5).

    kgpt-analyze zero-shot --init PRESET --tasks sst2=glue/SST-2,cola=glue/CoLA
    kgpt-analyze zero-shot-curve --tasks sst2,cola          # Figure 2 (right)
    kgpt-analyze transfer --init PRESET --tasks mnli=glue/MNLI --layers 0,3,6,9,12   # Figure 2 (left)
    kgpt-analyze ablations --init PRESET --lstm_init LSTM --tasks cola=...,sst2=...  # Table 5

Without `--init` (and `--corpus`) each mode pre-trains the small demo models on
the embedded text, and tasks named without `=DIR` use their embedded data.
Model, schedule and pre-training flags are `kgpt-train`'s. Outputs (tables as
CSV and Markdown, plots as PNG) go to `--output_dir` (default `analysis`),
which is claimed like a job's (`kgpt.jobs.rundir`): the modes share it, but a
directory holding another job's outputs or files kgpt did not write is
refused unless `--overwrite`.
"""

import dataclasses

from absl import app, flags
from absl import logging as absl_logging

from kgpt.cli import common, train  # common first: quiet TensorFlow start-up
from kgpt.jobs import config as config_lib

logger = common.command_logger("analyze")

MODES = ("zero-shot", "zero-shot-curve", "transfer", "ablations")
DEFAULT_TASKS = {
    "zero-shot": ["sst2", "cola"],
    "zero-shot-curve": ["sst2", "cola"],
    "transfer": ["scitail"],
    "ablations": ["cola", "sst2"],
}
# kgpt.jobs.experiments.TABLE5's rows, named here so that --help imports no Keras (a test checks they agree).
TABLE5_ROWS = ("full", "no_pretraining", "no_aux_lm", "lstm")
ARCHITECTURES = ("transformer", "lstm")  # kgpt.jobs.experiments.ARCHITECTURES, the ones zero-shot-curve pre-trains

flags.DEFINE_list(
    "tasks",
    None,
    "Tasks as NAME or NAME=DATA_DIR (NAME alone: its embedded data). Default: "
    "sst2,cola for the zero-shot modes and ablations, scitail for transfer (which takes one task).",
)
flags.DEFINE_list("layers", None, "transfer: numbers of blocks to transfer (default 0..all).")
flags.register_validator(
    "layers",
    lambda v: v is None or (all(n.strip().isdigit() for n in v) and len({int(n) for n in v}) == len(v)),
    "--layers takes distinct block counts, whole numbers >= 0 separated by commas (e.g. 0,2,4).",
)
flags.DEFINE_list("rows", list(TABLE5_ROWS), "ablations: Table 5 rows to run.")
flags.DEFINE_string(
    "lstm_init",
    None,
    "ablations: the pre-trained LSTM preset for the lstm row "
    "(kgpt-train --task lm --architecture lstm); pre-trained on the demo text without --init.",
)
flags.DEFINE_list("architectures", list(ARCHITECTURES), "zero-shot-curve: architectures to pre-train.")
flags.DEFINE_list(
    "seeds",
    None,
    "ablations: fine-tune every row once per seed (e.g. 0,1,2); the table gives the mean, "
    "ablations_seeds.csv each seed (default: --seed alone).",
)

FLAGS = flags.FLAGS


def main(argv):
    if len(argv) != 2 or argv[1] not in MODES:
        given = f"; got {', '.join(map(repr, argv[1:]))}" if len(argv) > 1 else ""
        raise app.UsageError(f"Give one mode: {', '.join(MODES)} (kgpt-analyze MODE [flags]){given}.", exitcode=2)
    mode = argv[1]
    absl_logging.set_verbosity(absl_logging.WARNING)
    output_dir = FLAGS.output_dir or "analysis"
    if "://" in output_dir:  # its tables and runs are written to a local folder only
        from kgpt.errors import ConfigError

        raise ConfigError(f"--output_dir {output_dir}: kgpt-analyze writes a local folder (or a mounted bucket).")
    common.refuse_empty_lists(["tasks", "layers"])  # an empty --rows or --architectures is named below
    _check_choices("architectures", ARCHITECTURES)  # before any vocabulary, corpus or model work, dry run too
    _check_choices("rows", TABLE5_ROWS)
    tasks = train.parse_task_dirs(FLAGS.tasks or DEFAULT_TASKS[mode], "--tasks")
    seeds = _seeds()
    _check_mode_flags(mode)
    if mode == "transfer" and len(tasks) > 1:
        raise app.UsageError(
            f"transfer fine-tunes on one task; --tasks names {len(tasks)} ({', '.join(tasks)}): run it once per task.",
            exitcode=2,
        )
    if mode == "zero-shot" and FLAGS.init is None:
        raise app.UsageError("zero-shot needs --init: a pre-trained preset or original checkpoint.", exitcode=2)
    import keras

    from kgpt.errors import ConfigError
    from kgpt.io import hub
    from kgpt.jobs import run
    from kgpt.jobs.finetune_model import SPECIAL_INITS, with_local_init
    from kgpt.jobs.rundir import RunDirectory, check_inputs_outside
    from kgpt.tasks.registry import TaskRegistry

    logger.info(
        f"kgpt-analyze {mode} on Keras {keras.__version__}, backend {keras.config.backend()}; outputs in {output_dir}"
    )
    several = not FLAGS.dry_run and train.several_processes()
    if several and mode in ("zero-shot", "zero-shot-curve"):
        raise app.UsageError(
            f"{mode} scores tasks with the model's predictions, which kgpt runs on one process: "
            "run it without --num_processes.",
            exitcode=2,
        )
    config = _config(mode, tasks)
    if getattr(config, "init", None) is not None and hub.is_hub(config.init):
        # A Hub --init: the whole preset (converted once); its dry run checks the files as for a folder.
        config = with_local_init(config)
    if FLAGS.overwrite:  # it cleared the model the experiments start from; the modes share a folder otherwise
        starts = {"--init": getattr(config, "init", None), "--lstm_init": FLAGS.lstm_init}
        inputs = {flag: path for flag, path in starts.items() if path not in SPECIAL_INITS}
        inputs.update({f"--tasks {name}=": data_dir for name, data_dir in tasks.items()})
        check_inputs_outside(output_dir, inputs)
    if FLAGS.dry_run:
        _dry_run(mode, config, tasks, output_dir, seeds)
        return
    if several:  # before any model is loaded: the processes join before the backend computes anything
        run.join(
            dataclasses.replace(config, output_dir=output_dir),
            "analyze",
            {"mode": mode, "tasks": tasks, "seeds": seeds},
        )
    # The modes share the directory (zero-shot reads the model that transfer pre-trained there); each
    # experiment's own run under runs/ is claimed with its settings by its job.
    with run.claimed(RunDirectory(output_dir, "analyze", {}, overwrite=FLAGS.overwrite)):
        _run(mode, config, tasks, output_dir, TaskRegistry(), seeds)


# kgpt-analyze's own flags that one mode reads, and what each mode reads of kgpt-train's: the rest would be ignored.
MODE_OF_FLAG = {
    "layers": "transfer",
    "rows": "ablations",
    "lstm_init": "ablations",
    "seeds": "ablations",
    "architectures": "zero-shot-curve",
}
MODE_READS = {
    "zero-shot": "it scores --init on --tasks",
    "zero-shot-curve": "it pre-trains with zero-shot scores on --tasks, for each of --architectures",
    "transfer": "it fine-tunes on the one task of --tasks, with each of --layers transferred",
    "ablations": "it fine-tunes on --tasks",
}


def _check_mode_flags(mode):
    """Refuses flags given that `mode` would ignore: another mode's, `--task` (the tasks are `--tasks`), and
    kgpt-train's flags outside the mode's config (zero-shot reads `--init` alone)."""
    for name, reader in MODE_OF_FLAG.items():
        if FLAGS[name].present and reader != mode:
            raise app.UsageError(f"--{name} only applies to {reader}, not {mode}; remove it.", exitcode=2)
    if mode == "zero-shot":
        fields = {"init", "output_dir", "overwrite"}
    elif mode == "zero-shot-curve":  # the tasks and the architecture of each run are the mode's
        fields = {f.name for f in dataclasses.fields(config_lib.PretrainConfig)} - {"zero_shot", "architecture"}
        fields |= {"recipe"}
    else:
        fields = {f.name for f in dataclasses.fields(config_lib.FinetuneConfig)} | {"recipe"}
        if mode == "transfer":  # each of its runs sets the transferred blocks from --layers
            fields -= {"transfer_layers"}
    ignored = [
        f"--{flag.name}"
        for flag in FLAGS.get_flags_for_module(train.__name__)
        if flag.present and flag.name not in fields - {"task"} and flag.name != "verbose"
    ]
    if ignored:
        raise app.UsageError(
            f"{', '.join(ignored)} {'do' if len(ignored) > 1 else 'does'} nothing in kgpt-analyze {mode} "
            f"({MODE_READS[mode]}); remove {'them' if len(ignored) > 1 else 'it'}.",
            exitcode=2,
        )


def _config(mode, tasks):
    """The flags read once into the config the mode's runs start from (the dry run checks the same one).

    zero-shot-curve pre-trains (a `PretrainConfig` whose zero-shot tasks are
    `--tasks`); the other modes fine-tune, or (zero-shot) score `--init`.
    """
    if mode == "zero-shot-curve":
        return train.pretrain_config_from_flags(zero_shot=tasks)
    return train.finetune_config_from_flags()


def _layers():
    return [int(n) for n in FLAGS.layers] if FLAGS.layers else None


def _run(mode, config, tasks, output_dir, registry, seeds):
    from kgpt.jobs import experiments

    if mode == "zero-shot":
        experiments.zero_shot_table(config.init, tasks, output_dir=output_dir, registry=registry)
    elif mode == "zero-shot-curve":
        lstm = train.lstm_settings() if "lstm" in FLAGS.architectures else None
        experiments.zero_shot_curve(
            config, architectures=FLAGS.architectures, output_dir=output_dir, registry=registry, lstm=lstm
        )
    elif mode == "transfer":
        name, data_dir = next(iter(tasks.items()))
        experiments.transfer_depth(
            dataclasses.replace(config, task=name, data_dir=data_dir),
            layers=_layers(),
            output_dir=output_dir,
            registry=registry,
        )
    else:
        experiments.ablations(
            config,
            tasks,
            rows=FLAGS.rows,
            lstm_init=FLAGS.lstm_init,
            output_dir=output_dir,
            registry=registry,
            seeds=seeds,
        )


def _dry_run(mode, config, tasks, output_dir, seeds):
    from kgpt.jobs import dry_run

    dry_run.analyze(
        mode,
        config,
        tasks,
        output_dir,
        layers=_layers(),
        rows=FLAGS.rows,
        lstm_init=FLAGS.lstm_init,
        seeds=seeds,
        architectures=FLAGS.architectures,
    )


def _check_choices(name, choices):
    """A list flag naming one or more of `choices`, each once; else a one-line `ConfigError` naming it."""
    given = FLAGS[name].value
    if given is None:
        return
    unknown = [v for v in given if v not in choices]
    repeated = sorted({v for v in given if given.count(v) > 1})
    if given and not unknown and not repeated:
        return
    from kgpt.errors import ConfigError

    problem = (
        f"unknown {', '.join(map(repr, unknown))}"
        if unknown
        else f"{', '.join(map(repr, repeated))} given more than once"
        if repeated
        else "none given"
    )
    raise ConfigError(f"--{name} {','.join(given)!r}: {problem}; choose one or more of {', '.join(choices)}.")


def _seeds():
    if FLAGS.seeds is None:
        return None
    try:
        if not all(
            s.strip().isascii() and s.strip().removeprefix("-").isdigit() for s in FLAGS.seeds
        ):  # not "٣", "1_000"
            raise ValueError
        seeds = [int(s) for s in FLAGS.seeds]
    except ValueError:
        raise app.UsageError(
            f"--seeds: expected integers such as 0,1,2, got {','.join(FLAGS.seeds)!r}.", exitcode=2
        ) from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise app.UsageError(
            f"--seeds: expected distinct integers such as 0,1,2, got {','.join(FLAGS.seeds)!r}.", exitcode=2
        )
    for seed in seeds:  # each run's check_config checks its seed too, but only once the runs before it have trained
        try:
            low, high = config_lib.SEEDS
            config_lib.setting_int(seed, "each seed", low, maximum=high)
        except ValueError as e:
            raise app.UsageError(f"--seeds: {e}", exitcode=2) from None
    return seeds


def run():
    groups = {"Analysis": ["tasks", "layers", "rows", "lstm_init", "architectures", "seeds"], **train.GROUPS}
    common.run(main, "kgpt-analyze", __doc__, groups, modules=(train.__name__,), start=train.several_processes)


if __name__ == "__main__":
    run()
