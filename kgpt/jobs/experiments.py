"""The paper's analyses (section 5): transfer depth, zero-shot curves, Table 5 ablations.

Each function runs the experiments with `kgpt.jobs.finetune`/`kgpt.jobs.pretrain`,
writes its table as CSV and Markdown and, where the paper has a figure, a
PNG (matplotlib, no display needed). `kgpt-analyze` is the command line.
"""

import csv
import dataclasses
import logging
import os

import numpy as np

from kgpt.analysis import zero_shot as zero_shot_lib
from kgpt.errors import ConfigError, DataError
from kgpt.io import storage
from kgpt.jobs import finetune as finetune_lib
from kgpt.jobs import pretrain as pretrain_lib
from kgpt.jobs.config import DEMO_LSTM, DEMO_PRETRAIN, demo_pretrain_config
from kgpt.jobs.finetune_model import SPECIAL_INITS
from kgpt.models import pretrained as pretrained_lib
from kgpt.parallel import cluster
from kgpt.tasks.registry import TaskRegistry

logger = logging.getLogger(__name__)

# Table 5 of the paper (dev sets; mc = Matthews, pc = Pearson, F1, else accuracy).
ARCHITECTURES = ("transformer", "lstm")  # what zero_shot_curve pre-trains (PretrainConfig.architecture)
TABLE5_COLUMNS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte")
TABLE5 = {
    "full": (74.7, (45.4, 91.3, 82.3, 82.0, 70.3, 81.8, 88.1, 56.0)),
    "no_pretraining": (59.9, (18.9, 84.0, 79.4, 30.9, 65.5, 75.7, 71.2, 53.8)),
    "no_aux_lm": (75.0, (47.9, 92.0, 84.9, 83.2, 69.8, 81.1, 86.9, 54.4)),
    "lstm": (69.1, (30.3, 90.5, 83.2, 71.8, 68.1, 73.7, 81.1, 54.6)),
}
ROW_TITLES = {
    "full": "Transformer w/ aux LM (full)",
    "no_pretraining": "Transformer w/o pre-training",
    "no_aux_lm": "Transformer w/o aux LM",
    "lstm": "LSTM w/ aux LM",
}


def paper_value(row, task):
    """The paper's Table 5 number for `row` and `task`, or None."""
    if task not in TABLE5_COLUMNS:
        return None
    return TABLE5[row][1][TABLE5_COLUMNS.index(task)]


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only; works without a display
    import matplotlib.pyplot as plt

    return plt


def write_table(path_stem, header, rows):
    """Writes `rows` as `path_stem.csv` and a Markdown table `path_stem.md` (process 0); returns the Markdown."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    markdown = "\n".join(lines) + "\n"
    if not cluster.is_chief():
        return markdown
    os.makedirs(os.path.dirname(path_stem) or ".", exist_ok=True)
    with storage.naming(path_stem + ".csv"), open(path_stem + ".csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    with storage.naming(path_stem + ".md"), open(path_stem + ".md", "w") as f:
        f.write(markdown)
    return markdown


def _cell(value):
    if value is None:
        return "-"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def headline(task, results, split=None):
    """`(metric name, value x 100)` of the task's first metric on its evaluation split."""
    split = split or (task.splits[1] if len(task.splits) > 1 else task.splits[0])
    name = task.metric_names[0]
    scores = results["splits"].get(split, {})
    if name not in scores:
        raise DataError(f"Task {task.name!r}: no {name} on split {split!r} (is it labelled and present?).")
    return name, 100.0 * scores[name]


def _demo_pretrained(output_dir, architecture, seed):
    """Pre-trains the demo model of `architecture` on the embedded text (reused if already there)."""
    out = os.path.join(output_dir, "pretrained", architecture)
    if os.path.exists(os.path.join(out, "task.json")):
        logger.info(f"Reusing the demo {architecture} pre-trained in {out}.")
        return out
    settings = {**DEMO_PRETRAIN, **(DEMO_LSTM if architecture == "lstm" else {}), "architecture": architecture}
    logger.info(f"Pre-training the demo {architecture} on the embedded text ({settings}).")
    pretrain_lib.pretrain(demo_pretrain_config(**settings, output_dir=out, seed=seed))
    return out


# --- Figure 2 (left): transfer depth ------------------------------------------


def _init(base, output_dir):
    """`base.init`, or with `init="demo"` the demo transformer pre-trained in `output_dir/pretrained` (once)."""
    return _demo_pretrained(output_dir, "transformer", base.seed) if base.init in (None, "demo") else base.init


def check_starts(rows, init, lstm_init):
    """Raises `ConfigError` when the ablation `rows` would start from a model of the wrong architecture:
    `lstm_init` not an LSTM, or `init` (a local folder, or one of `SPECIAL_INITS`) not a transformer."""
    if "lstm" in rows and lstm_init is not None:
        pretrained_lib.check_architecture(lstm_init, "lstm", "--lstm_init")
    if set(rows) - {"lstm"} and init not in (None, *SPECIAL_INITS):
        pretrained_lib.check_architecture(init, "transformer", "--init")


def transfer_depth(base, layers=None, output_dir="analysis", registry=None):
    """Fine-tunes `base.task` with the embeddings + first n blocks transferred, for each n in `layers`.

    Args:
        base: a `FinetuneConfig` (task, data_dir, schedule); `init="demo"`
            pre-trains the demo model first.
        layers: numbers of blocks to transfer (default 0..num_layers).

    Writes `transfer_depth.{csv,md,png}` to `output_dir`; returns the rows
    `(layers, metric, value x 100)`.
    """
    registry = registry or TaskRegistry()
    task = registry.get(base.task)
    init = _init(base, output_dir)
    total = pretrained_lib.load_pretrained(init, num_heads=base.num_heads)[0].num_layers
    layers = list(range(total + 1)) if layers is None else sorted(set(layers))
    if not all(0 <= n <= total for n in layers):
        raise ConfigError(f"layers must be within 0..{total} (the model has {total} blocks), got {layers}.")
    rows = []
    for n in layers:
        logger.info(f"--- transfer depth: embeddings + {n} of {total} block(s) ---")
        config = dataclasses.replace(
            base, init=init, transfer_layers=n, output_dir=os.path.join(output_dir, "runs", f"transfer_{n}")
        )
        _, results = finetune_lib.finetune(config, registry)
        metric, value = headline(task, results)
        rows.append((n, metric, value))
    stem = os.path.join(output_dir, "transfer_depth")
    markdown = write_table(stem, ["layers transferred", "metric", f"{task.name} dev"], rows)
    if not cluster.is_chief():
        return rows
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r[0] for r in rows], [r[2] for r in rows], marker="o", label=f"{task.name} dev")
    ax.set(
        xlabel="# of layers transferred",
        ylabel=f"{rows[0][1]} (x100)",
        title=f"Transfer depth: {task.name} (paper Figure 2, left)",
    )
    ax.set_xticks([r[0] for r in rows])
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=120)
    plt.close(fig)
    logger.info(markdown + f"Wrote {stem}.csv, .md and .png")
    return rows


# --- Figure 2 (right): zero-shot performance during pre-training ---------------


def zero_shot_curve(base, architectures=("transformer", "lstm"), output_dir="analysis", registry=None, lstm=None):
    """Pre-trains each architecture with zero-shot evaluations every `base.zero_shot_every` steps.

    Args:
        base: a `PretrainConfig` with `zero_shot` set (tasks and data dirs).
        lstm: the settings the LSTM run replaces in `base` besides the
            architecture, e.g. `{"num_layers": 1, "lstm_units": 512}`
            (default: the demo LSTM's sizes when `base` has no corpus,
            else none).

    Writes `zero_shot_curve.{csv,md,png}`; returns the rows
    `(architecture, step, task, metric, value)`.
    """
    if not base.zero_shot:
        raise ConfigError("zero_shot_curve needs base.zero_shot: the tasks to evaluate.")
    architectures = list(architectures)
    if not architectures or len(set(architectures)) != len(architectures) or set(architectures) - set(ARCHITECTURES):
        raise ConfigError(
            f"architectures {architectures}: name one or more of {', '.join(ARCHITECTURES)}, each once "
            f"(--architectures)."
        )
    rows = []
    for architecture in architectures:
        overrides = {"architecture": architecture}
        if architecture == "lstm":
            overrides.update(DEMO_LSTM if lstm is None and base.corpus is None else lstm or {})
        out = os.path.join(output_dir, "runs", f"curve_{architecture}")
        config = dataclasses.replace(base, output_dir=out, **overrides)
        logger.info(f"--- zero-shot curve: pre-training the {architecture} ---")
        _, _, metrics = pretrain_lib.pretrain(config, registry)
        for key, points in metrics.get("zero_shot", {}).items():
            task, metric = key.split("/")
            rows += [(architecture, step, task, metric, value) for step, value in points]
    stem = os.path.join(output_dir, "zero_shot_curve")
    markdown = write_table(
        stem,
        ["architecture", "step", "task", "metric", "value (x100)"],
        [(a, s, t, m, round(100 * v, 2)) for a, s, t, m, v in rows],
    )
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    tasks = sorted({(r[2], r[3]) for r in rows})
    colours = dict(zip(tasks, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4))
    for architecture, style in zip(architectures, ("-", "--", ":", "-.")):
        for task, metric in tasks:
            points = [(r[1], r[4]) for r in rows if r[0] == architecture and r[2] == task]
            if points:
                ax.plot(
                    *zip(*points),
                    style,
                    marker="o",
                    color=colours[(task, metric)],
                    label=f"{task} {metric} ({architecture})",
                )
    ax.set(xlabel="pre-training updates", ylabel="zero-shot metric (accuracy, Matthews, ...)")
    ax.set_title("Zero-shot performance during pre-training (paper Figure 2, right)", fontsize=10)  # fits 6 in
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=120)
    plt.close(fig)
    logger.info(markdown + f"Wrote {stem}.csv, .md and .png")
    return rows


def zero_shot_table(init, tasks, output_dir=None, batch_size=32, registry=None):
    """Evaluates a pre-trained preset zero-shot on `tasks` (`{name: data_dir or None}`); returns results."""
    from kgpt.models.gpt.gpt_causal_lm import GPTCausalLM

    registry = registry or TaskRegistry()
    zero_shot_lib.check_tasks(tasks, registry)  # before the model is loaded
    backbone, tokenizer, origin = pretrained_lib.load_pretrained(init)
    lm = GPTCausalLM(backbone)
    logger.info(f"Zero-shot with the model from {origin}.")
    results, rows = {}, []
    for name, (task, data_dir) in zero_shot_lib.resolve_tasks(tasks, output_dir or ".", registry).items():
        result = zero_shot_lib.evaluate(lm, tokenizer, task, data_dir, batch_size=batch_size)
        results[name] = result
        majority = (result.get("baselines") or {}).get("majority_scores", {})
        for metric in task.metric_names:
            rows.append(
                (
                    name,
                    metric,
                    round(100 * result[metric], 2),
                    "" if majority.get(metric) is None else round(100 * majority[metric], 2),
                    task.zero_shot.description,
                )
            )
        logger.info(
            f"{name}: "
            + ", ".join(
                f"{m} {result[m]:.4f}" + (f" (majority label {majority[m]:.4f})" if majority.get(m) is not None else "")
                for m in task.metric_names
            )
            + f" ({result['examples']['used']} examples)"
        )
    if output_dir:
        columns = ["task", "metric", "value (x100)", "majority label (x100)", "heuristic"]
        write_table(os.path.join(output_dir, "zero_shot"), columns, rows)
        storage.write_json(os.path.join(output_dir, "zero_shot.json"), results)
    return results


# --- Table 5: ablations --------------------------------------------------------


def ablations(base, tasks, rows=tuple(TABLE5), lstm_init=None, output_dir="analysis", registry=None, seeds=None):
    """Runs the chosen Table 5 rows over `tasks` (`{name: data_dir or None}`).

    Rows: `full` (pre-trained transformer, aux LM 0.5), `no_pretraining`
    (same model and vocabulary, fresh weights), `no_aux_lm` (`lm_coef=0`),
    `lstm` (the pre-trained LSTM of `lstm_init`, aux LM 0.5). With
    `base.init="demo"`, the demo transformer and a demo LSTM are pre-trained
    on the embedded text first.

    `seeds` (default `[base.seed]`): every row is fine-tuned once per seed
    (runs `runs/ROW_TASK_seedS`); the table gives the mean, and
    `ablations_seeds.{csv,md}` each seed's value with the mean and standard
    deviation, since one fine-tuning of a small model on a small task varies
    by several points from seed to seed.

    Writes `ablations.{csv,md}` (ours beside the paper's numbers); returns
    `{row: {task: mean value x 100}}`.
    """
    rows = list(rows)
    unknown = [r for r in rows if r not in TABLE5]
    if unknown:
        raise ConfigError(f"Unknown ablation row(s) {unknown}; choose from {', '.join(TABLE5)}.")
    if not rows or len(set(rows)) != len(rows):
        raise ConfigError(f"Ablation rows {rows}: name one or more of {', '.join(TABLE5)}, each once (--rows).")
    registry = registry or TaskRegistry()
    check_starts(rows, base.init, lstm_init)  # before the demo models are pre-trained
    init = _init(base, output_dir)
    if "lstm" in rows and lstm_init is None:
        if base.init not in (None, "demo"):
            raise ConfigError(
                "The lstm row needs --lstm_init: an LSTM pre-trained on the same corpus "
                "(kgpt-train --task lm --architecture lstm --output_dir DIR)."
            )
        lstm_init = _demo_pretrained(output_dir, "lstm", base.seed)
    settings = {
        "full": {"init": init},
        "no_pretraining": {"init": init, "pretrained_weights": False},
        "no_aux_lm": {"init": init, "lm_coef": 0.0},
        "lstm": {"init": lstm_init},
    }
    seeds = [base.seed] if seeds is None else [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds must be distinct and at least one, got {seeds}.")
    by_seed = {row: {name: [] for name in tasks} for row in rows}
    for name, data_dir in tasks.items():
        task = registry.get(name)
        for seed in seeds:  # seeds outermost: a run stopped early still has every row for its first seeds
            for row in rows:
                run = f"{row}_{name}" + (f"_seed{seed}" if len(seeds) > 1 else "")
                logger.info(f"--- ablation {row} on {name}" + (f", seed {seed}" if len(seeds) > 1 else "") + " ---")
                config = dataclasses.replace(
                    base,
                    task=name,
                    data_dir=data_dir,
                    seed=seed,
                    **settings[row],
                    output_dir=os.path.join(output_dir, "runs", run),
                )
                _, results = finetune_lib.finetune(config, registry)
                by_seed[row][name].append(headline(task, results)[1])
    scores = {
        row: {name: float(np.mean(values)) for name, values in by_task.items()} for row, by_task in by_seed.items()
    }
    if len(seeds) > 1:
        _write_seed_table(os.path.join(output_dir, "ablations_seeds"), by_seed, seeds, registry)
    header = ["method", "avg"] + [f"{n} ({registry.get(n).metric_names[0]})" for n in tasks]
    table = []
    for row in rows:
        ours = [scores[row][n] for n in tasks]
        table.append([ROW_TITLES[row], float(np.mean(ours))] + ours)
        paper = [paper_value(row, n) for n in tasks]
        if any(v is not None for v in paper):
            average = TABLE5[row][0] if set(tasks) == set(TABLE5_COLUMNS) else None
            table.append([f"  paper: {ROW_TITLES[row]}", average] + paper)
    markdown = write_table(os.path.join(output_dir, "ablations"), header, table)
    logger.info(
        markdown + f"Wrote {os.path.join(output_dir, 'ablations')}.csv and .md (paper rows: Table 5, dev "
        "sets; '-' where the paper has no number)."
    )
    return scores


def _write_seed_table(stem, by_seed, seeds, registry):
    """Each seed's value of every row and task, with their mean and (sample) standard deviation."""
    header = ["method", "task"] + [f"seed {s}" for s in seeds] + ["mean", "sd"]
    table = [
        [
            ROW_TITLES[row],
            f"{name} ({registry.get(name).metric_names[0]})",
            *values,
            float(np.mean(values)),
            float(np.std(values, ddof=1)),
        ]
        for row, by_task in by_seed.items()
        for name, values in by_task.items()
    ]
    markdown = write_table(stem, header, table)
    logger.info(markdown + f"Wrote {stem}.csv and .md ({len(seeds)} seeds).")
