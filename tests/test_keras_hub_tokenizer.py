"""A keras-hub tokenizer preset as kgpt's tokenizer: pre-training, fine-tuning and prediction with
`--tokenizer DIR`, where DIR is what keras-hub's `tokenizer.save_to_preset(DIR)` writes.

The byte-pair vocabulary is written here (every byte, as GPT-2's byte-level
alphabet maps it, and a few merges): nothing is downloaded.
"""

import json
import os
import subprocess
import sys

import keras_hub
import numpy as np
import pytest
from conftest import cli, one_backend

import kgpt
from kgpt.cli import train
from kgpt.data import shards
from kgpt.models.gpt.gpt_tokenizer import read_tokenizer
from kgpt.tokenizers.keras_hub_adapter import KerasHubTokenizer

MERGES = ["Ġ t", "h e", "Ġt he", "i n", "e r", "a n", "o n", "Ġ a", "r e", "e n", "Ġ s", "Ġ w", "Ġ b", "i s"]
TEXT = (
    "The keeper climbed the tower at dawn and wrote the weather in the log.\n"
    "A storm came in from the west; the lamp burned all night.\n\n"
    "Ships passed safely, and the keeper slept when the sun rose again.\n"
)


def byte_alphabet():
    """GPT-2's byte-level alphabet: a printable character for each of the 256 bytes."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def byte_pair_tokenizer():
    vocabulary = {symbol: i for i, symbol in enumerate(byte_alphabet())}
    for merge in MERGES:
        vocabulary.setdefault(merge.replace(" ", ""), len(vocabulary))
    return keras_hub.tokenizers.BytePairTokenizer(vocabulary=vocabulary, merges=MERGES)


@pytest.fixture(scope="module")
def bpe_preset(tmp_path_factory):
    """A keras-hub BytePairTokenizer preset folder: tokenizer.json + assets/tokenizer/{vocabulary.json,merges.txt}."""
    folder = tmp_path_factory.mktemp("keras_hub_bpe")
    byte_pair_tokenizer().save_to_preset(str(folder))
    return folder


def test_the_wrapper_gives_the_inner_ids_and_appends_the_task_tokens(bpe_preset, tmp_path):
    inner = byte_pair_tokenizer()
    tokenizer = read_tokenizer(str(bpe_preset))
    assert isinstance(tokenizer, KerasHubTokenizer)
    size = inner.vocabulary_size()
    assert (tokenizer.start_id, tokenizer.delimiter_id, tokenizer.extract_id) == (size, size + 1, size + 2)
    assert tokenizer.vocabulary_size() == size + 3 and len(tokenizer.get_vocabulary()) == size + 3
    ids = tokenizer.encode("in the keeper")
    assert ids == np.asarray(inner("in the keeper")).tolist() and inner.token_to_id("Ġthe") in ids
    assert tokenizer.decode(ids) == "in the keeper"
    assert tokenizer.decode([tokenizer.start_id, *ids, tokenizer.extract_id]) == "_start_ in the keeper _classify_"
    assert tokenizer(["the", "in the"]) == [inner("the").tolist(), inner("in the").tolist()]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.decode([size + 3])
    # Saved by kgpt and read back, as a pre-trained preset holds it.
    tokenizer.save_to_preset(str(tmp_path / "again"))
    config = json.loads((tmp_path / "again" / "tokenizer.json").read_text())
    assert config["registered_name"] == "kgpt>KerasHubTokenizer"
    again = read_tokenizer(str(tmp_path / "again"))
    assert again.encode("the keeper") == tokenizer.encode("the keeper")
    assert again.fingerprint() == tokenizer.fingerprint() != kgpt.GPTTokenizer.gpt1().fingerprint()


def test_a_vocabulary_that_holds_a_task_token_keeps_its_id():
    vocabulary = {symbol: i for i, symbol in enumerate(byte_alphabet())}
    vocabulary["Ġt"] = 256
    vocabulary["_start_"] = 257
    inner = keras_hub.tokenizers.BytePairTokenizer(
        vocabulary=vocabulary, merges=["Ġ t"], unsplittable_tokens=["_start_"]
    )
    tokenizer = KerasHubTokenizer(inner)
    assert tokenizer.start_id == 257 and (tokenizer.delimiter_id, tokenizer.extract_id) == (258, 259)
    assert tokenizer.vocabulary_size() == 260 and tokenizer.decode([257, 258]) == "_start_ _delimiter_"


def test_shards_of_a_keras_hub_tokenizer_hold_the_whole_files_ids(bpe_preset, tmp_path):
    tokenizer = read_tokenizer(str(bpe_preset))
    corpus = tmp_path / "a.txt"
    corpus.write_text(TEXT * 3, encoding="utf-8")
    index = shards.build_shards([str(corpus)], tokenizer, str(tmp_path / "s"), chunk_bytes=64, workers=2)
    assert index.tokens(0, index.total_tokens).tolist() == tokenizer.encode(TEXT * 3)
    assert index.tokenizer == tokenizer.fingerprint()


def test_bad_tokenizer_folders_name_the_flag(monkeypatch, capsys, bpe_preset, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text(TEXT, encoding="utf-8")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text((bpe_preset / "tokenizer.json").read_text())  # no assets/
    for folder, problem in (
        (broken, "cannot read the files of its BytePairTokenizer"),
        (tmp_path / "nowhere", "no such folder"),
    ):
        code, _, err = cli(
            monkeypatch, capsys, train, "--task=lm", f"--corpus={corpus}", "--prepare_only", f"--tokenizer={folder}"
        )
        assert code == 1 and "Traceback" not in err, err[-3000:]
        [line] = [line for line in err.splitlines() if line.startswith("kgpt-train: error: ")]
        assert line.startswith(f"kgpt-train: error: --tokenizer={folder}: ") and problem in line, line


@one_backend("tensorflow")
def test_a_keras_hub_tokenizer_pre_trains_fine_tunes_and_predicts(monkeypatch, capsys, bpe_preset, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text(TEXT * 8, encoding="utf-8")
    tiny = ["--num_layers=2", "--num_heads=2", "--hidden_dim=16", "--intermediate_dim=32"]
    lm = tmp_path / "lm"
    code, out, err = cli(
        monkeypatch,
        capsys,
        train,
        "--task=lm",
        f"--corpus={corpus}",
        f"--tokenizer={bpe_preset}",
        f"--output_dir={lm}",
        "--sequence_length=16",
        "--batch_size=4",
        "--max_steps=2",
        "--warmup_steps=1",
        "--evaluations=1",
        "--validation_fraction=0",
        "--sample_tokens=1",
        *tiny,
    )
    assert code in (0, None), err[-3000:]
    assert json.loads((lm / "tokenizer.json").read_text())["registered_name"] == "kgpt>KerasHubTokenizer"
    causal_lm = kgpt.GPTCausalLM.from_preset(str(lm))
    assert causal_lm.backbone.vocabulary_size == byte_pair_tokenizer().vocabulary_size() + 3
    assert isinstance(causal_lm.preprocessor.tokenizer, KerasHubTokenizer)

    data = tmp_path / "SST-2"  # a few rows in SST-2's format (the embedded demo's 1,800 take longer)
    data.mkdir()
    rows = [
        f"the {what} was {word} .\t{label}"
        for what in ("film", "plot", "cast", "music")
        for word, label in (("wonderful", 1), ("dull", 0), ("moving", 1), ("boring", 0))
    ]
    (data / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows[:12]) + "\n", encoding="utf-8")
    (data / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(rows[12:]) + "\n", encoding="utf-8")
    finetuned = tmp_path / "sst2"
    code, out, err = cli(
        monkeypatch,
        capsys,
        train,
        "--task=sst2",
        f"--data_dir={data}",
        f"--init={lm}",
        f"--output_dir={finetuned}",
        "--epochs=1",
        "--batch_size=4",
        "--max_length=16",
    )
    assert code in (0, None), err[-3000:]
    model = kgpt.GPTTaskModel.from_preset(str(finetuned))
    tokenizer = model.preprocessor.tokenizer
    assert (
        isinstance(tokenizer, KerasHubTokenizer)
        and tokenizer.fingerprint() == read_tokenizer(str(bpe_preset)).fingerprint()
    )

    inputs = tmp_path / "reviews.txt"
    inputs.write_text("a warm and gentle film\nthe storm was dull\n", encoding="utf-8")
    # kgpt-predict in its own process (its flags and kgpt-train's share absl's one registry).
    result = subprocess.run(
        [sys.executable, "-m", "kgpt.cli.predict", f"--model={finetuned}", f"--input={inputs}", "--output=-"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    header, *predicted = result.stdout.splitlines()
    assert header.split("\t")[:2] == ["id", "prediction"] and len(predicted) == 2, result.stdout[-3000:]
    assert all(line.split("\t")[1] in ("0", "1") for line in predicted)
