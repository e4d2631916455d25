"""Predictions of a fine-tuned model on new text files: what `kgpt-predict` runs.

Inputs, one example per line or row:
- `text`: a plain file; tabs separate an example's segments (for multiple
  choice, the last fields are the answer choices). The id is the line number.
- `tsv`: a header row names the columns; `columns` picks the segments (by
  default every column but `id`/`index`/`idx`/`label`), and the `id`
  (or `index`/`idx`) column, when there is one, gives the ids.
- `jsonl`: one JSON object per line, keys as TSV columns; for multiple choice
  the last column may hold the list of choices.

The output is a TSV: `id`, `prediction` (label name, choice index or value),
and `p_<label>` per class or choice. A row that does not fit the model's
input transformation is a `DataError` naming `file:line`.

Example:
```python
model = kgpt.GPTTaskModel.from_preset("runs/sst2")
inputs = kgpt.jobs.predict.read_inputs("reviews.txt", model.preprocessor.transform)
kgpt.jobs.predict.write(model, inputs, "predictions.tsv")
```
"""

import collections
import logging
import os
import sys

from kgpt.data import batching
from kgpt.errors import ConfigError, DataError
from kgpt.jobs.finetune import prediction_columns, prediction_rows
from kgpt.data.readers import _data_lines, read_jsonl, read_tsv_columns
from kgpt.jobs.rundir import write_text
from kgpt.train import distribute

logger = logging.getLogger(__name__)

FORMATS = ("text", "tsv", "jsonl")
ID_COLUMNS = ("id", "index", "idx")
NOT_SEGMENTS = (*ID_COLUMNS, "label", "gold_label")

Inputs = collections.namedtuple("Inputs", "examples ids sources columns")


def guess_format(path):
    """`tsv` for `.tsv`, `jsonl` for `.jsonl`/`.json`, else `text`."""
    extension = os.path.splitext(path)[1].lower()
    return {".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}.get(extension, "text")


def read_inputs(path, transform, format=None, columns=None):
    """Reads `path` into `Inputs(examples, ids, sources, columns)`; examples are `(segments, choices)`.

    Every row is checked against `transform` (segment and choice counts);
    a bad one raises `DataError` naming `path:line`.
    """
    format = format or guess_format(path)
    if format not in FORMATS:
        raise ValueError(f"Unknown input format {format!r}: use one of {', '.join(FORMATS)}.")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No input file {path}.")
    if format == "text":
        if columns:
            raise ConfigError("columns name TSV or JSONL fields; a text file's fields are its tab-separated parts.")
        rows = ((n, None, line.split("\t")) for n, line in _data_lines(path))
        used = None
    else:
        rows, used = _named_rows(path, format, columns)
    examples, ids, sources = [], [], []
    for line_no, uid, fields in rows:
        source = f"{path}:{line_no}"
        example = _example(fields, transform, source)
        examples.append(example)
        ids.append(uid if uid is not None else str(line_no))
        sources.append(source)
    if not examples:
        raise DataError(f"{path}: no examples (the file is empty).")
    return Inputs(examples, ids, sources, used)


def _named_rows(path, format, columns):
    """`(rows, columns used)`; rows are `(line, id or None, [field values])`."""
    if format == "tsv":
        records = read_tsv_columns(path, required=columns or ())
    else:
        records = read_jsonl(path)
    records = iter(records)
    first = next(records, None)
    if first is None:
        raise DataError(f"{path}: no examples (the file is empty).")
    line_no, record = first
    used = list(columns) if columns else [k for k in record if k not in NOT_SEGMENTS]
    if not used:
        raise DataError(f"{path}:{line_no}: no text columns (it has only {', '.join(record)}); name them with columns.")
    id_column = next((c for c in ID_COLUMNS if c in record), None)

    def rows():
        for n, rec in ((line_no, record), *records):
            missing = [c for c in used if c not in rec or rec[c] is None]
            if missing:
                raise DataError(f"{path}:{n}: missing {', '.join(map(repr, missing))}.")
            uid = str(rec[id_column]).strip() if id_column and rec.get(id_column) is not None else None
            yield n, uid, [rec[c] for c in used]

    return rows(), used


def _example(fields, transform, source):
    choices = ()
    if transform.takes_choices:
        if fields and isinstance(fields[-1], list):
            fields, choices = fields[:-1], tuple(fields[-1])
        else:
            k = transform.num_views
            fields, choices = fields[:-k], tuple(fields[-k:]) if len(fields) > k else ()
    segments = tuple(fields)
    for text in (*segments, *choices):
        if not isinstance(text, str):
            raise DataError(f"{source}: a field is {type(text).__name__} {text!r:.60}, not text.")
        if not text.strip():
            raise DataError(f"{source}: an empty text field.")
    problem = transform.check(segments, choices)
    if problem:
        raise DataError(f"{source}: {problem}.")
    return segments, choices


def encode(preprocessor, inputs):
    """`inputs` -> an `EncodedSplit` (ids kept); truncation is counted in its `counts`."""
    builder = batching.SplitBuilder("inputs", preprocessor.transform.num_views, preprocessor.max_length)
    truncated = tokens_cut = 0
    for (segments, choices), uid in zip(inputs.examples, inputs.ids):
        views, cut = preprocessor.encode(segments, choices)
        truncated += cut > 0
        tokens_cut += cut
        builder.add(views, uid=uid)
    n = len(inputs.examples)
    return builder.build({"read": n, "used": n, "skipped": 0, "skipped_reasons": {}, "truncated": truncated,
                          "tokens_cut": tokens_cut})


def write(model, inputs, output, batch_size=32, verbose=0):
    """Predicts every example of `inputs` with `model` and writes the TSV to `output` (`-`: stdout).

    Returns the number of rows written.
    """
    split = encode(model.preprocessor, inputs)
    if split.counts["truncated"]:
        logger.info(f"{split.counts['truncated']} of {len(split)} examples are longer than max_length="
            f"{model.preprocessor.max_length} tokens per view: {split.counts['tokens_cut']} tokens were cut from the "
            f"end of their longest segments.")
    outputs = distribute.predict_outputs(model.task_predictor(), split, batch_size, verbose=verbose)
    head = model.head
    rows = prediction_rows(head, split.uids, head.decode(outputs), head.probabilities(outputs))
    text = "\n".join(["\t".join(["id", "prediction", *prediction_columns(head)]), *rows]) + "\n"
    if output == "-":
        sys.stdout.write(text)
    else:
        write_text(output, text)
    return len(split)
