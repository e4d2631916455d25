"""Token shards: exact streaming tokenization, reuse, and random windows read from disk."""

import json

import numpy as np
import pytest

import kgpt
from kgpt import shards

TEXT = "First line of the tale.\n\n  Second, after a blank line;\nthird -- with   spaces \n\n\nend\n"


@pytest.fixture(scope="module")
def tokenizer():
    return kgpt.GPTTokenizer.gpt1()


@pytest.mark.parametrize("chunk_bytes", [1, 7, 16, 1 << 20])
def test_chunked_encoding_equals_whole_text(tokenizer, tmp_path, chunk_bytes):
    path = tmp_path / "a.txt"
    path.write_text(TEXT * 3, encoding="utf-8")
    pieces = list(shards.encode_file(tokenizer, str(path), chunk_bytes=chunk_bytes))
    assert np.concatenate(pieces).tolist() == tokenizer.encode(TEXT * 3)


def build(tokenizer, tmp_path, shard_tokens=40, log=None):
    corpus = tmp_path / "corpus"
    if not corpus.exists():  # written once: rewriting would change the files' times
        corpus.mkdir()
        for i in range(3):
            (corpus / f"{i}.txt").write_text(f"Book {i}. " + TEXT * (i + 1), encoding="utf-8")
        (corpus / "empty.txt").write_text("  \n", encoding="utf-8")
    files = sorted(str(p) for p in corpus.iterdir())
    return files, shards.build_shards(files, tokenizer, str(tmp_path / "shards"), shard_tokens=shard_tokens,
                                      log=log or (lambda *_: None))


def test_shards_hold_the_token_stream(tokenizer, tmp_path):
    lines = []
    files, index = build(tokenizer, tmp_path, log=lines.append)
    expected = np.concatenate([np.asarray(tokenizer.encode(open(f).read()), np.int32) for f in files])
    assert index.dtype == "uint16" and len(index.shards) > 3
    assert all(s["tokens"] == 40 for s in index.shards[:-1])
    assert index.tokens(0, index.total_tokens).tolist() == expected.tolist()
    assert index.tokens(35, 90).tolist() == expected[35:90].tolist()  # across shard boundaries
    assert any("Skipped 1 empty file(s)" in line and "empty.txt" in line for line in lines)
    on_disk = json.loads((tmp_path / "shards" / "index.json").read_text())
    assert on_disk["total_tokens"] == len(expected)
    assert [s["tokens"] for s in on_disk["sources"]] == [len(tokenizer.encode(open(f).read())) for f in files]


def test_shards_are_reused_until_the_corpus_changes(tokenizer, tmp_path):
    build(tokenizer, tmp_path)
    lines = []
    build(tokenizer, tmp_path, log=lines.append)
    assert lines[0].startswith("Reusing")
    with open(tmp_path / "corpus" / "0.txt", "a") as f:
        f.write("More text.\n")
    lines.clear()
    _, index = build(tokenizer, tmp_path, log=lines.append)
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
        shards.build_shards([str(tmp_path / "e.txt")], tokenizer, str(tmp_path / "s"), log=lambda *_: None)
