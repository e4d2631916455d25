"""GPT-1 tokenizer benchmarks: agreement with the original algorithm, and tokens/s of shard building.

    # Agreement, line by line, with reference ids from benchmarks/tokenizer_reference.py:
    python benchmarks/tokenizer.py agreement --text tests/data/prose.txt --reference tests/data/prose_ids.json

    # Shard building: tokens/s for each splitter and worker count, CPU time per token, where the time goes:
    python benchmarks/tokenizer.py speed --files 'books/*.txt' --workers 1,2,4

`agreement` prints, per splitter, the share of lines encoded exactly as the
reference and the share of tokens that agree (difflib alignment), with the
most frequent disagreements. `speed` builds the shards of the files with
`kgpt.data.shards.build_shards` `--repeats` times per worker count, each build
in a fresh process (caches cold, as a real run starts) and the worker counts
taken in turn, and reports the medians: wall-clock tokens/s, the ratio to one process,
tokens per CPU-second of all processes (the per-core rate) and the load
average, since other programs on the machine change every wall-clock figure.
It then times the stages of one process on the same text: ftfy, finding
words and the groups spaCy reads together, spaCy (or the regex) and BPE on
words not seen before, and the cache lookups for the rest.
"""

import argparse
import collections
import difflib
import glob
import itertools
import json
import os
import sys
import tempfile
import time

from kgpt._children import ends_with_this_process

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def agreement(args):
    import kgpt

    with open(args.text, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    with open(args.reference, encoding="utf-8") as f:
        reference = json.load(f)["lines"]
    if len(reference) != len(lines):
        sys.exit(f"{args.reference} has {len(reference)} lines, {args.text} {len(lines)}: regenerate the reference.")
    print(f"{len(lines):,} lines of {args.text}; reference {args.reference}")
    print("| splitter | lines identical | tokens in agreement |\n| --- | --- | --- |")
    for splitter in ("regex", "spacy"):
        tokenizer = kgpt.GPTTokenizer.gpt1(splitter=splitter)
        same = matched = total = 0
        differences = collections.Counter()
        for line, expected in zip(lines, reference):
            ids = tokenizer.encode(line)
            total += max(len(ids), len(expected))
            if ids == expected:
                same += 1
                matched += len(ids)
                continue
            blocks = difflib.SequenceMatcher(None, ids, expected, autojunk=False).get_matching_blocks()
            matched += sum(block.size for block in blocks)
            for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ids, expected, autojunk=False).get_opcodes():
                if tag != "equal":
                    ours = " ".join(tokenizer.decoder[i] for i in ids[i1:i2])
                    theirs = " ".join(tokenizer.decoder[i] for i in expected[j1:j2])
                    differences[(ours, theirs)] += 1
        print(f"| {splitter} | {same / len(lines):.1%} ({same:,}/{len(lines):,}) | {matched / max(total, 1):.2%} |")
        for (ours, theirs), n in differences.most_common(args.examples):
            print(f"|   | {n:,} x | {ours!r} where the reference has {theirs!r} |")


def _load():
    return os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3


def build_once(args):
    """One shard build in this fresh process (caches cold, as a real run starts); prints its figures as JSON."""
    import kgpt
    from kgpt.data.shards import build_shards

    tokenizer = kgpt.GPTTokenizer.gpt1(splitter=args.splitters)
    tokenizer.encode("Loads spaCy's rules before the clock starts.")
    with tempfile.TemporaryDirectory() as directory:
        before, start = os.times(), time.perf_counter()
        index = build_shards(_files(args), tokenizer, directory, workers=int(args.workers))
        seconds, after = time.perf_counter() - start, os.times()
    cpu = sum(getattr(after, k) - getattr(before, k) for k in ("user", "system", "children_user", "children_system"))
    print(json.dumps({"tokens": index.total_tokens, "seconds": seconds, "cpu": cpu}))


def _files(args):
    files = sorted(itertools.chain.from_iterable(glob.glob(p) for p in args.files.split(",")))
    if not files:
        sys.exit(f"No files match {args.files!r}.")
    return files


def speed(args):
    import statistics
    import subprocess

    files = _files(args)
    size = sum(os.path.getsize(f) for f in files)
    print(
        f"{len(files)} file(s), {size / 1e6:.1f} MB; load average {_load()[0]:.2f} at the start; "
        f"median of {args.repeats} build(s) per row, each in a fresh process, the rows' runs interleaved"
    )
    print("| splitter | workers | tokens | seconds | tokens/s | vs 1 | tokens per CPU-second | load |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for splitter in args.splitters.split(","):
        runs = collections.defaultdict(list)
        for _ in range(args.repeats):
            for workers in args.workers.split(","):
                command = [
                    sys.executable,
                    os.path.abspath(__file__),
                    "build-once",
                    "--files",
                    args.files,
                    "--workers",
                    workers,
                    "--splitters",
                    splitter,
                ]
                out = subprocess.run(
                    command, check=True, capture_output=True, text=True, preexec_fn=ends_with_this_process()
                ).stdout
                runs[int(workers)].append(json.loads(out.strip().splitlines()[-1]))
        rates = {}
        for workers, results in runs.items():
            seconds = statistics.median(r["seconds"] for r in results)
            cpu = statistics.median(r["cpu"] for r in results)
            tokens = results[0]["tokens"]
            rates[workers] = tokens / seconds
            ratio = rates[workers] / rates[min(rates)]
            print(
                f"| {splitter} | {workers} | {tokens:,} | {seconds:.2f} | {rates[workers]:,.0f} | {ratio:.2f}x "
                f"| {tokens / cpu:,.0f} | {_load()[0]:.2f} |"
            )
    if args.stages:
        _stages(args, files)


def _stages(args, files):
    import kgpt
    from kgpt.data.text import text_chunks

    chunks = [c for path in files for c in text_chunks(path)]
    for splitter in args.splitters.split(","):
        print(f"\nWhere one process spends its time ({splitter}, caches cold, then warm):")
        for name, passes in (("cold", 1), ("warm", 2)):
            encoder = kgpt.GPTTokenizer.gpt1(splitter=splitter).text_encoder
            encoder.encode("Loads spaCy's rules before the clock starts.")
            for _ in range(passes):
                times, tokens = stage_times(encoder, chunks)
            total = sum(times.values())
            parts = ", ".join(f"{stage} {t:.2f} s ({t / total:.0%})" for stage, t in times.items())
            print(f"  {name}: {tokens / total:,.0f} tokens per CPU-second; {parts}")


def stage_times(encoder, chunks):
    """CPU seconds per stage of `TextEncoder.encode` over `chunks` (the same steps, timed one by one)."""
    from kgpt.tokenizers.gpt1.normalize import fix_text

    clock, times, tokens = time.process_time, collections.Counter(), 0
    for chunk in chunks:
        start = clock()
        fixed = fix_text(chunk)
        times["ftfy"] += clock() - start
        start = clock()
        lines = encoder.lines(fixed)
        times["words and groups"] += clock() - start
        start = clock()
        new = list(set(itertools.chain.from_iterable(lines)).difference(encoder.word_ids))
        split = encoder._split(new)
        times["standardise + spaCy/regex (new words)"] += clock() - start
        start = clock()
        for key, words in zip(new, split):
            encoder.word_ids[key] = tuple(encoder.encoder.get(s, 0) for w in words for s in encoder.bpe(w.lower()))
        times["BPE (new words)"] += clock() - start
        start = clock()
        ids = []
        for keys in lines:
            if ids:
                ids.append(encoder.newline_id)
            ids.extend(itertools.chain.from_iterable(map(encoder.word_ids.__getitem__, keys)))
        times["cache lookups"] += clock() - start
        tokens += len(ids)
    return times, tokens


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    agree = commands.add_parser("agreement", help="lines encoded as the reference")
    agree.add_argument("--text", default="tests/data/prose.txt")
    agree.add_argument("--reference", default="tests/data/prose_ids.json")
    agree.add_argument("--examples", type=int, default=5, help="disagreements to print per splitter")
    fast = commands.add_parser("speed", help="tokens/s of shard building")
    once = commands.add_parser("build-once", help="one build, figures as JSON (what `speed` runs)")
    for sub in (fast, once):
        sub.add_argument("--files", required=True, help="glob(s) of UTF-8 text files, comma-separated")
        sub.add_argument("--workers", default=f"1,{os.cpu_count()}", help="worker counts, comma-separated")
        sub.add_argument("--splitters", default="spacy,regex")
    fast.add_argument("--repeats", type=int, default=3, help="builds per row (the median is printed)")
    fast.add_argument(
        "--stages", action=argparse.BooleanOptionalAction, default=True, help="also time the stages of one process"
    )
    args = parser.parse_args()
    {"agreement": agreement, "speed": speed, "build-once": build_once}[args.command](args)


if __name__ == "__main__":
    main()
