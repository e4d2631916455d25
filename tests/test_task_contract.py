"""The contract of kgpt.testing, run over every registered task (built-in here; see test_plugins)."""

import os
import tempfile

import pytest
from conftest import char_tokenizer, one_backend

import kgpt
import kgpt.testing
from kgpt.tasks import transforms

REGISTRY = kgpt.TaskRegistry()


def test_no_plugin_problems():
    assert REGISTRY.problems() == []


# The contract checks a task's definition, reader, transformation and head shapes; the one training step it takes
# is the same Keras code for every task, which each paper task's end-to-end run trains on both backends.
@one_backend("jax")
@pytest.mark.parametrize("name", REGISTRY.names())
def test_task_contract(name, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the embedded data is written, and removed
    # A character vocabulary keeps the tiny model small; the GPT-1 default is the same code path.
    kgpt.testing.check_task(REGISTRY.get(name), tokenizer=char_tokenizer())
    assert os.listdir(tmp_path) == []


def test_contract_catches_a_reader_without_sources():
    task = kgpt.Task(
        name="careless",
        transform=transforms.Entailment(),
        labels=("a", "b"),
        read=lambda split, data_dir: [kgpt.Example(segments=("p", "h"), label="a")],
    )
    with pytest.raises(AssertionError, match="Task 'careless': example without a source"):
        kgpt.testing.check_task(task, data_dir="unused")


def test_contract_catches_labels_outside_the_label_set():
    task = kgpt.Task(
        name="wrong",
        transform=transforms.Classification(),
        labels=("a", "b"),
        read=lambda split, data_dir: [kgpt.Example(segments=("t",), label="c", source="f:1")],
    )
    with pytest.raises(kgpt.DataError, match="f:1: label 'c' is not one of 'a', 'b'"):
        kgpt.testing.check_task(task, data_dir="unused")
