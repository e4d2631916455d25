"""Token shards: exact streaming tokenization, reuse, and random windows read from disk."""

import collections
import json
import os
import signal
import warnings

import numpy as np
import pytest

import kgpt
from kgpt.data import corpus_encoding, shards, text
from kgpt.errors import Preempted

TEXT = "First line of the tale.\n\n  Second, after a blank line;\nthird -- with   spaces \n\n\nend\n"
# What ftfy changes across lines: "\r\n", entities (decoded until a line holds a "<"), curly quotes, mojibake.
TRICKY = "Fish &amp; chips\r\n\u201cQuoted,\u201d caf\u00c3\u00a9.\n<b>bold</b>\nTom &amp; Jerry \u00e9\n  \n"


@pytest.fixture(scope="module")
def tokenizer():
    return kgpt.GPTTokenizer.gpt1()


def encode_file(tokenizer, path, chunk_bytes, line_bytes=text.LINE_BYTES):
    """A file's ids as the shard builder makes them in one process: chunk by chunk, joined."""
    engine = tokenizer.corpus_encoder()
    chunks = corpus_encoding.jobs([path], engine, chunk_bytes, line_bytes, None)
    pieces = (corpus_encoding.encode_job(engine, job) for job in chunks)
    return np.concatenate(list(corpus_encoding.file_ids(pieces, engine.newline_id)))


@pytest.mark.parametrize("chunk_bytes", [1, 7, 16, 1 << 20])
def test_chunked_encoding_equals_whole_text(tokenizer, tmp_path, chunk_bytes):
    path = tmp_path / "a.txt"
    text = TEXT * 2 + TRICKY + TEXT
    path.write_bytes(text.encode("utf-8"))
    assert encode_file(tokenizer, str(path), chunk_bytes=chunk_bytes).tolist() == tokenizer.encode(text)


def test_long_lines_are_cut_at_spaces_and_counted(tokenizer, tmp_path):
    path = tmp_path / "one_line.txt"
    line = " ".join(f"word{i}, said the keeper" for i in range(2000))  # about 45 KB, no newline
    path.write_text(line, encoding="utf-8")
    cuts = collections.Counter()
    chunks = list(text.text_chunks(str(path), chunk_bytes=1024, line_bytes=4096, cuts=cuts))
    assert "".join(chunks) == line
    assert max(len(c) for c in chunks) <= 4096 + 1024  # memory stays bounded on a one-line corpus
    assert cuts["at a space"] > 8 and not cuts["mid-word"]
    ids = encode_file(tokenizer, str(path), chunk_bytes=1024, line_bytes=4096)
    assert ids.tolist() == tokenizer.encode(line)  # a cut at a space changes no token


def test_a_line_without_spaces_is_cut_mid_word_and_counted(tokenizer, tmp_path):
    path = tmp_path / "letters.txt"
    path.write_text("x" * 5000, encoding="utf-8")
    cuts = collections.Counter()
    chunks = list(text.text_chunks(str(path), chunk_bytes=1024, line_bytes=4096, cuts=cuts))
    assert [len(c) for c in chunks] == [4095, 905] and cuts == {"mid-word": 1}
    with pytest.warns(UserWarning, match="Cut 1 word"):  # 4,095 letters are over 1,000 characters too
        expected = tokenizer.encode("x" * 4095 + " " + "x" * 905)
    ids = encode_file(tokenizer, str(path), chunk_bytes=1024, line_bytes=4096)
    assert ids.tolist() == expected


def test_an_io_error_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "a.txt"
    path.write_text("text\n", encoding="utf-8")

    class Failing:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self, size):
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(text, "open", lambda *a, **k: Failing(), raising=False)
    with pytest.raises(OSError, match=r"cannot read .*a.txt: Input/output error"):
        list(text.text_chunks(str(path)))


def build(tokenizer, tmp_path, shard_tokens=40, directory="shards", **kwargs):
    corpus = tmp_path / "corpus"
    if not corpus.exists():  # written once: rewriting would change the files' times
        corpus.mkdir()
        for i in range(3):
            (corpus / f"{i}.txt").write_text(f"Book {i}. " + TEXT * (i + 1) + TRICKY * i, encoding="utf-8")
        (corpus / "empty.txt").write_text("  \n", encoding="utf-8")
    files = sorted(str(p) for p in corpus.iterdir())
    return files, shards.build_shards(files, tokenizer, str(tmp_path / directory), shard_tokens=shard_tokens, **kwargs)


def logged(capsys):
    """The lines kgpt logged since the last call (its logger prints to the current stdout)."""
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_stop_between_chunks_keeps_no_index_and_a_rerun_builds_anew(tokenizer, tmp_path, workers):
    asked = []

    def stop():
        asked.append(1)
        return len(asked) > 2  # true at the third chunk: the second file has begun

    with pytest.raises(Preempted, match=r"while tokenizing the corpus \(file 2 of 4, .*1\.txt\); no shard is kept"):
        build(tokenizer, tmp_path, workers=workers, chunk_bytes=64, stop=stop)
    assert not (tmp_path / "shards" / "index.json").exists()
    files, index = build(tokenizer, tmp_path, workers=workers, chunk_bytes=64)
    _, whole = build(tokenizer, tmp_path, directory="whole")
    assert index.total_tokens == whole.total_tokens


def test_a_sigterm_that_ended_the_workers_too_is_the_stop_notice():
    def pieces(notice):  # a SIGTERM to the whole process group ends the workers: their pieces end in an error
        yield corpus_encoding.Piece(0, np.zeros(3, np.int32), True, True, True, 0)
        notice.extend(notice)
        raise RuntimeError("A tokenizer worker process died (exit code -15)")

    notice = [True]  # noted after the first piece
    with pytest.raises(Preempted, match=r"\(file 1 of 2, a.txt\)"):
        list(shards._stopping(pieces(notice), lambda: len(notice) > 1, ["a.txt", "b.txt"]))
    with pytest.raises(RuntimeError, match="worker process died"):  # without a notice, the error is the error
        list(shards._stopping(pieces([]), lambda: False, ["a.txt", "b.txt"]))


def test_a_worker_ends_on_sigterm_while_the_job_notes_it(tokenizer):
    # Forked while the job notes SIGTERM (kgpt.train.callbacks.catching_signals): a worker that kept that
    # handler would outlive `terminate()`, and the command would wait for it at exit.
    from kgpt.train.callbacks import catching_signals

    with catching_signals():
        workers = corpus_encoding._Workers(tokenizer.corpus_encoder(), 1)
        try:
            workers.processes[0].terminate()
            workers.processes[0].join(10)
            assert workers.processes[0].exitcode == -signal.SIGTERM
        finally:
            workers.close()


def test_workers_build_the_same_shards_as_one_process(tokenizer, tmp_path, capsys, progress):
    files, one = build(tokenizer, tmp_path, directory="one", workers=1, chunk_bytes=32)
    logged(capsys)
    _, two = build(tokenizer, tmp_path, directory="two", workers=2, chunk_bytes=32)
    lines = logged(capsys)
    assert "with 2 worker(s)" in lines[-1] and len(two.shards) > 3
    for a, b in zip(one.shards, two.shards):
        assert (tmp_path / "one" / a["file"]).read_bytes() == (tmp_path / "two" / b["file"]).read_bytes()
    assert one.shards == two.shards and [s["tokens"] for s in one.sources] == [s["tokens"] for s in two.sources]
    expected = [i for f in files for i in tokenizer.encode(open(f, encoding="utf-8", newline="").read())]
    assert two.tokens(0, two.total_tokens).tolist() == expected


def test_starting_the_workers_after_the_backend_prints_no_fork_warning(tokenizer, tmp_path):
    import keras

    keras.ops.add(1, 1)  # the backend's threads run (JAX then warns on any fork)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build(tokenizer, tmp_path, workers=2, chunk_bytes=32)
    assert not [w for w in caught if "fork" in str(w.message)], [str(w.message) for w in caught]


def test_workers_share_the_words_they_learn(tokenizer, tmp_path):
    """A word is split and BPE-encoded by one worker; the others take its ids from the journals."""
    a, b = (kgpt.GPTTokenizer.gpt1().corpus_encoder() for _ in range(2))
    a.record()
    ids = a.encode("Dr. Smith's boys' s. walked -- twice -- to the caf\u00e9.")
    learned, edges = a.record()
    assert set(learned) == set(a.word_ids) and set(edges) == set(a.word_edges)
    b.learn((learned, edges))
    b._split = None  # b must not need to split a word of that sentence again
    assert b.encode("Dr. Smith's boys' s. walked -- twice -- to the caf\u00e9.") == ids
    assert b.joiners == a.joiners


def _failing_encode_job(engine, job):
    if "poison" in job[1]:
        raise ValueError("the chunk with poison")
    return real_encode_job(engine, job)


real_encode_job = corpus_encoding.encode_job


def test_an_error_in_a_worker_is_raised_here(tokenizer, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("words\n" * 200 + "poison\n" + "words\n" * 200, encoding="utf-8")
    monkeypatch.setattr(corpus_encoding, "encode_job", _failing_encode_job)  # the workers are forked after this
    with pytest.raises(ValueError, match="the chunk with poison"):
        shards.build_shards([str(corpus / "a.txt")], tokenizer, str(tmp_path / "s"), workers=2, chunk_bytes=64)
    assert not (tmp_path / "s" / "index.json").exists()


def _dying_encode_job(engine, job):
    if "poison" in job[1]:
        os._exit(3)
    return real_encode_job(engine, job)


def test_a_worker_that_dies_is_reported(tokenizer, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("words\n" * 200 + "poison\n" + "words\n" * 200, encoding="utf-8")
    monkeypatch.setattr(corpus_encoding, "encode_job", _dying_encode_job)
    with pytest.raises(RuntimeError, match=r"worker process died \(exit code 3\)"):
        shards.build_shards([str(corpus / "a.txt")], tokenizer, str(tmp_path / "s"), workers=2, chunk_bytes=64)


def test_a_changed_shard_is_refused_by_name(tokenizer, tmp_path):
    _, index = build(tokenizer, tmp_path)
    shard = tmp_path / "shards" / index.shards[1]["file"]
    data = bytearray(shard.read_bytes())
    data[0:2] = (65535).to_bytes(2, "little")  # an id outside the vocabulary, same size
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"tokens_00001.bin: its CRC-32 is not the one index.json records"):
        build(tokenizer, tmp_path)
    shard.write_bytes(bytes(data[:-2]))
    with pytest.raises(ValueError, match=r"tokens_00001.bin: 78 bytes, but index.json records 80 bytes"):
        build(tokenizer, tmp_path)


def test_an_index_without_crcs_is_rebuilt(tokenizer, tmp_path, capsys, progress):
    _, index = build(tokenizer, tmp_path)
    path = tmp_path / "shards" / "index.json"
    old = json.loads(path.read_text())
    del old["format"], old["cuts"]
    for shard in old["shards"]:
        del shard["crc32"]
    path.write_text(json.dumps(old))
    logged(capsys)
    _, again = build(tokenizer, tmp_path)
    lines = logged(capsys)
    assert lines[-1].startswith("Tokenized 4 file(s)") and again.shards == index.shards


def test_shards_hold_the_token_stream(tokenizer, tmp_path, capsys, progress):
    logged(capsys)
    files, index = build(tokenizer, tmp_path)
    lines = logged(capsys)
    expected = np.concatenate([np.asarray(tokenizer.encode(open(f, newline="").read()), np.int32) for f in files])
    assert index.dtype == "uint16" and len(index.shards) > 3
    assert all(s["tokens"] == 40 for s in index.shards[:-1])
    assert index.tokens(0, index.total_tokens).tolist() == expected.tolist()
    assert index.tokens(35, 90).tolist() == expected[35:90].tolist()  # across shard boundaries
    assert any("Skipped 1 empty file(s)" in line and "empty.txt" in line for line in lines)
    on_disk = json.loads((tmp_path / "shards" / "index.json").read_text())
    assert on_disk["total_tokens"] == len(expected)
    assert [s["tokens"] for s in on_disk["sources"]] == [
        len(tokenizer.encode(open(f, newline="").read())) for f in files
    ]


def test_shards_are_reused_until_the_corpus_changes(tokenizer, tmp_path, capsys, progress):
    build(tokenizer, tmp_path)
    logged(capsys)
    build(tokenizer, tmp_path)
    lines = logged(capsys)
    assert lines[0].startswith("Reusing") and "CRC-32 checked" in lines[0]
    with open(tmp_path / "corpus" / "0.txt", "a") as f:
        f.write("More text.\n")
    _, index = build(tokenizer, tmp_path)
    lines = logged(capsys)
    assert lines[-1].startswith("Tokenized 4 file(s)")
    assert index.tokens(0, 3).tolist() == tokenizer.encode("Book 0.")[:3]


def test_windows_are_contiguous_slices_within_one_shard(tokenizer, tmp_path):
    _, index = build(tokenizer, tmp_path)
    stream = index.tokens(0, index.total_tokens).tolist()
    stop = index.total_tokens - 10
    data = index.windows(sequence_length=8, batch_size=4, seed=3, stop=stop)
    batches = [b for _, b in zip(range(6), data.as_numpy_iterator())]
    for x, y in batches:
        assert x["token_ids"].shape == (4, 8) and (x["padding_mask"] == 1).all()
        for ids, targets in zip(x["token_ids"], y):
            window = ids.tolist() + [int(targets[-1])]
            assert targets.tolist() == window[1:]
            starts = [i for i in range(stop - 8) if stream[i : i + 9] == window]
            assert any((s // 40) == ((s + 8) // 40) for s in starts), "window crosses a shard or the split"
    # Batch k depends only on (seed, k): a resumed stream continues the same sequence.
    resumed = next(index.windows(8, 4, seed=3, stop=stop, first_batch=4).as_numpy_iterator())
    np.testing.assert_array_equal(resumed[0]["token_ids"], batches[4][0]["token_ids"])


def test_a_corpus_of_only_empty_files_is_an_error(tokenizer, tmp_path):
    (tmp_path / "e.txt").write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="All 1 corpus file"):
        shards.build_shards([str(tmp_path / "e.txt")], tokenizer, str(tmp_path / "s"))


def test_the_log_names_the_workers_that_ran(tokenizer, tmp_path, capsys, progress):
    corpus = tmp_path / "a.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    logged(capsys)
    shards.build_shards([str(corpus)], tokenizer, str(tmp_path / "s"), workers=2)
    assert logged(capsys)[-1].endswith("with 1 worker(s) (2 allowed; one chunk needs no more).")
