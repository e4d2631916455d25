"""Presets of every kind round-trip exactly; damaged or mismatched files fail with the file named."""

import json
import os
import shutil

import keras
import numpy as np
import pytest
from conftest import TINY, char_tokenizer

import kgpt


def backbone(**overrides):
    return kgpt.GPTBackbone(**{**TINY, "vocabulary_size": char_tokenizer().vocabulary_size(), **overrides})


def inputs(views=None, seed=0):
    ids = np.random.default_rng(seed).integers(1, 40, (3, 12)).astype("int32")
    mask = np.ones_like(ids)
    mask[0, 8:] = 0
    if views:
        ids, mask = np.stack([ids] * views, 1), np.stack([mask] * views, 1)
    return {"token_ids": ids, "padding_mask": mask}


def task_model():
    return kgpt.GPTTaskModel(backbone(), head=kgpt.tasks.heads.MultipleChoiceHead(2), num_views=2, task_name="toy")


def trained_task_model():
    model = task_model()
    x = inputs(views=2)
    y = {"task": np.array([0, 1, 1]), "lm": x["token_ids"][:, :, 1:]}
    model.fit(x, y, epochs=2, verbose=0)  # the weights move away from their initial values
    return model, x


def test_backbone_round_trip_is_exact(tmp_path):
    original = backbone()
    original.save_to_preset(str(tmp_path))
    metadata = json.loads((tmp_path / "metadata.json").read_text())
    assert metadata["kgpt_version"] == kgpt.__version__ and metadata["tasks"] == ["GPTCausalLM", "GPTTaskModel"]
    loaded = kgpt.GPTBackbone.from_preset(str(tmp_path))
    x = inputs()
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded(x)), keras.ops.convert_to_numpy(original(x)))
    assert kgpt.GPTBackbone.from_preset(str(tmp_path), dropout=0.0).dropout == 0.0


def test_causal_lm_round_trip_is_exact(tmp_path):
    lm = kgpt.GPTCausalLM(backbone())
    lm.save_to_preset(str(tmp_path))
    loaded = kgpt.GPTCausalLM.from_preset(str(tmp_path))
    ids = inputs()["token_ids"]
    np.testing.assert_array_equal(loaded.score(ids), lm.score(ids))


def test_task_model_round_trip_is_exact_and_leaves_the_optimizer_state_out(tmp_path):
    import h5py

    model, x = trained_task_model()
    assert model.optimizer.variables  # fine-tuned: Adam's moments exist, and keras-hub would save them
    model.save_to_preset(str(tmp_path))
    loaded = kgpt.GPTTaskModel.from_preset(str(tmp_path))
    assert loaded.task_name == "toy" and loaded.head == kgpt.tasks.heads.MultipleChoiceHead(2)
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))
    path = str(tmp_path / "task.weights.h5")
    with h5py.File(path) as f:
        names = []
        f.visit(names.append)
    assert names and not [n for n in names if n.startswith("optimizer")], names
    assert "layers/dense/vars/0" in names  # the head's kernel
    # A model with a built optimizer reads the file back (nothing of it expects an optimizer group).
    before = model.predict(x)
    model.classifier.kernel.assign(np.zeros(model.classifier.kernel.shape))
    model.load_task_weights(path)
    np.testing.assert_array_equal(model.predict(x), before)


def test_a_model_without_a_tokenizer_saved_over_another_models_preset_removes_its_tokenizer(tmp_path, caplog):
    # The old tokenizer stayed: from_preset then refused its vocabulary size, or took it without a word for the same.
    tokenizer = char_tokenizer()
    kgpt.GPTCausalLM(
        kgpt.GPTBackbone(**{**TINY, "vocabulary_size": tokenizer.vocabulary_size()}),
        preprocessor=kgpt.GPTCausalLMPreprocessor(tokenizer, sequence_length=16),
    ).save_to_preset(str(tmp_path))
    assert (tmp_path / "tokenizer.json").exists()
    other = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": tokenizer.vocabulary_size(), "num_layers": 1})
    with caplog.at_level("WARNING", logger="kgpt"):
        other.save_to_preset(str(tmp_path))
    assert [r.getMessage() for r in caplog.records] == [
        f"Warning: {tmp_path} held another model's preset: its tokenizer.json, assets/tokenizer are removed, as "
        f"this model has no tokenizer.",
        f"Warning: {tmp_path} held another model's preset: its preprocessor.json, task.json are removed, as this "
        f"model has none.",
    ]
    assert sorted(os.listdir(tmp_path)) == ["config.json", "metadata.json", "model.weights.h5"]
    # The same model saved again without its tokenizer (as a pre-training run saves) keeps it.
    tokenizer.save_to_preset(str(tmp_path))
    other.save_to_preset(str(tmp_path))
    assert (tmp_path / "tokenizer.json").exists()


def test_a_save_over_another_kind_of_model_names_what_it_removes(tmp_path, caplog):
    model, _ = trained_task_model()
    model.save_to_preset(str(tmp_path))
    with caplog.at_level("WARNING", logger="kgpt"):
        model.save_to_preset(str(tmp_path))  # the same kind again: replaced without a word
        assert caplog.records == []
        model.backbone.save_to_preset(str(tmp_path))
    assert [r.getMessage() for r in caplog.records] == [
        f"Warning: {tmp_path} held another model's preset: its task.json, task.weights.h5 are removed, as this "
        f"model has none."
    ]
    assert sorted(os.listdir(tmp_path)) == ["config.json", "metadata.json", "model.weights.h5"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="kgpt"):
        model.save_to_preset(str(tmp_path))  # the pre-trained backbone's weights are replaced
    assert [r.getMessage() for r in caplog.records] == [
        f"Warning: {tmp_path} held another model's preset: it is replaced by this model's, which adds "
        f"task.json, task.weights.h5."
    ]


def test_a_save_over_files_no_keras_save_wrote_is_refused_with_nothing_written(tmp_path):
    (tmp_path / "config.json").write_text('{"learning_rate": 0.1}\n')  # the user's own, not a model's
    (tmp_path / "metadata.json").write_text("not json")
    with pytest.raises(ValueError, match=r"holds 'config\.json', 'metadata\.json', which no Keras model save wrote"):
        backbone().save_to_preset(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["config.json", "metadata.json"]
    assert (tmp_path / "config.json").read_text() == '{"learning_rate": 0.1}\n'


def test_another_model_saved_over_a_run_s_results_names_them(tmp_path, caplog):
    model = backbone()
    model.save_to_preset(str(tmp_path))
    (tmp_path / "metrics.json").write_text("{}")
    (tmp_path / "predictions").mkdir()
    with caplog.at_level("WARNING", logger="kgpt"):
        model.save_to_preset(str(tmp_path))  # the same model again (a pre-training run saves each evaluation's)
        assert caplog.records == []
        kgpt.GPTBackbone(**{**TINY, "num_layers": 1}).save_to_preset(str(tmp_path))
    assert [r.getMessage() for r in caplog.records] == [
        f"Warning: {tmp_path} holds metrics.json, predictions/ of the model this save replaces: they describe that "
        f"model, not this one (move or delete them)."
    ]
    assert (tmp_path / "metrics.json").exists()


def test_a_preset_saved_by_a_newer_kgpt_or_keras_loads_with_a_warning(tmp_path, caplog):
    backbone().save_to_preset(str(tmp_path))
    path = tmp_path / "metadata.json"
    metadata = json.loads(path.read_text())
    path.write_text(json.dumps({**metadata, "kgpt_version": "99.0", "keras_version": "3.x"}))
    with caplog.at_level("WARNING", logger="kgpt"):
        kgpt.GPTBackbone.from_preset(str(tmp_path))
        kgpt.GPTBackbone.from_preset(str(tmp_path))  # once per file
    assert [r.getMessage() for r in caplog.records] == [
        f"Warning: {path}: saved with kgpt 99.0, newer than this kgpt {kgpt.__version__}: a setting it added may be "
        f"read otherwise or not at all; pip install -U kgpt to load it as it was saved.",
        f"Warning: {path}: keras_version '3.x' is not a version number.",
    ]
    caplog.clear()
    path.write_text(json.dumps(metadata))  # as saved: no word
    with caplog.at_level("WARNING", logger="kgpt"):
        kgpt.GPTBackbone.from_preset(str(tmp_path))
    assert caplog.records == []


def test_a_preset_is_a_local_folder_not_a_url(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for url in ("ram://m", "s3://b/m"):
        with pytest.raises(ValueError, match=rf"^preset_dir {url}: save_to_preset writes a local folder \(save here"):
            backbone().save_to_preset(url)
        with pytest.raises(kgpt.CheckpointError, match=rf"^{url}: kgpt loads a preset from a local folder"):
            kgpt.GPTTaskModel.from_preset(url)
    with pytest.raises(ValueError, match=rf"^preset_dir file://{tmp_path}/m: .* \(pass {tmp_path}/m\)\.$"):
        backbone().save_to_preset(f"file://{tmp_path}/m")
    assert os.listdir(tmp_path) == []  # no local "ram:" folder, no half-written preset


def test_tokenizer_round_trip_keeps_the_splitter(tmp_path):
    tokenizer = char_tokenizer()
    tokenizer.save_to_preset(str(tmp_path))
    assert json.loads((tmp_path / "tokenizer.json").read_text())["config"]["splitter"] == "regex"
    loaded = kgpt.GPTTokenizer.from_preset(str(tmp_path))
    assert loaded.fingerprint() == tokenizer.fingerprint()
    assert loaded.encode("a cab") == tokenizer.encode("a cab")


# --- damaged, foreign and mismatched files ------------------------------------


@pytest.fixture
def saved(tmp_path):
    model = kgpt.GPTTaskModel(backbone(), head=kgpt.tasks.heads.ClassificationHead(["a", "b", "c"]), task_name="toy")
    model.save_to_preset(str(tmp_path / "p"))
    return tmp_path / "p"


def test_missing_preset_directory(tmp_path):
    with pytest.raises(kgpt.CheckpointError, match="No preset directory .*or hf://OWNER/REPO on the Hugging Face Hub"):
        kgpt.GPTBackbone.from_preset(str(tmp_path / "absent"))


def test_missing_config(saved):
    os.remove(saved / "config.json")
    with pytest.raises(
        kgpt.CheckpointError, match=r"Missing .*config.json: expected the Keras config of a GPTBackbone"
    ):
        kgpt.GPTBackbone.from_preset(str(saved))


def test_config_that_is_not_json(saved):
    (saved / "config.json").write_text("{'not': json")
    with pytest.raises(kgpt.CheckpointError, match=r"config.json is not valid JSON"):
        kgpt.GPTBackbone.from_preset(str(saved))


def test_config_of_another_class_is_refused_before_anything_is_built(saved):
    config = json.loads((saved / "config.json").read_text())
    config.update(module="keras.layers", class_name="Lambda", registered_name=None)
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(kgpt.CheckpointError, match=r"describes None, expected 'kgpt>GPTBackbone'"):
        kgpt.GPTBackbone.from_preset(str(saved))


def test_a_backbone_preset_loads_as_a_causal_lm_with_its_tied_head(tmp_path):
    # As keras-hub builds a task from a preset without task.json (the Hub's converted openai-gpt files are one).
    saved = backbone()
    saved.save_to_preset(str(tmp_path))
    lm = kgpt.GPTCausalLM.from_preset(str(tmp_path))
    ids = np.arange(12, dtype="int32")[None] % saved.vocabulary_size
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    hidden = keras.ops.convert_to_numpy(saved(x))
    table = keras.ops.convert_to_numpy(saved.token_embedding.embeddings)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(lm(x)), hidden @ table.T, atol=1e-4, rtol=1e-4)
    assert lm.preprocessor is None  # no tokenizer in the folder: token ids only
    # A task model can start from it, given the task to fine-tune for.
    with pytest.raises(ValueError, match="is not a fine-tuned task model: pass task=NAME"):
        kgpt.GPTTaskModel.from_preset(str(tmp_path))


def test_truncated_weights(saved):
    data = (saved / "model.weights.h5").read_bytes()
    (saved / "model.weights.h5").write_bytes(data[: len(data) // 2])
    with pytest.raises(kgpt.CheckpointError, match=r"model.weights.h5 is not a readable Keras weights file"):
        kgpt.GPTTaskModel.from_preset(str(saved))


def test_missing_head_weights(saved):
    os.remove(saved / "task.weights.h5")
    with pytest.raises(kgpt.CheckpointError, match=r"Missing .*task.weights.h5"):
        kgpt.GPTTaskModel.from_preset(str(saved))


@pytest.mark.parametrize(
    "overrides, message",
    [
        # Keras alone loads this silently.
        ({"num_layers": 3}, r"num_layers is 2, but .*model.weights.h5 holds the weights of a model with num_layers=3"),
        # Fewer weights than the config needs: refused from the sizes, before the model is built.
        (
            {"vocabulary_size": 50},
            r"vocabulary_size is \d+, but .* holds the weights of a model with vocabulary_size=50",
        ),
        # More than one size differs: the arrays are compared.
        ({"num_layers": 3, "num_heads": 4}, r"the file holds 50 arrays, the model has 34 weights"),
        ({"num_layers": 1, "max_sequence_length": 8}, r"describes a model of at least [\d,]+ weights, but .* holds"),
    ],
)
def test_weights_of_another_model_are_refused(saved, tmp_path, overrides, message):
    backbone(**overrides).save_to_preset(str(tmp_path / "other"))
    shutil.copy(tmp_path / "other" / "model.weights.h5", saved / "model.weights.h5")
    with pytest.raises(
        kgpt.CheckpointError,
        match=r"model.weights.h5 (does not fit the model .*config.json describes|"
        r"holds [\d,]+: the config and the weights do not belong|holds the weights of a model with)",
    ):
        kgpt.GPTBackbone.from_preset(str(saved))
    with pytest.raises(kgpt.CheckpointError, match=message):
        kgpt.GPTTaskModel.from_preset(str(saved))


def test_tokenizer_preset_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"No tokenizer in .*tokenizer.json \(a kgpt preset\)"):
        kgpt.GPTTokenizer.from_preset(str(tmp_path))
    char_tokenizer().save_to_preset(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text(json.dumps({"class_name": "Other"}))
    with pytest.raises(kgpt.CheckpointError, match=r"tokenizer.json: expected a kgpt GPTTokenizer config"):
        kgpt.GPTTokenizer.from_preset(str(tmp_path))


def _edit_json(path, edit):
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    "edit, message",
    [
        # One size edited is named, with the value the weights were saved with.
        (lambda c: c["config"].update(vocabulary_size=20_000_000), r"vocabulary_size is 20000000, but .*size=98:"),
        (lambda c: c["config"].update(num_layers=10**9), r"num_layers is 1000000000, but .*model with num_layers=2:"),
        (lambda c: c["config"].update(num_layers=10**9, hidden_dim=32), r"at least [\d,]+ weights, but .* holds"),
        (lambda c: c["config"].update(hidden_dim="abc"), r"config.json: hidden_dim must be an integer, got 'abc'"),
        (lambda c: c["config"].update(dropout=[1]), r"config.json: dropout must be a number in \[0, 1\), got \[1\]"),
        (lambda c: c["config"].pop("num_heads"), r"config.json: missing key 'num_heads': a GPTBackbone config needs"),
        (lambda c: c["config"].update(dropout=float("nan")), r"config.json: dropout must be a number in .*got nan"),
        (lambda c: c["config"].update(num_heads=3), r"config.json: hidden_dim \(16\) must be divisible by num_heads"),
        # Sizes the weights do not have, though no more of them than the file holds: refused before building too.
        (lambda c: c["config"].update(num_heads=4), r"config.json: num_heads is 4, but .* num_heads=2: the config"),
        (
            lambda c: c["config"].update(num_heads=4, max_sequence_length=8),
            r"does not fit the model .*config.json describes.*Expected but missing: \[4, 4\] x6, .*\[8, 16\] x1",
        ),
    ],
)
def test_tampered_config_is_refused_before_anything_is_built(tmp_path, edit, message):
    backbone().save_to_preset(str(tmp_path))
    _edit_json(tmp_path / "config.json", edit)
    with pytest.raises(kgpt.CheckpointError, match=message):
        kgpt.GPTBackbone.from_preset(str(tmp_path))


def test_a_key_the_backbone_does_not_take_is_named_in_a_warning(tmp_path, caplog):
    backbone().save_to_preset(str(tmp_path))
    _edit_json(tmp_path / "config.json", lambda c: c["config"].update(colour="blue", dropuot=0.2))
    with caplog.at_level("WARNING", logger="kgpt"):
        kgpt.GPTBackbone.from_preset(str(tmp_path))
    assert f"{tmp_path / 'config.json'}: GPTBackbone takes no 'colour', 'dropuot': ignored." in caplog.text


@pytest.mark.parametrize("sizes", [{}, {"num_heads": 4, "num_layers": 3}, {"num_heads": 1, "max_sequence_length": 97}])
def test_the_shapes_a_config_describes_are_the_models(sizes):
    """`GPTBackbone.weight_shapes` (the preset check before building) and the model agree."""
    import collections

    model = backbone(**sizes)
    assert kgpt.GPTBackbone.weight_shapes(model.get_config()) == collections.Counter(
        tuple(v.shape) for v in model.weights
    )


def test_a_key_given_twice_in_a_preset_file_is_named(tmp_path):
    backbone().save_to_preset(str(tmp_path))
    text = (tmp_path / "config.json").read_text()
    (tmp_path / "config.json").write_text(text.replace('"num_layers": 2,', '"num_layers": 2, "num_layers": 12,', 1))
    with pytest.raises(kgpt.CheckpointError, match=r"config.json: the key 'num_layers' is given twice in one object"):
        kgpt.GPTBackbone.from_preset(str(tmp_path))  # json read 12, the last


def test_config_nested_too_deeply_is_a_checkpoint_error(tmp_path):
    backbone().save_to_preset(str(tmp_path))
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(kgpt.CheckpointError, match="config.json is nested too deeply"):
        kgpt.GPTBackbone.from_preset(str(tmp_path))


def test_tampered_task_config_is_refused_before_anything_is_built(tmp_path):
    task_model().save_to_preset(str(tmp_path))  # untrained: only its task.json is read before the refusal
    _edit_json(tmp_path / "task.json", lambda c: c["config"]["backbone"]["config"].update(num_layers=10**9))
    with pytest.raises(kgpt.CheckpointError, match=r"task.json: num_layers is 1000000000, but .* num_layers=2:"):
        kgpt.GPTTaskModel.from_preset(str(tmp_path))


def test_hugging_face_config_with_more_layers_than_the_file_is_refused(tmp_path):
    model = backbone(intermediate_dim=4 * TINY["hidden_dim"])
    model.save_original(str(tmp_path / "hf"), format="huggingface")
    _edit_json(tmp_path / "hf" / "config.json", lambda c: c.update(n_layer=10**9))
    with pytest.raises(
        kgpt.CheckpointError, match=r"says n_layer=1000000000, but .*model.safetensors holds blocks 0-1"
    ):
        kgpt.GPTBackbone.from_original(str(tmp_path / "hf"))


@pytest.mark.parametrize("edit", [lambda c: c["config"].update(foo=1), lambda c: c["config"].update(splitter=7)])
def test_tampered_tokenizer_config_is_a_checkpoint_error(tmp_path, edit):
    char_tokenizer().save_to_preset(str(tmp_path))
    _edit_json(tmp_path / "tokenizer.json", edit)
    with pytest.raises(kgpt.CheckpointError, match=r"tokenizer.json: cannot build a GPTTokenizer from it"):
        kgpt.GPTTokenizer.from_preset(str(tmp_path))


def _sst2_model(sequence_length=12):
    preprocessor = kgpt.GPTTaskPreprocessor(
        char_tokenizer(), kgpt.TaskRegistry().get("sst2").transform, sequence_length=sequence_length
    )
    head = kgpt.tasks.heads.ClassificationHead(["negative", "positive"])
    return kgpt.GPTTaskModel(backbone(), head, preprocessor=preprocessor, task_name="sst2")


def _set_dropout(preset, name, value):
    """Sets the backbone's dropout in the preset's file `name` (config.json, or task.json's copy)."""
    config = json.loads((preset / name).read_text())
    (config["config"]["backbone"] if name == "task.json" else config)["config"]["dropout"] = value
    (preset / name).write_text(json.dumps(config))


def test_an_edit_of_one_copy_of_a_task_presets_backbone_is_refused_and_its_remedies_load(tmp_path):
    # config.json is keras-hub's copy of task.json's backbone: the task model loaded task.json's without a word.
    saved, edited = tmp_path / "p", tmp_path / "edited"
    task_model().save_to_preset(str(saved))
    for name, values in (("config.json", "0.0 in config.json, 0.1"), ("task.json", "0.1 in config.json, 0.0")):
        shutil.rmtree(edited, ignore_errors=True)
        shutil.copytree(saved, edited)
        _set_dropout(edited, name, 0.0)
        with pytest.raises(kgpt.CheckpointError) as refused:
            kgpt.GPTTaskModel.from_preset(str(edited))
        assert str(refused.value) == (
            f"{edited / 'config.json'} differs from the backbone saved in {edited / 'task.json'} (dropout: {values} "
            f"in task.json): the model loads task.json's, other readers config.json, so an edit of one alone would "
            f"be ignored. Restore the edited file, or make the same edit in both."
        )
    # What the message says works: the same edit in both, or the edited file restored.
    _set_dropout(edited, "config.json", 0.0)
    assert kgpt.GPTTaskModel.from_preset(str(edited)).backbone.dropout == 0.0
    _set_dropout(edited, "config.json", 0.1)
    _set_dropout(edited, "task.json", 0.1)
    assert kgpt.GPTTaskModel.from_preset(str(edited)).backbone.dropout == 0.1
    # A backbone preset has one copy: its edit is the model's.
    backbone().save_to_preset(str(tmp_path / "backbone"))
    _set_dropout(tmp_path / "backbone", "config.json", 0.0)
    assert kgpt.GPTBackbone.from_preset(str(tmp_path / "backbone")).dropout == 0.0
    assert kgpt.GPTCausalLM.from_preset(str(tmp_path / "backbone")).backbone.dropout == 0.0


def test_an_edited_preprocessor_copy_names_a_remedy_that_works(tmp_path):
    saved = tmp_path / "p"
    _sst2_model().save_to_preset(str(saved))
    nested = json.loads((saved / "task.json").read_text())["config"]["preprocessor"]
    _edit_json(saved / "preprocessor.json", lambda c: c["config"].update(sequence_length=8))
    with pytest.raises(kgpt.CheckpointError) as refused:
        kgpt.GPTTaskModel.from_preset(str(saved), sequence_length=8)  # the check reads the files, not the override
    assert str(refused.value).endswith(
        "(sequence_length: 8 in preprocessor.json, 12 in task.json): the model loads task.json's, other readers "
        "preprocessor.json, so an edit of one alone would be ignored. Restore the edited file, or make the same edit "
        "in both. To pack to another length, restore the file and load with sequence_length= (kgpt-predict "
        "--max_length): save_to_preset keeps it."
    )
    (saved / "preprocessor.json").write_text(json.dumps(nested))  # restored from task.json's entry
    model = kgpt.GPTTaskModel.from_preset(str(saved), sequence_length=8)
    assert model.preprocessor.sequence_length == 8
    model.save_to_preset(str(tmp_path / "again"))
    assert kgpt.GPTTaskModel.from_preset(str(tmp_path / "again")).preprocessor.sequence_length == 8


def test_a_preset_is_not_saved_inside_a_file(tmp_path):
    # The folder's own check named a file given as the folder, but one on the way gave "[Errno 20] Not a directory".
    afile = tmp_path / "afile"
    afile.write_text("x")
    model = _sst2_model()
    saves = (model.save_to_preset, model.backbone.save_to_preset, model.preprocessor.save_to_preset)
    for save in (*saves, model.preprocessor.tokenizer.save_to_preset):
        for path in (f"{afile}/sub", f"{afile}/sub/deeper"):
            with pytest.raises(ValueError) as refused:
                save(path)
            assert str(refused.value) == (
                f"{afile} is a file: a preset is saved as a folder, not inside a file ({path}); pass a folder's path."
            )
        with pytest.raises(ValueError, match=r"afile is a file: a preset is saved as a folder; pass a folder's path"):
            save(f"{afile}/")
    assert os.listdir(tmp_path) == ["afile"]
