"""`kgpt-predict`: a fine-tuned model's predictions on new text.

    kgpt-predict --model runs/sst2 --input reviews.txt --output predictions.tsv
    kgpt-predict --model runs/reviews --input new.csv --output labelled.csv
    kgpt-predict --model runs/rte --input pairs.jsonl --columns premise,hypothesis --output -
    kgpt-predict --model runs/rte --data_dir glue/RTE --split test --output rte_test.tsv

`--model` is a `kgpt-train --task NAME --output_dir`. A table (.csv, .tsv,
.jsonl) comes back whole with `prediction` and `p_<label>` per label (or the
value, for regression) added, in the format of --output's extension; a text
file gives a TSV of `id`, `prediction` and `p_<label>`; with `--data_dir` it
also holds the labels and the task's metrics are printed. See
`kgpt.jobs.predict` for the input formats.
"""

import os
import sys

from absl import app, flags

from kgpt.cli import common  # first: quiet TensorFlow start-up

logger = common.command_logger("predict")

flags.DEFINE_string(
    "model",
    None,
    "A fine-tuned preset: the --output_dir of kgpt-train --task NAME, or "
    "hf://OWNER/REPO[@REVISION] where one was uploaded (kgpt.upload_preset).",
)
flags.DEFINE_string(
    "input",
    None,
    "Examples to predict: a text file (one per line, tabs between segments), "
    "or a table: a .csv or .tsv with a header row, or a .jsonl.",
)
flags.DEFINE_enum("format", None, ["text", "csv", "tsv", "jsonl"], "Input format (default: from the extension).")
flags.DEFINE_list(
    "columns",
    None,
    "Table columns holding the segments, in order, answer choices last (default: "
    "the columns the model was trained on with --text_columns/--choice_columns, else all but "
    "id/index/idx/label/gold_label).",
)
flags.DEFINE_string("data_dir", None, "Instead of --input: the task's data in its own format (needs its plugin).")
flags.DEFINE_string("split", "test", "With --data_dir: the split to predict (--input has none).")
flags.DEFINE_string(
    "output",
    None,
    "The predictions ('-': standard output): a table's rows with the predictions "
    "added, as .csv, .tsv or .jsonl by the extension (default: the input's format); a TSV for a "
    "text file.",
)
flags.DEFINE_bool("overwrite", False, "Replace an existing --output file.")
flags.DEFINE_integer("batch_size", 32, "Examples per batch (batches are formed by length).", lower_bound=1)
flags.DEFINE_integer(
    "max_length", None, "Tokens per view (default: the model's own); longer ones are cut and counted.", lower_bound=4
)

flags.DEFINE_enum(
    "quantize",
    None,
    ["int8"],
    "Quantize the model's kernels after loading (an int8 preset "
    "loads quantized without it); docs/lora-int8.md has what it changes in speed and score.",
)

FLAGS = flags.FLAGS


def _check_flags():
    if not FLAGS.model:
        raise app.UsageError("--model is required: the --output_dir of a kgpt-train --task NAME run.", exitcode=2)
    if bool(FLAGS.input) == bool(FLAGS.data_dir):
        raise app.UsageError("Pass either --input FILE or --data_dir DIR (with --split).", exitcode=2)
    if FLAGS.input and FLAGS["split"].present:
        raise app.UsageError(
            f"--split {FLAGS.split} picks a split of --data_dir; --input {FLAGS.input} is predicted whole: drop --split.",
            exitcode=2,
        )
    if not FLAGS.output:
        raise app.UsageError("--output is required (a file, or - for standard output).", exitcode=2)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
    _check_flags()
    import kgpt
    from kgpt.jobs import dry_run, finetune_data, finetune_outputs, predict

    if FLAGS.output == "-":  # the predictions own standard output
        common.log_to_stderr()
    written = "text" if FLAGS.data_dir else FLAGS.format or predict.guess_format(FLAGS.input)
    from kgpt.io import hub, storage

    local_model = None if hub.is_hub(FLAGS.model) else FLAGS.model
    predict.check_output(FLAGS.output, written, FLAGS.overwrite, FLAGS.input, local_model)  # before the model loads

    for flag in ("input", "data_dir") + (() if hub.is_hub(FLAGS.model) else ("model",)):
        storage.check_local(FLAGS[flag].value, f"--{flag}")

    model_dir = hub.local(FLAGS.model, kgpt.GPTBackbone)  # a Hub preset's local folder, downloaded once
    predict.check_model(model_dir, FLAGS.model)
    if FLAGS.dry_run:
        predict.view_length(model_dir, FLAGS.max_length)  # the warning loading the model gives
        dry_run.predict(
            model_dir,
            FLAGS.output,
            FLAGS.overwrite,
            FLAGS.input,
            FLAGS.format,
            FLAGS.columns,
            FLAGS.data_dir,
            FLAGS.split,
        )
        return
    model = kgpt.GPTTaskModel.from_preset(model_dir, sequence_length=FLAGS.max_length)
    if FLAGS.quantize:
        from kgpt.layers import int8

        already = int8.is_quantized(model)
        int8.quantize(model, FLAGS.quantize)
        logger.info(
            f"--quantize {FLAGS.quantize}: "
            + (
                "the model was saved quantized already."
                if already
                else "the attention, MLP and head kernels are now int8 (the embeddings stay float32)."
            )
        )
    logger.info(
        f"kgpt-predict: {model.task_name} model from {FLAGS.model} ({model.head.kind} head, "
        f"{model.preprocessor.transform.kind} input)."
    )
    verbose = 1 if os.isatty(1) and FLAGS.output != "-" else 0  # Keras draws its progress bar on stdout
    if FLAGS.input:
        columns = predict.columns_for(model_dir, FLAGS.input, FLAGS.format, FLAGS.columns, model.preprocessor.transform)
        inputs = predict.read_inputs(
            FLAGS.input, model.preprocessor.transform, FLAGS.format, columns, predict.trained_columns(model_dir)
        )
        if inputs.columns:
            logger.info(f"Segments from column(s) {', '.join(inputs.columns)}.")
        count = predict.write(model, inputs, predict.through_link(FLAGS.output), FLAGS.batch_size, verbose=verbose)
    else:
        task = kgpt.TaskRegistry().get(model.task_name)
        if hasattr(task, "with_files"):  # its registered form reads only its embedded demo's files
            raise kgpt.ConfigError(
                f"--data_dir reads a task's own format; a {model.task_name} model reads your "
                f"tables: pass --input FILE (.csv, .tsv or .jsonl)."
            )
        predict.check_output_not_read(FLAGS.output, task, FLAGS.split, FLAGS.data_dir)
        split = finetune_data.encode_split(task, FLAGS.split, FLAGS.data_dir, model.preprocessor)
        logger.info(finetune_data.describe_counts(FLAGS.split, split.counts))  # rows skipped or cut, as training says
        evaluation = finetune_outputs.evaluate_split(task, model, split, FLAGS.batch_size)
        if evaluation.metrics:
            logger.info(f"{FLAGS.split}: " + ", ".join(f"{k} {v:.4f}" for k, v in evaluation.metrics.items()))
        if FLAGS.output == "-":
            sys.stdout.write(finetune_outputs.predictions_tsv(task, split, evaluation))
        else:
            with predict.writing(FLAGS.output):
                finetune_outputs.write_predictions(predict.through_link(FLAGS.output), task, split, evaluation)
        count = len(split)
    logger.info(f"Wrote {count:,} predictions to {'standard output' if FLAGS.output == '-' else FLAGS.output}.")


GROUPS = {
    "Model and inputs": ["model", "quantize", "input", "format", "columns", "data_dir", "split"],
    "Output": ["output", "overwrite"],
    "Batching": ["batch_size", "max_length"],
    "Checks and errors": ["dry_run", "verbose"],
}


def run():
    common.run(main, "kgpt-predict", __doc__, GROUPS)


if __name__ == "__main__":
    run()
