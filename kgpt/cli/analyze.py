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
CSV and Markdown, plots as PNG) go to `--output_dir` (default `analysis`).
"""

import dataclasses

from absl import app, flags, logging

from kgpt.cli import common, train  # common first: quiet TensorFlow start-up
from kgpt.analysis import experiments as analysis

MODES = ("zero-shot", "zero-shot-curve", "transfer", "ablations")
DEFAULT_TASKS = {"zero-shot": ["sst2", "cola"], "zero-shot-curve": ["sst2", "cola"], "transfer": ["scitail"],
                 "ablations": ["cola", "sst2"]}

flags.DEFINE_list("tasks", None, "Tasks as NAME or NAME=DATA_DIR (NAME alone: its embedded data). Default: "
                  "sst2,cola for the zero-shot modes and ablations, scitail for transfer (which uses the first).")
flags.DEFINE_list("layers", None, "transfer: numbers of blocks to transfer (default 0..all).")
flags.DEFINE_list("rows", list(analysis.TABLE5), "ablations: Table 5 rows to run.")
flags.DEFINE_string("lstm_init", None, "ablations: the pre-trained LSTM preset for the lstm row "
                    "(kgpt-train --task lm --architecture lstm); pre-trained on the demo text without --init.")
flags.DEFINE_list("architectures", ["transformer", "lstm"], "zero-shot-curve: architectures to pre-train.")

FLAGS = flags.FLAGS


def main(argv):
    if len(argv) != 2 or argv[1] not in MODES:
        raise app.UsageError(f"Give one mode: {', '.join(MODES)} (kgpt-analyze MODE [flags]).", exitcode=2)
    mode = argv[1]
    logging.set_verbosity(logging.WARNING)
    output_dir = FLAGS.output_dir or "analysis"
    tasks = train.parse_task_dirs(FLAGS.tasks or DEFAULT_TASKS[mode])
    import keras

    print(f"kgpt-analyze {mode} on Keras {keras.__version__}, backend {keras.config.backend()}; "
          f"outputs in {output_dir}")
    if mode == "zero-shot":
        if FLAGS.init is None:
            raise app.UsageError("zero-shot needs --init: a pre-trained preset or original checkpoint.", exitcode=2)
        analysis.zero_shot_table(FLAGS.init, tasks, output_dir=output_dir)
    elif mode == "zero-shot-curve":
        FLAGS.zero_shot = None  # the tasks come from --tasks here
        base = dataclasses.replace(train.pretrain_config_from_flags(), zero_shot=tasks)
        analysis.zero_shot_curve(base, architectures=FLAGS.architectures, output_dir=output_dir)
    else:
        base = train.finetune_config_from_flags()
        if mode == "transfer":
            name, data_dir = next(iter(tasks.items()))
            layers = [int(n) for n in FLAGS.layers] if FLAGS.layers else None
            analysis.transfer_depth(dataclasses.replace(base, task=name, data_dir=data_dir), layers=layers,
                                    output_dir=output_dir)
        else:
            analysis.ablations(base, tasks, rows=FLAGS.rows, lstm_init=FLAGS.lstm_init, output_dir=output_dir)


def run():
    groups = {"Analysis": ["tasks", "layers", "rows", "lstm_init", "architectures"], **train.GROUPS}
    common.run(main, "kgpt-analyze", __doc__, groups, modules=(train.__name__,))


if __name__ == "__main__":
    run()
