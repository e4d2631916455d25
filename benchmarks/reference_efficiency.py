"""Training efficiency against a reference at equal compute: kgpt (JAX, TensorFlow) beside Hugging Face's GPT-1.

    # kgpt's environment; the reference runs under a Python with torch + transformers < 5:
    python benchmarks/reference_efficiency.py --reference_python ENV/bin/python --reference_threads 1   # ~22 min
    python benchmarks/reference_efficiency.py --implementations kgpt-jax --work_dir /tmp/refeff
    python benchmarks/reference_efficiency.py --max_steps 100 --evaluations 4 --reference_seeds 0   # a quick look
    python benchmarks/reference_efficiency.py --report_only --work_dir /tmp/refeff   # every run there, together

    # such a Python, if there is none (torch and transformers are never kgpt dependencies):
    python -m venv ENV && ENV/bin/pip install torch "transformers<5" numpy

Every implementation trains the same small GPT-1 on the same token stream
and is evaluated on the same held-out windows at the same steps:

- The corpus (`--corpus`, default `../shared/real-data/corpus/*.txt` from the
  repository root) is tokenized once with a BPE vocabulary kgpt learns from
  it (`--num_merges`), as `kgpt-train --task lm --tokenizer train` does. The
  last `--validation_tokens` tokens are held out and cut into non-overlapping
  windows, as `kgpt-train` cuts them; the rest into windows of
  `--sequence_length + 1` tokens (stride `--sequence_length`). Batch `k` is
  rows `k * batch_size ...` of a fixed order of the training windows (one
  seeded permutation per pass over them). Windows, order and settings are
  saved in `--work_dir`, which every implementation reads.
- kgpt: `kgpt.GPTBackbone` + `kgpt.GPTCausalLM` compiled as `kgpt-train
  --task lm` compiles it (`kgpt.gpt_adamw`, the chunked LM loss), fed the
  saved batches in order through `tf.data`, once on each Keras backend.
- The reference: `transformers.OpenAIGPTLMHeadModel` (afn "gelu" is the tanh
  GELU there, as in kgpt; N(0, --initializer_range) weights, zero biases, post-LN blocks,
  dropout on embeddings, attention weights and residuals), trained with
  `torch.optim.AdamW` (betas 0.9/0.999, epsilon 1e-8, decoupled decay on
  every matrix and embedding but no bias or layer-norm parameter, as kgpt's
  `NO_DECAY_NAMES`), `clip_grad_norm_` at 1 and transformers'
  `get_cosine_schedule_with_warmup` (step 0 at learning rate 0, as
  `kgpt.WarmupSchedule`). Loss: mean next-token cross-entropy over every
  position (LM windows have no padding). `--reference_seeds 0,1` trains it
  twice, so the table shows the seed-to-seed spread beside the gap to kgpt.
  One difference is left as it is: Keras' Adam adds epsilon to the
  uncorrected sqrt(v), i.e. 1e-8 / sqrt(1 - 0.999^t) to the corrected one
  (~30x torch's 1e-8 at step 1, the same after a few thousand steps; both
  far below the gradients' scale here).

`--seeds 0,1,2` trains each kgpt implementation once per seed. Runs of
different implementations are not paired by seed (each draws its own random
numbers), so with several seeds the table compares the means over seeds at
every evaluation, with each difference's standard error. `--report_only`
trains nothing and prints the tables of every curve in `--work_dir` that was
run with its saved settings: seeds run in separate calls report together.
`--initial_draws 30` trains nothing either: it evaluates 30 untrained models
of each implementation, to tell a difference in the initialisation from the
draw of one seed.

Each implementation runs in its own process (`worker NAME WORK_DIR SEED`,
which imports only what that implementation needs: the reference's imports
no kgpt, Keras, TensorFlow or JAX) and writes `curve_NAME_seedS.json`; this process
prints the validation losses (nats per token, dropout off) side by side, the
differences at every evaluation against the `--target` (0.05 nats), and the
training speed (tokens/s without the first segment, which compiles; the
machine may be shared, so speeds are rough). It also prints the loss of the
training tokens' unigram frequencies on the held-out windows: small GPTs sit
near it for hundreds of steps, and curves that agree only there say less than
curves that agree after they leave it.

The defaults (4 x 256, 4 heads, 1024 inner, 64 tokens, batch 16, 400 steps,
warm-up 40, peak 1e-3, cosine to 0; an 8,000-merge BPE of the shared corpus:
615,192 tokens, vocabulary 8,443) took 22 minutes for all four runs on a
2-core CPU shared with another job; docs/benchmarks.md has the table.
"""

import glob
import json
import os
import subprocess
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's kgpt
IMPLEMENTATIONS = ("kgpt-jax", "kgpt-tensorflow", "reference")
VENV_HINT = 'python -m venv ENV && ENV/bin/pip install torch "transformers<5" numpy'


# ---- The shared token stream (NumPy only: the reference's process and the tests use these) ----


def training_windows(tokens, sequence_length):
    """`[n, sequence_length + 1]` windows of `tokens`, each starting where the last one's inputs end."""
    count = (len(tokens) - 1) // sequence_length
    if count < 1:
        raise ValueError(f"{len(tokens)} training tokens make no window of {sequence_length} + 1.")
    starts = np.arange(count) * sequence_length
    return np.asarray(tokens)[starts[:, None] + np.arange(sequence_length + 1)].astype(np.int32)


def validation_windows(tokens, sequence_length):
    """Non-overlapping `[n, sequence_length + 1]` windows of the held-out tokens (the last partial one dropped).

    The same cut as `kgpt.jobs.pretrain.validation_windows`, which `kgpt-train --task lm` evaluates on.
    """
    count = (len(tokens) - 1) // sequence_length
    if count < 1:
        raise ValueError(
            f"{len(tokens)} held-out tokens make no window of {sequence_length} + 1; raise --validation_tokens."
        )
    return np.stack([tokens[i * sequence_length : (i + 1) * sequence_length + 1] for i in range(count)]).astype(
        np.int32
    )


def batch_order(window_count, rows, seed):
    """`rows` indices into the training windows: seeded permutations, one per pass, end to end."""
    rng = np.random.default_rng(seed)
    passes = -(-rows // window_count)
    return np.concatenate([rng.permutation(window_count) for _ in range(passes)])[:rows].astype(np.int64)


def unigram_loss(train_tokens, val_tokens, vocabulary_size):
    """Cross-entropy (nats) of `val_tokens` under the training tokens' frequencies (add-one): a model's floor of
    knowing only which tokens are common, where small LMs sit for a while before they use the context."""
    counts = np.bincount(train_tokens, minlength=vocabulary_size) + 1.0
    return float(-np.mean(np.log(counts[val_tokens] / counts.sum())))


def evaluation_steps(max_steps, evaluations):
    """Steps after which every implementation evaluates: 0 (untrained), then `evaluations` evenly to the end."""
    if not 1 <= evaluations <= max_steps:
        raise ValueError(f"evaluations must be in [1, max_steps={max_steps}], got {evaluations}.")
    return [0] + [round(max_steps * (i + 1) / evaluations) for i in range(evaluations)]


def batches(work_dir, start, stop):
    """The training batches `[start, stop)` as one `[rows, sequence_length + 1]` array, in order."""
    with open(os.path.join(work_dir, "config.json")) as f:
        batch_size = json.load(f)["batch_size"]
    windows = np.load(os.path.join(work_dir, "train_windows.npy"), mmap_mode="r")
    order = np.load(os.path.join(work_dir, "order.npy"))
    return np.asarray(windows[order[start * batch_size : stop * batch_size]])


def write_json(path, value):
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=1)
    os.replace(path + ".tmp", path)


# ---- Workers: one implementation each, in its own process ----


def kgpt_model(work_dir, seed):
    """kgpt on the backend of `KERAS_BACKEND`, as `kgpt-train --task lm` builds and compiles it.

    Returns `(evaluate, train, versions)`: the held-out loss now, training batches `[start, stop)`.
    """
    from importlib.metadata import version

    import keras
    import tensorflow as tf

    import kgpt

    config = _read_config(work_dir)
    keras.utils.set_random_seed(seed)
    backbone = kgpt.GPTBackbone(
        vocabulary_size=config["vocabulary_size"],
        num_layers=config["num_layers"],
        num_heads=config["num_heads"],
        hidden_dim=config["hidden_dim"],
        intermediate_dim=config["intermediate_dim"],
        max_sequence_length=config["sequence_length"],
        dropout=config["dropout"],
        initializer_range=config.get("initializer_range", 0.02),
    )
    lm = kgpt.GPTCausalLM(backbone)
    # kgpt/jobs/pretrain.py's _compiled_lm, with its default lm_loss_chunk_size (1024).
    lm.compile(
        optimizer=kgpt.gpt_adamw(
            config["learning_rate"],
            warmup_steps=config["warmup_steps"],
            total_steps=config["max_steps"],
            weight_decay=config["weight_decay"],
        ),
        sampler="top_k",
        lm_loss_chunk_size=1024,
    )
    val = np.load(os.path.join(work_dir, "val_windows.npy"))
    val_x = {"token_ids": val[:, :-1], "padding_mask": np.ones_like(val[:, :-1])}

    def evaluate():
        logs = lm.evaluate(val_x, val[:, 1:], batch_size=config["eval_batch_size"], verbose=0, return_dict=True)
        return float(logs["loss"])

    def train(start, stop):
        rows = batches(work_dir, start, stop)
        x = {"token_ids": rows[:, :-1], "padding_mask": np.ones_like(rows[:, :-1])}
        # In order, as kgpt's pre-training feeds its own batches (tf.data, shuffle=False).
        data = tf.data.Dataset.from_tensor_slices((x, rows[:, 1:])).batch(config["batch_size"])
        logs = lm.fit(data, epochs=1, shuffle=False, verbose=0).history
        return float(logs["loss"][-1])

    return evaluate, train, f"kgpt {version('kgpt')}, keras {keras.__version__} {keras.config.backend()}"


def reference_model(work_dir, seed):
    """Hugging Face's `OpenAIGPTLMHeadModel` in PyTorch, with the paper's optimiser written in torch.

    Returns `(evaluate, train, versions)` as `kgpt_model` does.
    """
    import torch
    import transformers
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel, get_cosine_schedule_with_warmup

    config = _read_config(work_dir)
    if config["intermediate_dim"] != 4 * config["hidden_dim"]:
        raise SystemExit("OpenAIGPTLMHeadModel's MLP is 4 x hidden: set --intermediate_dim to 4 x --hidden_dim.")
    if config["reference_threads"]:
        torch.set_num_threads(config["reference_threads"])
    torch.manual_seed(seed)
    model = OpenAIGPTLMHeadModel(
        OpenAIGPTConfig(
            vocab_size=config["vocabulary_size"],
            n_positions=config["sequence_length"],
            n_embd=config["hidden_dim"],
            n_layer=config["num_layers"],
            n_head=config["num_heads"],
            afn="gelu",  # "gelu" is the tanh GELU there
            resid_pdrop=config["dropout"],
            embd_pdrop=config["dropout"],
            attn_pdrop=config["dropout"],
            layer_norm_epsilon=1e-5,
            initializer_range=config.get("initializer_range", 0.02),
        )
    )
    # Decay every matrix and embedding (the LM head is the token embedding, listed once), never a bias
    # or a layer-norm gain/offset: kgpt's NO_DECAY_NAMES.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": config["weight_decay"]},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=config["learning_rate"], betas=(0.9, 0.999), eps=1e-8)
    schedule = get_cosine_schedule_with_warmup(optimizer, config["warmup_steps"], config["max_steps"])
    val = torch.from_numpy(np.load(os.path.join(work_dir, "val_windows.npy")).astype(np.int64))

    def loss_of(rows):
        logits = model(input_ids=rows[:, :-1]).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))

    def evaluate():
        model.eval()
        total = 0.0
        with torch.no_grad():
            for i in range(0, len(val), config["eval_batch_size"]):
                rows = val[i : i + config["eval_batch_size"]]
                total += float(loss_of(rows)) * len(rows)
        model.train()
        return total / len(val)

    def train(start, stop):
        rows = torch.from_numpy(batches(work_dir, start, stop).astype(np.int64))
        losses = []
        for batch in rows.split(config["batch_size"]):
            loss = loss_of(batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
        return float(np.mean(losses))  # the segment's mean, as Keras' fit reports it

    return (
        evaluate,
        train,
        (f"transformers {transformers.__version__} torch {torch.__version__} ({torch.get_num_threads()} threads)"),
    )


def _read_config(work_dir):
    with open(os.path.join(work_dir, "config.json")) as f:
        return json.load(f)


def initial_worker(name, work_dir, draws):
    """The held-out loss of `draws` untrained models (seeds 0 .. draws - 1): the initialisation's distribution."""
    build = reference_model if name == "reference" else kgpt_model
    losses = []
    for seed in range(draws):
        losses.append(build(work_dir, seed)[0]())
        print(f"  seed {seed:3d}: val {losses[-1]:.4f}", flush=True)
        if name != "reference":
            import keras

            keras.backend.clear_session()  # one model at a time
    write_json(
        os.path.join(work_dir, f"initial_{name}.json"),
        {"implementation": name, "losses": losses, "settings": _read_config(work_dir)},
    )


def _train_loop(config, evaluate, train, versions):
    """Evaluates at every evaluation step, training between them; returns the curve and timings."""
    steps = config["evaluation_steps"]
    curve = [{"step": 0, "val_loss": evaluate(), "train_loss": None}]
    print(f"  step {0:5d}: val {curve[0]['val_loss']:.4f}", flush=True)
    segment_seconds = []
    for start, stop in zip(steps, steps[1:]):
        began = time.perf_counter()
        train_loss = train(start, stop)
        segment_seconds.append(time.perf_counter() - began)
        curve.append({"step": stop, "val_loss": evaluate(), "train_loss": train_loss})
        print(
            f"  step {stop:5d}: val {curve[-1]['val_loss']:.4f}  train {train_loss:.4f}  "
            f"({(stop - start) / segment_seconds[-1]:.2f} steps/s)",
            flush=True,
        )
    timed_steps = steps[-1] - steps[1]  # the first segment includes compilation
    timed = sum(segment_seconds[1:])
    tokens = config["batch_size"] * config["sequence_length"]
    return {
        "curve": curve,
        "versions": versions,
        "train_seconds": sum(segment_seconds),
        "steps_per_s": timed_steps / timed if timed else None,
        "tokens_per_s": timed_steps * tokens / timed if timed else None,
    }


def worker(name, work_dir, seed):
    started = time.perf_counter()
    result = _train_loop(
        _read_config(work_dir), *(reference_model if name == "reference" else kgpt_model)(work_dir, seed)
    )
    result.update(
        implementation=name, seed=seed, wall_seconds=time.perf_counter() - started, settings=_read_config(work_dir)
    )
    write_json(os.path.join(work_dir, f"curve_{name}_seed{seed}.json"), result)


# ---- The orchestration (kgpt's environment) ----


def define_flags():
    from absl import flags

    flags.DEFINE_string(
        "corpus",
        os.path.join(ROOT, "..", "shared", "real-data", "corpus", "*.txt"),
        "Glob of UTF-8 text files (never committed).",
    )
    flags.DEFINE_string("work_dir", "/tmp/kgpt_reference_efficiency", "Windows, order, settings and curves.")
    flags.DEFINE_list("implementations", list(IMPLEMENTATIONS), "Which to run: kgpt-jax, kgpt-tensorflow, reference.")
    flags.DEFINE_string(
        "reference_python",
        None,
        "Python with torch and transformers < 5 (default: a `python` on PATH that imports torch).",
    )
    flags.DEFINE_list("reference_seeds", ["0", "1"], "Seeds of the reference runs (two show the seed-to-seed noise).")
    flags.DEFINE_list("seeds", ["0"], "Seeds of kgpt's runs (each implementation runs once per seed).")
    flags.DEFINE_integer(
        "initial_draws",
        0,
        "Instead of training: the held-out loss of this many untrained "
        "models of each implementation (seeds 0 .. N-1), to compare the initialisations.",
        lower_bound=0,
    )
    flags.DEFINE_bool(
        "report_only",
        False,
        "Train nothing: print the tables of every curve in --work_dir run with "
        "its settings (runs from several calls together; the other settings flags are ignored).",
    )
    flags.DEFINE_integer("data_seed", 0, "Seed of the order of the training windows.")
    flags.DEFINE_integer("num_merges", 8000, "BPE merges learned from the corpus.")
    flags.DEFINE_integer("validation_tokens", 16384, "Tokens held out at the end of the stream.")
    flags.DEFINE_integer("num_layers", 4, "Transformer blocks.")
    flags.DEFINE_integer("num_heads", 4, "Attention heads.")
    flags.DEFINE_integer("hidden_dim", 256, "Hidden size.")
    flags.DEFINE_integer("intermediate_dim", 1024, "Feed-forward inner size (4 x hidden for the reference).")
    flags.DEFINE_integer("sequence_length", 64, "Tokens per window.")
    flags.DEFINE_integer("batch_size", 16, "Windows per step.")
    flags.DEFINE_integer("eval_batch_size", 64, "Windows per evaluation batch.")
    flags.DEFINE_integer("max_steps", 400, "Optimizer steps (the cosine ends here).")
    flags.DEFINE_integer("warmup_steps", 40, "Linear warm-up steps.")
    flags.DEFINE_integer("evaluations", 8, "Evaluations after step 0, evenly spaced.")
    flags.DEFINE_float("learning_rate", 1e-3, "Peak learning rate.")
    flags.DEFINE_float("weight_decay", 0.01, "Decoupled weight decay.")
    flags.DEFINE_float("dropout", 0.1, "Embedding, attention and residual dropout.")
    flags.DEFINE_float(
        "initializer_range",
        0.02,
        "Standard deviation of every weight's normal initialisation, on "
        "both sides (the paper's 0.02; 0.0625 = 256**-0.5 leaves the unigram plateau early).",
    )
    flags.DEFINE_integer(
        "reference_threads",
        0,
        "torch threads of the reference (0: torch's default, one per "
        "core; on a busy machine 1 can be several times faster).",
    )
    flags.DEFINE_float("target", 0.05, "Largest acceptable |kgpt - reference| validation loss, nats.")


def prepare(flags_values):
    """Writes the windows, their order and the vocabulary size; the corpus is tokenized once per corpus and merges.

    The tokens are kept in `work_dir/tokens.npy` and reused while the files
    (paths and sizes) and `--num_merges` are the same.
    """
    f = flags_values
    files = sorted(glob.glob(f.corpus))
    if not files:
        raise SystemExit(f"No corpus files match {f.corpus!r} (--corpus).")
    os.makedirs(f.work_dir, exist_ok=True)
    key = {"files": [[os.path.abspath(p), os.path.getsize(p)] for p in files], "num_merges": f.num_merges}
    key_path, tokens_path = os.path.join(f.work_dir, "tokens.json"), os.path.join(f.work_dir, "tokens.npy")
    saved = None
    if os.path.exists(key_path) and os.path.exists(tokens_path):
        with open(key_path) as file:
            saved = json.load(file)
    if saved and saved["key"] == key:
        tokens, vocabulary_size = np.load(tokens_path), saved["vocabulary_size"]
        print(f"Reusing the tokens in {tokens_path}.")
    else:
        import kgpt
        from kgpt.data.shards import build_shards

        began = time.perf_counter()
        tokenizer = kgpt.GPTTokenizer.train(files, num_merges=f.num_merges)  # as --tokenizer train
        index = build_shards(files, tokenizer, os.path.join(f.work_dir, "shards"))
        tokens, vocabulary_size = index.tokens(0, index.total_tokens), tokenizer.vocabulary_size()
        np.save(tokens_path, tokens)
        write_json(key_path, {"key": key, "vocabulary_size": vocabulary_size})
        print(f"Tokenized {len(files)} file(s) in {time.perf_counter() - began:.0f} s.")
    split = len(tokens) - f.validation_tokens
    train = training_windows(tokens[:split], f.sequence_length)
    val = validation_windows(tokens[split:], f.sequence_length)
    order = batch_order(len(train), f.max_steps * f.batch_size, f.data_seed)
    np.save(os.path.join(f.work_dir, "train_windows.npy"), train)
    np.save(os.path.join(f.work_dir, "val_windows.npy"), val)
    np.save(os.path.join(f.work_dir, "order.npy"), order)
    print(
        f"Data: {len(files)} file(s), {len(tokens):,} tokens, vocabulary {vocabulary_size:,}; {len(train):,} "
        f"training windows ({len(order) / len(train):.2f} passes in {f.max_steps} steps), {len(val)} validation "
        f"windows of {f.sequence_length}."
    )
    return vocabulary_size, unigram_loss(tokens[:split], val[:, 1:].ravel(), vocabulary_size)


def find_reference_python(given):
    """A Python that imports torch and transformers: `given`, else `python` on PATH; a clear error otherwise."""
    from kgpt._children import ends_with_this_process  # not at the top: the reference's Python runs this file

    candidates = [given] if given else ["python", "python3"]
    for python in candidates:
        try:
            ok = (
                subprocess.run(
                    [python, "-c", "import torch, transformers"],
                    capture_output=True,
                    preexec_fn=ends_with_this_process(),
                ).returncode
                == 0
            )
        except OSError:
            ok = False
        if ok:
            return python
    raise SystemExit(
        f"No Python with torch and transformers found ({', '.join(candidates)}); make one with\n  "
        f"{VENV_HINT}\nand pass --reference_python ENV/bin/python."
    )


def run_worker(python, name, work_dir, seed, env=None, mode="worker"):
    label = name if name != "reference" or mode != "worker" else f"reference seed {seed}"
    print(f"\n== {label} ==", flush=True)
    command = [python, os.path.abspath(__file__), mode, name, work_dir, str(seed)]
    from kgpt._children import ends_with_this_process  # not at the top: the reference's Python runs this file

    if subprocess.run(command, env=env, cwd=ROOT, preexec_fn=ends_with_this_process()).returncode:
        raise SystemExit(f"{label} failed: {' '.join(command)}")


def _seed_list(values, flag):
    from absl import app

    try:
        seeds = [int(v) for v in values]
    except ValueError:
        raise app.UsageError(f"{flag}: expected integers such as 0,1,2, got {','.join(values)!r}.") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise app.UsageError(f"{flag}: expected distinct integers such as 0,1,2, got {','.join(values)!r}.")
    return seeds


def saved_runs(work_dir):
    """`(implementation, seed)` of every curve in `work_dir` run with its current settings (`config.json`).

    Curves from other settings (or saved before curves recorded them) are left out and listed; the
    reference's thread count changes only its speed, so it may differ.
    """

    def training(settings):
        return {k: v for k, v in settings.items() if k != "reference_threads"}

    settings = training(_read_config(work_dir))
    runs, other = [], []
    for path in sorted(glob.glob(os.path.join(work_dir, "curve_*_seed*.json"))):
        with open(path) as f:
            curve = json.load(f)
        if training(curve.get("settings", {"unknown": True})) == settings:
            runs.append((curve["implementation"], curve["seed"]))
        else:
            other.append(os.path.basename(path))
    if other:
        print(f"Left out {len(other)} curve(s) run with other settings than {work_dir}/config.json: {', '.join(other)}")
    order = {name: i for i, name in enumerate(IMPLEMENTATIONS)}
    return sorted(runs, key=lambda run: (order.get(run[0], len(order)), run[1]))


def table(work_dir, runs, target):
    """Prints the curves side by side with their differences; returns whether kgpt met `target` everywhere.

    With one seed of each kgpt implementation, each is compared with the first reference seed run against
    run. With more, runs are not paired (the implementations draw different random numbers from the same
    seed): the means over seeds are compared, with their standard errors.
    """
    curves = {}
    for name, seed in runs:
        with open(os.path.join(work_dir, f"curve_{name}_seed{seed}.json")) as f:
            curves[(name, seed)] = json.load(f)
    references = [key for key in curves if key[0] == "reference"]
    kgpts = [key for key in curves if key[0] != "reference"]
    seeds = {key[1] for key in kgpts}
    per_implementation = {}
    for name, seed in kgpts:
        per_implementation.setdefault(name, []).append(seed)
    several = any(len(s) > 1 for s in per_implementation.values())
    label = {
        key: (f"ref s{key[1]}" if key[0] == "reference" else f"{key[0]} s{key[1]}" if len(seeds) > 1 else key[0])
        for key in curves
    }
    columns = [*kgpts, *references]
    diffs = [(k, references[0]) for k in kgpts] if references and not several else []  # alone: no gaps
    if len(references) > 1 and not several:
        diffs.append((references[1], references[0]))
    header = ["step", *(label[k] for k in columns), *(f"{label[a]} - {label[b]}" for a, b in diffs)]
    with open(os.path.join(work_dir, "config.json")) as f:
        unigram = json.load(f).get("unigram_val_loss")
    print(
        "\nValidation loss (nats per token, dropout off)"
        + (f"; the training tokens' unigram frequencies alone score {unigram:.4f}" if unigram else "")
        + "\n"
    )
    print("| " + " | ".join(header) + " |\n|" + " --- |" * len(header))
    worst = {pair: 0.0 for pair in diffs}
    for i, point in enumerate(curves[columns[0]]["curve"]):
        values = [curves[k]["curve"][i]["val_loss"] for k in columns]
        row = [str(point["step"]), *(f"{v:.4f}" for v in values)]
        for a, b in diffs:
            d = curves[a]["curve"][i]["val_loss"] - curves[b]["curve"][i]["val_loss"]
            worst[(a, b)] = max(worst[(a, b)], abs(d))
            row.append(f"{d:+.4f}")
        print("| " + " | ".join(row) + " |")
    print("\nTraining speed (tokens/s after the first segment, which compiles; the machine may be shared)\n")
    for k in columns:
        c = curves[k]
        print(
            f"  {label[k]:16s} {c['tokens_per_s']:9,.0f} tokens/s  {c['steps_per_s']:.2f} steps/s  "
            f"(train {c['train_seconds']:.0f} s, process {c['wall_seconds']:.0f} s; {c['versions']})"
        )
    if several:
        return seed_means(curves, target)
    met = True
    if references:
        print()
        for (a, b), value in worst.items():
            if a[0] == "reference":
                print(f"Seed-to-seed noise of the reference: largest |difference| {value:.4f} nats.")
                continue
            ok = value <= target
            met &= ok
            print(
                f"{label[a]} vs {label[b]}: largest |difference| {value:.4f} nats over {len(curves[a]['curve'])} "
                f"evaluations: {'within' if ok else 'MISSES'} the {target} target"
                + ("." if ok else " at some evaluation.")
            )
    return met


def seed_means(curves, target):
    """Prints each implementation's mean and sd over its seeds at every evaluation, and each kgpt mean minus
    the reference's with its standard error; returns whether every kgpt mean is within `target` of it."""
    groups = {}
    for (name, _), curve in curves.items():
        groups.setdefault(name, []).append([point["val_loss"] for point in curve["curve"]])
    steps = [point["step"] for point in next(iter(curves.values()))["curve"]]
    stats = {
        name: (np.mean(v, axis=0), np.std(v, axis=0, ddof=1) if len(v) > 1 else None, len(v))
        for name, v in groups.items()
    }
    kgpts = [name for name in groups if name != "reference"]
    compared = kgpts if "reference" in groups else []
    print(
        "\nMeans over seeds (sd across seeds in brackets); kgpt minus the reference, +- the standard error "
        "of that difference, sqrt(sd_a^2 / n_a + sd_b^2 / n_b)\n"
    )
    header = [
        "step",
        *(f"{name} ({stats[name][2]} seeds)" for name in groups),
        *(f"{name} - reference" for name in compared),
    ]
    print("| " + " | ".join(header) + " |\n|" + " --- |" * len(header))
    worst = {name: (0.0, None) for name in compared}
    for i, step in enumerate(steps):
        row = [str(step)]
        for name in groups:
            mean, sd, _ = stats[name]
            row.append(f"{mean[i]:.4f}" + (f" ({sd[i]:.4f})" if sd is not None else ""))
        for name in compared:
            (mean, sd, n), (ref_mean, ref_sd, ref_n) = stats[name], stats["reference"]
            difference = mean[i] - ref_mean[i]
            if abs(difference) > worst[name][0]:
                worst[name] = (abs(difference), step)
            error = (
                f" +- {np.sqrt(sd[i] ** 2 / n + ref_sd[i] ** 2 / ref_n):.4f}"
                if sd is not None and ref_sd is not None
                else ""
            )
            row.append(f"{difference:+.4f}{error}")
        print("| " + " | ".join(row) + " |")
    met = True
    print()
    for name in compared:
        value, step = worst[name]
        ok = value <= target
        met &= ok
        print(
            f"{name} (mean of {stats[name][2]}) vs the reference (mean of {stats['reference'][2]}): largest "
            f"|difference| {value:.4f} nats (step {step}): {'within' if ok else 'MISSES'} the {target} target."
        )
    return met


def initial_table(work_dir, names):
    """Prints the untrained loss's mean and sd over each implementation's draws, and each kgpt mean minus the
    reference's with its standard error."""
    draws = {}
    for name in names:
        with open(os.path.join(work_dir, f"initial_{name}.json")) as f:
            draws[name] = np.asarray(json.load(f)["losses"])
    print("\nHeld-out loss of untrained models (nats per token): the initialisations' distributions\n")
    print("| implementation | draws | mean | sd | minus the reference |\n| --- | --- | --- | --- | --- |")
    reference = draws.get("reference")
    for name, losses in draws.items():
        sd = np.std(losses, ddof=1) if len(losses) > 1 else float("nan")
        versus = ""
        if reference is not None and name != "reference" and len(losses) > 1 and len(reference) > 1:
            error = np.sqrt(sd**2 / len(losses) + np.var(reference, ddof=1) / len(reference))
            versus = f"{losses.mean() - reference.mean():+.4f} +- {error:.4f}"
        print(f"| {name} | {len(losses)} | {losses.mean():.4f} | {sd:.4f} | {versus} |")


def main(argv):
    from absl import app, flags

    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    f = flags.FLAGS
    unknown = set(f.implementations) - set(IMPLEMENTATIONS)
    if unknown:
        raise app.UsageError(f"Unknown implementations {sorted(unknown)}; choose from {', '.join(IMPLEMENTATIONS)}.")
    if "reference" in f.implementations and f.intermediate_dim != 4 * f.hidden_dim:
        raise app.UsageError("The reference's MLP is 4 x hidden: set --intermediate_dim to 4 x --hidden_dim.")
    if f.report_only:
        if not os.path.exists(os.path.join(f.work_dir, "config.json")):
            raise SystemExit(f"--report_only: no runs in {f.work_dir} (--work_dir): no config.json.")
        runs = saved_runs(f.work_dir)
        if not runs:
            raise SystemExit(f"--report_only: no curve in {f.work_dir} was run with its config.json's settings.")
        table(f.work_dir, runs, f.target)
        return
    seeds = _seed_list(f.seeds, "--seeds")
    _seed_list(f.reference_seeds, "--reference_seeds")
    reference_python = find_reference_python(f.reference_python) if "reference" in f.implementations else None
    vocabulary_size, unigram = prepare(f)
    config = {
        name: getattr(f, name)
        for name in (
            "num_layers",
            "num_heads",
            "hidden_dim",
            "intermediate_dim",
            "sequence_length",
            "batch_size",
            "eval_batch_size",
            "max_steps",
            "warmup_steps",
            "learning_rate",
            "weight_decay",
            "dropout",
            "initializer_range",
            "reference_threads",
        )
    }
    config.update(
        vocabulary_size=vocabulary_size,
        evaluation_steps=evaluation_steps(f.max_steps, f.evaluations),
        unigram_val_loss=unigram,
    )
    write_json(os.path.join(f.work_dir, "config.json"), config)
    print(f"Settings: {json.dumps(config)}")
    if f.initial_draws:
        for name in f.implementations:
            python, env = (
                (reference_python, None)
                if name == "reference"
                else (sys.executable, dict(os.environ, KERAS_BACKEND=name.split("-", 1)[1]))
            )
            run_worker(python, name, f.work_dir, f.initial_draws, env, mode="initial")
        initial_table(f.work_dir, f.implementations)
        return
    runs = []
    for name in f.implementations:
        if name == "reference":
            for seed in (int(s) for s in f.reference_seeds):
                run_worker(reference_python, name, f.work_dir, seed)
                runs.append((name, seed))
        else:
            env = dict(os.environ, KERAS_BACKEND=name.split("-", 1)[1])
            for seed in seeds:
                run_worker(sys.executable, name, f.work_dir, seed, env)
                runs.append((name, seed))
    table(f.work_dir, runs, f.target)


if __name__ == "__main__":
    if sys.argv[1:2] in (["worker"], ["initial"]):  # no absl: the reference's Python may have only torch
        if len(sys.argv) != 5 or sys.argv[2] not in IMPLEMENTATIONS:
            sys.exit(f"usage: {sys.argv[0]} {{worker,initial}} {{{','.join(IMPLEMENTATIONS)}}} WORK_DIR SEED_OR_DRAWS")
        (worker if sys.argv[1] == "worker" else initial_worker)(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        from absl import app

        define_flags()
        app.run(main)
