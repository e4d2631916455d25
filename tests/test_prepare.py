"""Corpus discovery and `kgpt-train --task lm --prepare_only` (tokenizer and shards, no training)."""

import os

import pytest

import kgpt
from kgpt.data.shards import build_shards
from kgpt.jobs.config import PretrainConfig
from kgpt.jobs.pretrain import corpus_files, prepare

PARAGRAPH = (
    "The keeper\u2019s log for 3 January: \u201cWind SW, force 6 \u2014 glass falling\u2026\u201d "
    "Mrs. Marrow lit the lamp at 16:42.\n"
)


def write_corpus(folder, files=3, repeats=40):
    folder.mkdir()
    for i in range(files):
        (folder / f"book{i}.txt").write_text(f"Book {i}.\n" + PARAGRAPH * repeats * (i + 1), encoding="utf-8")
    return folder


def test_broken_and_looping_links_are_named(tmp_path, capsys, progress):
    corpus = write_corpus(tmp_path / "corpus", files=1)
    os.symlink(tmp_path / "gone.txt", corpus / "dangling.txt")
    with pytest.raises(FileNotFoundError, match=r"dangling.txt \(a link to '.*gone.txt'\): No such file"):
        corpus_files(str(corpus))
    os.remove(corpus / "dangling.txt")
    os.symlink(corpus / "loop.txt", corpus / "loop.txt")
    with pytest.raises(OSError, match=r"loop.txt \(a link to '.*loop.txt'\): Too many levels of symbolic links"):
        corpus_files(str(corpus))
    os.remove(corpus / "loop.txt")
    (corpus / "notes.txt").mkdir()  # a folder the pattern matches: skipped, and said so
    assert corpus_files(str(corpus)) == [str(corpus / "book0.txt")]
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"Skipped 1 folder(s) matching {str(corpus / '*.txt')!r}: {corpus / 'notes.txt'}"]


def test_prepare_builds_the_shards_and_stops(tmp_path, capsys, progress):
    corpus = write_corpus(tmp_path / "corpus")
    index = prepare(PretrainConfig(corpus=str(corpus), shards_dir=str(tmp_path / "shards")))
    lines = capsys.readouterr().out.splitlines()
    assert index.total_tokens > 1000 and (tmp_path / "shards" / "index.json").exists()
    assert any("tokens/s with" in line for line in lines) and lines[-1].startswith(f"Prepared {index.total_tokens:,}")
    assert not (tmp_path / "out").exists()
    prepare(PretrainConfig(corpus=str(corpus), shards_dir=str(tmp_path / "shards")))
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("Reusing") for line in lines)


def test_cli_prepare_only_equals_a_one_process_build(tmp_path, command):
    from kgpt.cli import train

    corpus = write_corpus(tmp_path / "corpus", files=4, repeats=2500)  # 0.3-1.1 MB: the last in two chunks
    result = command(
        train, "--task=lm", "--prepare_only", f"--corpus={corpus}", f"--output_dir={tmp_path / 'out'}", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tokens/s with" in result.stdout and "Prepared" in result.stdout
    # No model: nothing was trained (the run's claim on the directory is all beside the shards).
    assert sorted(os.listdir(tmp_path / "out")) == [".lock", "run.json", "shards"]
    files = sorted(str(p) for p in corpus.iterdir())
    single = build_shards(files, kgpt.GPTTokenizer.gpt1(), str(tmp_path / "single"), workers=1)
    built = sorted(os.listdir(tmp_path / "out" / "shards"))
    assert built == sorted(os.listdir(tmp_path / "single"))
    for name in built:
        if name.endswith(".bin"):
            assert (tmp_path / "out" / "shards" / name).read_bytes() == (tmp_path / "single" / name).read_bytes()
    assert single.total_tokens > 500_000 and max(s["bytes"] for s in single.sources) > 1 << 20


def test_prepare_only_is_for_pretraining():
    from absl import app

    from kgpt.cli import train

    train.FLAGS(["kgpt-train", "--task=scitail", "--prepare_only"])
    try:
        with pytest.raises(app.UsageError, match=r"--prepare_only only applies to pre-training \(--task lm\)"):
            train.main(["kgpt-train"])
    finally:
        train.FLAGS.unparse_flags()
