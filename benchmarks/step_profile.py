"""Reading a profiler trace of training steps: per-op seconds, grouped into classes of the model's work.

`benchmarks/profile_step.py` captures the trace; this module turns it into
the table. Both backends write an XSpace (`*.xplane.pb`), which
`jax.profiler.ProfileData` reads without TensorBoard's profile plugin. The
op events carry the XLA instruction (JAX: `hlo_op`, looked up in the
compiled module's text for the JAX name scope of the code that made it) or
the TensorFlow op's name (Keras' name scopes), and both name the layer: a
class is picked from that path by the rules of `CLASSES`.
"""

import collections
import glob
import os
import re

import numpy as np

# (class, test on the op's name-scope path (lower case) and its XLA opcode / TF op type), first match wins.
# Dropout's random bits come before the layers they sit in; the data movement rule only sees ops that are
# nothing but copies and transposes.
CLASSES = [
    (
        "dropout: random bits",
        lambda p, op: (
            "dropout" in p
            and re.search(
                r"bernoulli|uniform|random|threefry|rng|"
                r"philox|stateless",
                p,
            )
            is not None
        ),
    ),
    ("dropout: mask applied", lambda p, op: "dropout" in p),
    (
        "optimizer update",
        lambda p, op: (
            re.search(
                r"adam|optimizer|/sgd|apply_gradient|assignaddvariable|"
                r"resourceapply|assignvariable",
                p,
            )
            is not None
        ),
    ),
    (
        "LM loss: tied logits, softmax, cross-entropy",
        lambda p, op: "compile_loss" in p or "tied_lm" in p or "lm_loss" in p or "sparse_softmax" in p,
    ),
    # The attention's own arithmetic runs in the block's scope, outside its sublayers (TF names it MatMul,
    # transpose, ...; JAX by the einsum), but for the softmax layer.
    (
        "attention: scores, mask, softmax, x values",
        lambda p, op: (
            "attention_softmax" in p
            or re.search(
                r"transformer_layer_\d+(?:_\d+)?/(?!(?:query|key|value|attention_output|feedforward|self_attention|"
                r"attention_probs)\w*/)",
                p,
            )
            is not None
        ),
    ),
    (
        "gelu",
        lambda p, op: (
            "feedforward_intermediate_dense" in p
            and re.search(r"tanh|integer_pow|pow|/mul|/sub|/add_1|gelu", p) is not None
            and "dot_general" not in p
            and "matmul" not in p
            and "biasadd" not in p
        ),
    ),
    ("layer norm", lambda p, op: "layer_norm" in p),
    (
        "dense layers: matmuls and biases",
        lambda p, op: re.search(r"query|key|value|attention_output|feedforward_|classifier", p) is not None,
    ),
    ("embeddings (lookup, gradient scatter)", lambda p, op: "embedding" in p),
]
MOVEMENT = "transposes, copies, layout"
OTHER = "other (unattributed)"
MOVEMENT_OPS = {
    "copy",
    "transpose",
    "bitcast",
    "reshape",
    "broadcast",
    "slice",
    "concatenate",
    "dynamic-slice",
    "dynamic-update-slice",
    "pad",
    "parameter",
    "constant",
    "tuple",
    "get-tuple-element",
    "iota",
    "copy-start",
    "copy-done",
    "convert",
}


def classify(path, opcode, movement=False):
    """The class of an op from its name-scope path, its opcode and whether it only moves data."""
    lower = path.lower()
    for name, rule in CLASSES[:2]:  # dropout first: its copies (the rolled loop's state) are the RNG's
        if rule(lower, opcode):
            return name
    if movement:
        return MOVEMENT
    for name, rule in CLASSES[2:]:
        if rule(lower, opcode):
            return name
    return OTHER


def direction(path):
    """'forward', 'backward' or 'update' (JAX: `transpose(jvp(...))` is the backward pass; TF: `gradient_tape/`)."""
    lower = path.lower()
    if re.search(r"adam|optimizer|assignaddvariable|resourceapply|assignvariable", lower):
        return "update"
    if "transpose(jvp" in lower or "gradient_tape/" in lower or "gradients/" in lower:
        return "backward"
    return "forward"


# --- XLA's compiled module (JAX) --------------------------------------------------------------------------

INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*?) ([\w\-]+)\(")
COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")


def hlo_instructions(text):
    """`{instruction: (opcode, op_name path, only moves data, element type)}` from a compiled module's text."""
    computations, current = {}, None
    for line in text.splitlines():
        match = COMPUTATION.match(line)
        if match and "=" not in line.split("(")[0]:
            current = computations.setdefault(match.group(1), [])
            continue
        match = INSTRUCTION.match(line)
        if match and current is not None:
            name, shape, opcode = match.groups()
            path = re.search(r'op_name="([^"]*)"', line)
            called = re.search(r"calls=%?([\w.\-]+)", line)
            current.append(
                (
                    name,
                    opcode,
                    path.group(1) if path else "",
                    called.group(1) if called else None,
                    shape.lstrip("(").split("[")[0],
                )
            )
    info = {}
    for instructions in computations.values():
        for name, opcode, path, called, dtype in instructions:
            inner = computations.get(called, [])
            if not path:  # a fusion without metadata: the first op inside that has some
                path = next((p for _, _, p, _, _ in inner if p), "")
            movement = opcode in MOVEMENT_OPS or (
                opcode == "fusion" and bool(inner) and all(o in MOVEMENT_OPS for _, o, _, _, _ in inner)
            )
            if dtype in ("u32", "u64") and not path:
                path = "dropout/random bits"  # an unnamed copy of the RNG loop's uint32 state
            info[name] = (opcode, path, movement, dtype)
    return info


# --- the trace --------------------------------------------------------------------------------------------


def latest_xplane(trace_dir):
    """The newest `*.xplane.pb` a profiler session wrote under `trace_dir`."""
    files = glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "*.xplane.pb"))
    if not files:
        raise FileNotFoundError(f"No *.xplane.pb under {trace_dir}/plugins/profile: the profiler wrote no trace.")
    return max(files, key=os.path.getmtime)


def exclusive(events):
    """`[(event, self ns)]` of one thread's events: each event's duration less that of the events nested in it."""
    events = sorted(events, key=lambda e: (e[0], -e[1]))  # (start, duration, payload)
    result, stack = [], []  # stack of [end, index into result]
    for start, duration, payload in events:
        while stack and stack[-1][0] <= start:
            stack.pop()
        if stack:
            result[stack[-1][1]][1] -= min(duration, stack[-1][0] - start)
        result.append([payload, duration])
        stack.append([start + duration, len(result) - 1])
    return result


def xla_ops(xplane, module_prefix):
    """JAX: `(ops, runs)` of an XLA module in a trace.

    ops: `[(hlo_op, self ns)]` over every thread; runs: `{run_id: [first op start, last op end]}` (ns), one per
    execution of the module.
    """
    import jax

    data = jax.profiler.ProfileData.from_file(xplane)
    ops, runs = [], {}
    for plane in data.planes:
        if not plane.name.startswith("/host:CPU") and not plane.name.startswith("/device:"):
            continue
        for line in plane.lines:
            events = []
            for event in line.events:
                stats = dict(event.stats)
                if not str(stats.get("hlo_module", "")).startswith(module_prefix) or "hlo_op" not in stats:
                    continue
                start, duration = event.start_ns, event.duration_ns
                events.append((start, duration, stats["hlo_op"]))
                run = runs.setdefault(stats.get("run_id", 0), [start, start + duration])
                run[0], run[1] = min(run[0], start), max(run[1], start + duration)
            ops += exclusive(events)
    return ops, runs


def tf_ops(xplane):
    """TensorFlow: `[(op name, op type, self ns)]` of the TF ops the executors ran in a trace."""
    import jax

    data = jax.profiler.ProfileData.from_file(xplane)
    ops = []
    for plane in data.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        for line in plane.lines:
            if line.name == "python":
                continue
            events = []
            for event in line.events:
                name = event.name
                # TF's executors name an op event "scope/.../op_name:OpType"; the runtime's own events (a
                # function's whole execution among them) are not ops
                if ":" not in name or "::" in name or name.startswith(("$", "EagerLocalExecute")):
                    continue
                op_name, op_type = name.rsplit(":", 1)
                events.append((event.start_ns, event.duration_ns, (op_name, op_type)))
            ops += [(op_name, op_type, ns) for (op_name, op_type), ns in exclusive(events)]
    return ops


def table(rows, steps):
    """`[(class, forward ms, backward ms, update ms, ms, share)]` per step from `[(class, direction, ns)]`."""
    by_class = collections.defaultdict(lambda: collections.Counter())
    for name, way, ns in rows:
        by_class[name][way] += ns / 1e6 / steps
    total = sum(sum(c.values()) for c in by_class.values())
    out = []
    for name, counter in sorted(by_class.items(), key=lambda kv: -sum(kv[1].values())):
        ms = sum(counter.values())
        out.append((name, counter["forward"], counter["backward"], counter["update"], ms, ms / total if total else 0))
    return out, total


def run_stats(runs, steps):
    """`(median start-to-start ms, median run span ms)` of the module's last `steps` executions."""
    spans = sorted(runs.values())[-steps:]
    starts = [s for s, _ in spans]
    periods = np.diff(starts) / 1e6 if len(starts) > 1 else np.array([np.nan])
    return float(np.median(periods)), float(np.median([(e - s) / 1e6 for s, e in spans]))
