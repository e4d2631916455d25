"""Presets on the Hugging Face Hub (`hf://`), against a Hub the tests serve on 127.0.0.1 (`tests/hub_server.py`).

The repository in the openai-gpt layout is written here, independently of
kgpt, and the converted model is compared with the NumPy forward pass of the
original equations (`gpt1_reference`). Nothing touches the network.
"""

import json
import logging
import os
import re
import socket

import gpt1_reference
import numpy as np
import pytest
from conftest import char_tokenizer, cli, one_backend, to_numpy
from hub_server import HEADS, FakeHub, openai_gpt_files

import kgpt
from kgpt.errors import CheckpointError
from kgpt.io import hub

SIZES = dict(vocab=95, n_ctx=16, hidden=24, inner=96, n_layer=2)  # 95: the character tokenizer's plain vocabulary
REPO = "openai-community/openai-gpt"


@pytest.fixture
def arrays():
    return gpt1_reference.random_checkpoint(**SIZES)[1]


def point_at(monkeypatch, url):
    """What HF_ENDPOINT sets when huggingface_hub is imported (its file URLs' template too)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")


@pytest.fixture
def served(monkeypatch, tmp_path):
    """A FakeHub that huggingface_hub talks to (HF_ENDPOINT), with empty caches and no token."""
    from huggingface_hub import constants

    with FakeHub() as fake:
        point_at(monkeypatch, fake.url)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 3)
        monkeypatch.setenv("KGPT_CACHE", str(tmp_path / "kgpt-cache"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no login token of the machine's
        yield fake


def logits_of(lm, ids):
    return to_numpy(lm({"token_ids": ids, "padding_mask": np.ones_like(ids)}))


@pytest.mark.parametrize("weights", ["safetensors", "tf"])
def test_the_released_layout_loads_from_the_hub_and_equals_the_reference(served, arrays, weights):
    served.commit(REPO, openai_gpt_files(arrays, weights))
    lm = kgpt.GPTCausalLM.from_preset(f"hf://{REPO}")
    ids = np.random.default_rng(0).integers(0, SIZES["vocab"], (2, 16)).astype("int32")
    want_hidden, want_logits = gpt1_reference.forward(arrays, ids, HEADS)
    hidden = to_numpy(lm.backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
    np.testing.assert_allclose(hidden, want_hidden, atol=1e-5, rtol=1e-5)
    # The three special tokens' rows come last: the released vocabulary's logits are the reference's.
    np.testing.assert_allclose(logits_of(lm, ids)[..., : SIZES["vocab"]], want_logits, atol=1e-4, rtol=1e-5)
    assert lm.backbone.vocabulary_size == SIZES["vocab"] + 3
    assert lm.preprocessor.tokenizer.vocabulary_size() == SIZES["vocab"] + 3
    assert isinstance(lm.generate("ab", max_length=8), str)
    assert served.count(r"pytorch_model\.bin") == 0, "pickled weights are never fetched"


def test_every_class_loads_the_same_conversion_once(served, arrays):
    served.commit(REPO, openai_gpt_files(arrays))
    uri = f"hf://{REPO}"
    backbone = kgpt.GPTBackbone.from_preset(uri)
    weight_gets = served.count(r"GET .*/resolve/.*model\.safetensors")
    assert weight_gets == 1
    tokenizer = kgpt.GPTTokenizer.from_preset(uri)
    preprocessor = kgpt.GPTCausalLMPreprocessor.from_preset(uri)
    assert tokenizer.vocabulary_size() == backbone.vocabulary_size
    assert preprocessor.sequence_length == SIZES["n_ctx"]
    # Three loads, one download of the weights and one metadata request each: nothing fetched twice.
    assert served.count(r"GET .*/resolve/.*model\.safetensors") == weight_gets
    assert served.count(r"GET /api/models/") == 3


def test_a_pinned_commit_or_offline_mode_makes_no_request_once_cached(served, arrays, monkeypatch):
    from huggingface_hub import constants

    first = served.commit(REPO, openai_gpt_files(arrays))
    kgpt.GPTBackbone.from_preset(f"hf://{REPO}")
    second = served.commit(REPO, {"README.md": b"# GPT-1, card edited\n"})
    before = len(served.requests)
    pinned = kgpt.GPTBackbone.from_preset(f"hf://{REPO}@{first}")
    assert len(served.requests) == before + 1  # the commit's metadata; its files come from the caches
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    offline = kgpt.GPTBackbone.from_preset(f"hf://{REPO}")
    assert len(served.requests) == before + 1, "offline: not one request"
    np.testing.assert_array_equal(
        to_numpy(pinned.token_embedding.embeddings), to_numpy(offline.token_embedding.embeddings)
    )
    assert second != first


def test_a_revision_a_branch_and_a_tag(served, arrays):
    first = served.commit(REPO, openai_gpt_files(arrays), tag="v1")
    other = gpt1_reference.random_checkpoint(**SIZES, seed=7)[1]
    served.commit(REPO, openai_gpt_files(other), branch="retrained")
    ids = np.arange(8, dtype="int32")[None]
    for revision, source in (("", arrays), ("@v1", arrays), (f"@{first}", arrays), ("@retrained", other)):
        backbone = kgpt.GPTBackbone.from_preset(f"hf://{REPO}{revision}")
        hidden = to_numpy(backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
        np.testing.assert_allclose(hidden, gpt1_reference.forward(source, ids, HEADS)[0], atol=1e-5, rtol=1e-5)


def test_the_named_preset_is_the_released_repository(served, arrays):
    assert hub.parse("gpt1_base_en") == (REPO, None)
    served.commit(REPO, openai_gpt_files(arrays))
    assert kgpt.GPTBackbone.from_preset("gpt1_base_en").num_layers == SIZES["n_layer"]


def test_a_kgpt_preset_uploads_and_loads_back(served, tmp_path, monkeypatch, caplog):
    from conftest import text_lm

    lm = text_lm(char_tokenizer())
    lm.save_to_preset(str(tmp_path / "mine"))
    with pytest.raises(CheckpointError, match="log in|HF_TOKEN|Unauthorized|credentials"):
        kgpt.upload_preset("hf://me/tiny-lm", str(tmp_path / "mine"))
    monkeypatch.setenv("HF_TOKEN", served.token)
    commit = kgpt.upload_preset("hf://me/tiny-lm", str(tmp_path / "mine"))
    assert len(commit) == 40
    again = kgpt.GPTCausalLM.from_preset("hf://me/tiny-lm")
    ids = np.arange(10, dtype="int32")[None] % 90
    np.testing.assert_array_equal(logits_of(again, ids), logits_of(lm, ids))
    assert again.preprocessor.tokenizer.encode("abc") == lm.preprocessor.tokenizer.encode("abc")
    assert served.count("POST /api/models/me/tiny-lm/commit/main") == 1
    with pytest.raises(CheckpointError, match="not a kgpt preset folder"):
        kgpt.upload_preset("hf://me/other", str(tmp_path))
    kgpt.upload_preset("hf://me/hidden", str(tmp_path / "mine"), private=True)
    caplog.set_level(logging.INFO, logger="kgpt")
    lm.backbone.save_to_preset(str(tmp_path / "backbone"))  # over the causal LM: its task.json must go
    kgpt.upload_preset("hf://me/tiny-lm", str(tmp_path / "backbone"))
    assert "task.json" not in served.repos["me/tiny-lm"]["commits"][served.repos["me/tiny-lm"]["refs"]["main"]]
    assert re.search(r"removed \d+ file\(s\) of an earlier upload that this preset lacks: .*task\.json", caplog.text)
    assert served.repos["me/hidden"]["private"] and not served.repos["me/tiny-lm"]["private"]
    os.remove(tmp_path / "mine" / "model.weights.h5")
    with pytest.raises(CheckpointError, match=r"mine has no model.weights.h5"):
        kgpt.upload_preset("hf://me/tiny-lm", str(tmp_path / "mine"))


@one_backend("tensorflow")
def test_fine_tuning_starts_from_a_hub_preset_on_the_command_line(served, arrays, tmp_path, monkeypatch, capsys):
    from kgpt.cli import train

    served.commit(REPO, openai_gpt_files(arrays))
    rows = ["text,label"] + [f"{'abc' if i % 2 else 'xyz'} {i},{'pos' if i % 2 else 'neg'}" for i in range(12)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    code, out, err = cli(
        monkeypatch,
        capsys,
        train,
        "--task",
        "text-classification",
        "--init",
        "gpt1_base_en",
        "--train_file",
        str(tmp_path / "train.csv"),
        "--validation_file",
        str(tmp_path / "train.csv"),
        "--text_columns",
        "text",
        "--label_column",
        "label",
        "--epochs",
        "1",
        "--batch_size",
        "4",
        "--output_dir",
        str(tmp_path / "out"),
    )
    assert not code, err[-2000:]
    assert "--init gpt1_base_en (hf://openai-community/openai-gpt): the kgpt preset in" in out + err
    assert os.path.isfile(tmp_path / "out" / "metrics.json")
    # Shared back to the Hub, the fine-tuned model predicts as the local one does.
    monkeypatch.setenv("HF_TOKEN", served.token)
    kgpt.upload_preset("hf://me/tiny-classifier", str(tmp_path / "out"))
    texts = ["abc 3", "xyz 4"]
    local = kgpt.GPTTaskModel.from_preset(str(tmp_path / "out")).predict(texts, verbose=0)
    shared = kgpt.GPTTaskModel.from_preset("hf://me/tiny-classifier").predict(texts, verbose=0)
    np.testing.assert_allclose(shared, local, atol=1e-6)


def test_a_dry_run_checks_a_hub_start_without_downloading_weights(served, arrays, tmp_path, monkeypatch, capsys):
    from kgpt.cli import train

    served.commit(REPO, openai_gpt_files(arrays))
    rows = ["text,label"] + [f"{'abc ' * (i * 4)}{i},{'pos' if i % 2 else 'neg'}" for i in range(8)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    code, out, err = cli(
        monkeypatch,
        capsys,
        train,
        "--task",
        "text-classification",
        "--init",
        "gpt1_base_en",
        "--train_file",
        str(tmp_path / "train.csv"),
        "--text_columns",
        "text",
        "--label_column",
        "label",
        "--output_dir",
        str(tmp_path / "out"),
        "--dry_run",
    )
    assert code in (0, None), err[-2000:]
    assert "openai-gpt files (model.safetensors), downloaded and converted on first use" in out
    assert served.count(r"model\.safetensors") == 0
    assert not os.path.exists(tmp_path / "out")
    code, out, err = cli(monkeypatch, capsys, train, "--list_presets")
    assert "gpt1_base_en  hf://openai-community/openai-gpt" in out


# --- what goes wrong, each one line naming the repository ---------------------------------------------------------


def test_bad_repositories_are_named(served, arrays):
    served.commit(REPO, openai_gpt_files(arrays))
    served.commit("secret/model", openai_gpt_files(arrays), private=True)
    gpt2 = {
        "config.json": json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}).encode(),
        "model.safetensors": b"x",
    }
    served.commit("openai-community/gpt2", gpt2)
    pickled = {k: v for k, v in openai_gpt_files(arrays).items() if k != "model.safetensors"}
    served.commit("old/pickled-gpt", pickled)
    keras_hub_preset = {"config.json": json.dumps({"registered_name": "keras_hub>GPT2Backbone", "config": {}}).encode()}
    served.commit("someone/gpt2-keras", keras_hub_preset)
    served.commit("someone/no-config", {"README.md": b"hi"})
    cases = [
        ("hf://nobody/nothing", r"hf://nobody/nothing .*no such repository, or it is private"),
        ("hf://secret/model", r"no such repository, or it is private.*HF_TOKEN"),
        (f"hf://{REPO}@no-such-branch", r"no revision 'no-such-branch'"),
        ("hf://openai-community/gpt2", r"holds a 'gpt2' model \(GPT2LMHeadModel\), not GPT-1"),
        ("hf://old/pickled-gpt", r"only as pytorch_model\.bin \(pickle"),
        ("hf://someone/gpt2-keras", r"keras-hub preset of 'keras_hub>GPT2Backbone'"),
        ("hf://someone/no-config", r"has no config\.json"),
        ("hf://a/b/c", r"not a Hub preset: write hf://OWNER/REPO"),
        ("hf://a/b@", r"not a Hub preset"),
    ]
    for preset, message in cases:
        with pytest.raises(CheckpointError, match=message):
            kgpt.GPTBackbone.from_preset(preset)
    assert served.count(r"pytorch_model") == 0


def test_a_private_repository_loads_with_a_token(served, arrays, monkeypatch):
    served.commit("secret/model", openai_gpt_files(arrays), private=True)
    monkeypatch.setenv("HF_TOKEN", served.token)
    assert kgpt.GPTBackbone.from_preset("hf://secret/model").num_layers == 2


def test_no_hub_or_a_silent_one_is_one_line_within_the_timeout(served, arrays, monkeypatch):
    from huggingface_hub import constants

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    point_at(monkeypatch, closed)
    with pytest.raises(CheckpointError, match=r"cannot reach the Hub.*HF_HUB_OFFLINE=1"):
        kgpt.GPTBackbone.from_preset(f"hf://{REPO}")
    point_at(monkeypatch, served.url)
    served.commit(REPO, openai_gpt_files(arrays))
    served.delay = 5  # longer than the 3 s the fixture allows
    import time

    start = time.monotonic()
    with pytest.raises(CheckpointError, match="cannot reach the Hub"):
        kgpt.GPTBackbone.from_preset(f"hf://{REPO}")
    assert time.monotonic() - start < 30
    served.delay = 0
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(CheckpointError, match="not in the local cache and HF_HUB_OFFLINE"):
        kgpt.GPTBackbone.from_preset(f"hf://{REPO}")


def test_an_unreachable_hub_falls_back_to_the_cached_commit(served, arrays, monkeypatch, caplog):

    served.commit(REPO, openai_gpt_files(arrays))
    kgpt.GPTBackbone.from_preset(f"hf://{REPO}")
    point_at(monkeypatch, "http://127.0.0.1:9")
    assert kgpt.GPTBackbone.from_preset(f"hf://{REPO}").num_layers == 2
    assert "cannot be reached (ConnectError" in caplog.text and "using the cached commit" in caplog.text


def test_a_corrupt_download_is_fetched_again_or_refused(served, arrays, monkeypatch, tmp_path):
    import shutil

    from huggingface_hub import hf_hub_download

    files = openai_gpt_files(arrays)
    served.commit(REPO, files)
    kgpt.GPTBackbone.from_preset(f"hf://{REPO}")
    # Damaged in huggingface_hub's cache after the download (and the conversion gone): fetched again.
    with open(os.path.realpath(hf_hub_download(REPO, "model.safetensors")), "r+b") as f:
        f.truncate(100)
    shutil.rmtree(os.environ["KGPT_CACHE"])
    gets = served.count(r"GET .*/resolve/.*model\.safetensors")
    assert kgpt.GPTBackbone.from_preset(f"hf://{REPO}").num_layers == 2
    assert served.count(r"GET .*/resolve/.*model\.safetensors") == gets + 1
    # Served with bytes that do not match the Hub's listing of them: refused by name, nothing converted.
    served.commit("broken/gpt", files)
    served.corrupt("broken/gpt", "model.safetensors", files["model.safetensors"][:-64])
    with pytest.raises(CheckpointError, match=r"hf://broken/gpt@\w+: model\.safetensors does not match the sha256"):
        kgpt.GPTBackbone.from_preset("hf://broken/gpt")
    converted = os.path.join(os.environ["KGPT_CACHE"], "hub", "broken--gpt")
    assert [n for n in os.listdir(converted) if n != "refs"] == []


KILLED_CONVERSION = """
import os, sys, time
from kgpt.io import hub

def slow(source, target):
    with open(os.path.join(target, "config.json"), "w") as f:
        f.write("{half")
    print("converting", flush=True)
    time.sleep(120)

hub.fetch("hf://openai-community/openai-gpt", slow)
"""


def test_a_conversion_killed_by_sigkill_is_redone_never_read(served, arrays, tmp_path):
    import signal
    import subprocess
    import sys

    from hub_server import environment

    served.commit(REPO, openai_gpt_files(arrays))
    process = subprocess.Popen(
        [sys.executable, "-c", KILLED_CONVERSION],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **environment(served, tmp_path)},
    )
    try:
        assert process.stdout.readline().strip() == "converting"  # bounded: the child sleeps, then ends
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    converted = os.path.join(os.environ["KGPT_CACHE"], "hub", "openai-community--openai-gpt")
    left = [n for n in os.listdir(converted) if n != "refs"]
    assert len(left) == 1 and left[0].startswith("."), left  # only the hidden, half-written folder
    backbone = kgpt.GPTBackbone.from_preset(f"hf://{REPO}")  # converts again; the dead process's folder goes
    assert backbone.num_layers == 2
    assert [n for n in os.listdir(converted) if n != "refs"] == [served.repos[REPO]["refs"]["main"]]


def test_an_interrupted_conversion_leaves_nothing(served, arrays):
    served.commit(REPO, openai_gpt_files(arrays))
    calls = []

    def interrupted(source, target):
        calls.append(target)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        hub.fetch(f"hf://{REPO}", interrupted)
    assert not os.path.exists(calls[0])


def test_an_unwritable_cache_is_named(served, arrays, tmp_path, monkeypatch):
    served.commit(REPO, openai_gpt_files(arrays))
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("KGPT_CACHE", str(tmp_path / "file"))
    with pytest.raises(CheckpointError, match=r"Cannot write the converted preset .* set KGPT_CACHE"):
        kgpt.GPTBackbone.from_preset(f"hf://{REPO}")


def test_a_hub_failing_on_its_side_falls_back_to_the_cached_commit(served, arrays, caplog):
    served.commit(REPO, openai_gpt_files(arrays))
    kgpt.GPTBackbone.from_preset(f"hf://{REPO}")
    served.failing = 503
    assert kgpt.GPTBackbone.from_preset(f"hf://{REPO}").num_layers == 2
    assert "cannot be reached (" in caplog.text and "using the cached commit" in caplog.text
    served.failing = None
    served.commit("someone/else", openai_gpt_files(arrays))
    served.failing = 500
    with pytest.raises(CheckpointError, match=r"hf://someone/else .*failed on its side \(HTTP 500\) and nothing"):
        kgpt.GPTBackbone.from_preset("hf://someone/else")


def test_offline_after_a_dry_run_names_the_weights_as_not_cached(served, arrays, monkeypatch):
    from huggingface_hub import constants

    served.commit(REPO, openai_gpt_files(arrays))
    description, _ = hub.check(f"hf://{REPO}")  # the dry run: configs and tokenizer files, no weights
    assert "model.safetensors" in description
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert "openai-gpt files" in hub.check(f"hf://{REPO}")[0]  # a dry run offline still checks it
    with pytest.raises(CheckpointError, match=r"not in the local cache and HF_HUB_OFFLINE is set"):
        kgpt.GPTBackbone.from_preset(f"hf://{REPO}")


def test_a_converted_folder_missing_its_marker_is_converted_again(served, arrays, caplog):
    served.commit(REPO, openai_gpt_files(arrays))
    first = kgpt.GPTBackbone.from_preset(f"hf://{REPO}")
    folder = hub.fetch(f"hf://{REPO}", kgpt.GPTBackbone.convert_openai_gpt)
    os.remove(os.path.join(folder, "kgpt-converted.json"))
    again = kgpt.GPTBackbone.from_preset(f"hf://{REPO}")
    assert "lacks its kgpt-converted.json" in caplog.text
    assert os.path.isfile(os.path.join(folder, "kgpt-converted.json"))
    np.testing.assert_array_equal(
        to_numpy(first.token_embedding.embeddings), to_numpy(again.token_embedding.embeddings)
    )


def test_the_cache_folder_expands_a_tilde(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KGPT_CACHE", "~/kgpt-cache")
    assert hub.cache_dir() == str(tmp_path / "kgpt-cache" / "hub")
    monkeypatch.delenv("KGPT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "~/xdg")
    assert hub.cache_dir() == str(tmp_path / "xdg" / "kgpt" / "hub")
