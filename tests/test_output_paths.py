"""Output paths the commands refuse in one line naming the flag (the run and its --dry_run alike), and the
permissions of what they write.

kgpt-train runs in-process through its real entry point, kgpt-predict in a process of its own (its flags
and kgpt-train's cannot both be defined in one); the paths are checked before any model is loaded or built,
so the model given to kgpt-predict need not exist.
"""

import dataclasses
import json
import os
import re
import shutil
import stat
import subprocess
import sys

import pytest
from conftest import cli

import kgpt
from kgpt.cli import analyze, train
from kgpt.errors import ConfigError, OutputDirError
from kgpt.io import storage
from kgpt.jobs import finetune, finetune_model, predict, run, rundir
from kgpt.jobs.config import FinetuneConfig, RunConfig
from kgpt.jobs.rundir import RunDirectory

# A tiny pre-training, should a path wrongly pass its checks.
TINY_LM = (
    "--task=lm",
    "--num_layers=1",
    "--num_heads=2",
    "--hidden_dim=16",
    "--intermediate_dim=32",
    "--sequence_length=16",
    "--batch_size=2",
    "--max_steps=1",
    "--warmup_steps=1",
    "--evaluations=1",
    "--num_merges=20",
    "--sample_tokens=0",
)


def one_line(code, err, prog):
    """The message of a one-line error (exit 1, no traceback, no usage line)."""
    assert code == 1, err[-3000:]
    assert "Traceback" not in err and "USAGE" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith(f"{prog}: error: ")]
    assert len(lines) == 1, err[-3000:]
    return lines[0][len(f"{prog}: error: ") :]


OUTPUT_DIRS = [
    ("afile/sub", "--output_dir afile/sub: afile is a file, not a folder."),
    ("afile", "--output_dir afile is a file, not a folder."),
    ("afile/", "--output_dir afile/ is a file, not a folder."),
    ("file://", "--output_dir file:// names no folder: add one after the scheme (file:///PATH)."),
    ("ram://", "--output_dir ram:// names no folder: add one after the scheme (ram://NAME)."),
    ("ram:///", "--output_dir ram:/// names no folder: add one after the scheme (ram://NAME)."),
    (
        "file://relative/x",
        "--output_dir file://relative/x: a file:// path must be absolute, file:///PATH with three "
        "slashes (file://relative/x names host 'relative'); or pass the local path relative/x.",
    ),
]


@pytest.mark.parametrize("dry", [True, False], ids=["dry_run", "run"])
@pytest.mark.parametrize("path,message", OUTPUT_DIRS, ids=[p for p, _ in OUTPUT_DIRS])
def test_an_output_dir_the_run_cannot_use_is_one_line_and_creates_nothing(
    path, message, dry, monkeypatch, capsys, tmp_path
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("mine\n")
    args = (*TINY_LM, f"--output_dir={path}") + (("--dry_run",) if dry else ())
    code, _, err = cli(monkeypatch, capsys, train, *args)
    assert one_line(code, err, "kgpt-train") == message
    assert os.listdir(tmp_path) == ["afile"] and (tmp_path / "afile").read_text() == "mine\n"


@pytest.mark.parametrize("dry", [True, False], ids=["dry_run", "run"])
def test_a_shards_dir_under_a_file_is_named_before_the_corpus_is_read(dry, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("mine\n")
    code, _, err = cli(monkeypatch, capsys, train, *TINY_LM, "--shards_dir=afile/sub", *(("--dry_run",) if dry else ()))
    assert one_line(code, err, "kgpt-train") == "--shards_dir afile/sub: afile is a file, not a folder."


REMOTE_INPUTS = [
    (("--task=text-classification", "--init=scratch", "--train_file=ram://t.csv"), "--train_file ram://t.csv"),
    (
        ("--task=text-classification", "--init=scratch", "--train_file=t.csv", "--test_file=gs://b/t.csv"),
        "--test_file gs://b/t.csv",
    ),
    (("--task=scitail", "--init=scratch", "--data_dir=gs://b/scitail"), "--data_dir gs://b/scitail"),
    (("--task=scitail", "--init=s3://b/lm"), "--init s3://b/lm"),
    ((*TINY_LM, "--corpus=gs://b/*.txt"), "--corpus gs://b/*.txt"),
    ((*TINY_LM, "--corpus=a.txt", "--tokenizer=ram://tok"), "--tokenizer ram://tok"),
]


@pytest.mark.parametrize("dry", [True, False], ids=["dry_run", "run"])
@pytest.mark.parametrize("args,named", REMOTE_INPUTS, ids=[named.split()[0] for _, named in REMOTE_INPUTS])
def test_an_input_with_a_url_scheme_is_named_not_read_as_a_local_path(args, named, dry, monkeypatch, capsys, tmp_path):
    # It was read as the relative path ram:/t.csv and reported missing.
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(monkeypatch, capsys, train, *args, *(("--dry_run",) if dry else ()))
    assert one_line(code, err, "kgpt-train") == (
        f"{named}: kgpt reads its inputs from local files (copy it here first; outputs may be remote)."
    )


def test_a_file_url_input_is_named_with_its_local_path(monkeypatch, capsys, tmp_path):
    args = ("--task=text-classification", "--init=scratch", f"--train_file=file://{tmp_path}/t.csv", "--dry_run")
    code, _, err = cli(monkeypatch, capsys, train, *args)
    assert one_line(code, err, "kgpt-train") == (
        f"--train_file file://{tmp_path}/t.csv: kgpt reads its inputs from local files (pass {tmp_path}/t.csv)."
    )


def test_kgpt_analyze_refuses_a_remote_output_dir_in_one_line(monkeypatch, capsys, tmp_path):
    code, _, err = cli(monkeypatch, capsys, analyze, "zero-shot", f"--init={tmp_path}", "--output_dir=ram://x")
    assert one_line(code, err, "kgpt-analyze") == (
        "--output_dir ram://x: kgpt-analyze writes a local folder (or a mounted bucket)."
    )


def test_a_tilde_the_shell_left_is_named(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(monkeypatch, capsys, train, *TINY_LM, "--output_dir=~/run", "--dry_run")
    assert one_line(code, err, "kgpt-train") == (
        f"--output_dir ~/run: the shell does not expand ~ after '='; pass "
        f"{os.path.expanduser('~/run')} (or --output_dir ~/run, with a space)."
    )
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")
def test_an_output_dir_in_a_folder_that_is_not_writable_is_named(monkeypatch, capsys, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    code, _, err = cli(monkeypatch, capsys, train, *TINY_LM, f"--output_dir={locked / 'run'}", "--dry_run")
    assert one_line(code, err, "kgpt-train") == f"--output_dir {locked / 'run'}: {locked} is not writable by this user."


def test_a_claim_makes_the_same_checks(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # where a claim that wrongly went on would write its local `ram:` folder
    with pytest.raises(storage.StorageError, match=r"^--output_dir ram:// names no folder"):
        RunDirectory("ram://", "pretrain", {}).__enter__()
    assert os.listdir(tmp_path) == []


def test_a_run_stopped_before_writing_anything_gives_its_claim_back(tmp_path):
    out = tmp_path / "out"
    config = RunConfig(output_dir=str(out))
    with pytest.raises(ConfigError, match="refused after the claim"):  # e.g. an --init of the wrong kind
        with run.workspace(config, "finetune", {"init": "classifier"}, "kgpt-test-"):
            raise ConfigError("refused after the claim")
    assert not (out / "run.json").exists()
    # The corrected command is not refused as "a run with other settings".
    with pytest.raises(ConfigError, match="stopped after writing"):
        with run.workspace(config, "finetune", {"init": "lm"}, "kgpt-test-"):
            (out / "metrics.json").write_text("{}")
            raise ConfigError("stopped after writing")
    # A run that wrote something keeps its claim: the same command resumes, another is refused.
    with pytest.raises(OutputDirError, match="other settings"):
        with run.workspace(config, "finetune", {"init": "classifier"}, "kgpt-test-"):
            pass


PREDICT_OUTPUTS = [
    ("afile/x.csv", "csv", False, "--output afile/x.csv: afile is a file, not a folder."),
    ("adir", "text", True, "--output adir is a folder, not a file."),
    ("adir/", "text", False, "--output adir/ ends with /, as a folder does: name a file."),
    ("old.tsv", "text", False, "--output old.tsv exists: pass --overwrite to replace it."),
    (
        "p.xyz",
        "csv",
        False,
        "--output p.xyz: a table's predictions are written as .csv, .tsv or .jsonl, by the "
        "extension; name the file with one of them (or pass - for standard output).",
    ),
    (
        "p.csv",
        "text",
        False,
        "--output p.csv: the predictions of a text file or a task's split are a TSV; name the "
        "file .tsv (or pass - for standard output).",
    ),
    ("ram://", "csv", False, "--output ram:// names no file: add one after the scheme (ram://NAME)."),
]


@pytest.mark.parametrize("output,read,overwrite,message", PREDICT_OUTPUTS, ids=[o for o, *_ in PREDICT_OUTPUTS])
def test_a_predict_output_it_cannot_write_is_refused_naming_the_flag(
    output, read, overwrite, message, monkeypatch, tmp_path
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("mine\n")
    (tmp_path / "old.tsv").write_text("old\n")
    (tmp_path / "adir").mkdir()
    with pytest.raises((ConfigError, storage.StorageError)) as refused:
        predict.check_output(output, read, overwrite)
    assert str(refused.value) == message


def test_predict_outputs_it_writes_pass():
    for output, read in (("-", "csv"), ("p.TSV", "text"), ("p.tab", "text"), ("p.jsonl", "csv"), ("p.csv", "tsv")):
        predict.check_output(output, read)


def test_a_predict_output_that_is_a_file_of_the_split_it_predicts_is_refused(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    os.makedirs("data/tsv_format")
    dev = "data/tsv_format/scitail_1.0_dev.tsv"
    with open(dev, "w") as f:
        f.write("A cat sat.\tA cat sat.\tentails\n")
    os.symlink(dev, "link.tsv")
    task = kgpt.TaskRegistry().get("scitail")
    for output in (dev, "./" + dev, "link.tsv"):
        with pytest.raises(ConfigError, match=rf"^--output {re.escape(output)} is {dev}, a file of the 'dev' split"):
            predict.check_output_not_read(output, task, "dev", "data")
    predict.check_output_not_read("p.tsv", task, "dev", "data")  # not there: the split is not read
    with open("other.tsv", "w") as f:
        f.write("mine\n")
    predict.check_output_not_read("other.tsv", task, "dev", "data")
    assert open(dev).read() == "A cat sat.\tA cat sat.\tentails\n"


def test_a_predict_output_naming_the_input_or_a_model_file_in_any_form_is_refused(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.tsv").write_text("hello\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    os.symlink("model", "link")
    url = f"file://{tmp_path}/in.tsv"
    with pytest.raises(ConfigError, match=rf"^--output {re.escape(url)} is the --input file"):
        predict.check_output(url, "text", True, "in.tsv")
    for output in ("model/config.json", f"file://{tmp_path}/model/config.json", "link/config.json"):
        with pytest.raises(ConfigError, match=rf"^--output {re.escape(output)} is config.json of the --model folder"):
            predict.check_output(output, "text", True, "in.tsv", "model")
    predict.check_output("model.tsv", "text", True, "in.tsv", "model")  # beside it
    predict.check_output("model/p.tsv", "text", True, "in.tsv", "model")  # a new file in it, beside its files
    predict.check_output("p.tsv", "text", True, "in.tsv", ".")  # run from inside the model folder
    (tmp_path / "folder.tsv").mkdir()  # predicted, then failed on a temporary file left beside it
    with pytest.raises(
        storage.StorageError, match=rf"^--output file://{tmp_path}/folder.tsv is a folder, not a file\.$"
    ):
        predict.check_output(f"file://{tmp_path}/folder.tsv", "text", True, "in.tsv")
    task = kgpt.TaskRegistry().get("scitail")
    os.makedirs("data/tsv_format")
    dev = "data/tsv_format/scitail_1.0_dev.tsv"
    with open(dev, "w") as f:
        f.write("A cat sat.\tA cat sat.\tentails\n")
    with pytest.raises(ConfigError, match="a file of the 'dev' split"):
        predict.check_output_not_read(f"file://{tmp_path}/{dev}", task, "dev", "data")


def test_an_output_dir_that_is_or_holds_the_init_model_in_any_form_is_refused(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    assert rundir.written_by_run(str(model), f"file://{model}") == "."
    assert rundir.written_by_run(f"file://{model}/", str(model)) == "."
    assert rundir.written_by_run(str(model), str(tmp_path)) is None  # "model" is not a run's output
    (tmp_path / "pretrained").mkdir()
    assert rundir.written_by_run(str(tmp_path / "pretrained"), f"file://{tmp_path}") == "pretrained"
    assert rundir.written_by_run("gs://b/m", "gs://b/m/") == "."
    assert rundir.written_by_run("gs://b/m", "gs://b/n") is None


def test_training_data_in_what_a_run_writes_is_refused(tmp_path):
    from kgpt.jobs import finetune

    (tmp_path / "out" / "data").mkdir(parents=True)
    (tmp_path / "out" / "data" / "train.csv").write_text("text,label\na,x\nb,y\n")
    (tmp_path / "out" / "mine.csv").write_text("text,label\na,x\nb,y\n")
    out = str(tmp_path / "out")
    # --overwrite deleted the training file with the run's data/, then stopped: no such file.
    config = FinetuneConfig(
        task="text-classification", init="scratch", data_dir=out, train_file="data/train.csv", output_dir=out
    )
    with pytest.raises(ConfigError, match=r"^--train_file .*data/train.csv is in data of the output directory .*out,"):
        finetune.check_config(config)
    finetune.check_config(dataclasses.replace(config, train_file="mine.csv"))  # beside the outputs: left alone
    with pytest.raises(ConfigError, match=r"^--data_dir .* is in data of the output directory"):
        rundir.check_inputs_outside(out, {"--data_dir": f"file://{out}/data/"}, beside=("--data_dir",))
    rundir.check_inputs_outside(out, {"--data_dir": out}, beside=("--data_dir",))


def run_predict(folder, *commands):
    """Runs kgpt-predict command lines (argument lists, --model=no_model added) in one process (a start-up each
    cost about 8 s): `[{"code", "error"}]` as the command ends them (1: a mistake, 2: a usage error)."""
    worker = os.path.join(os.path.dirname(__file__), "documented_commands_worker.py")
    items = [
        {"prog": "kgpt-predict", "args": ["--model=no_model", *args], "env": {}, "cwd": str(folder), "dry_run": False}
        for args in commands
    ]
    done = subprocess.run(
        [sys.executable, worker, "predict"],
        input=json.dumps(items),
        cwd=folder,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kgpt_predict_names_its_mistakes_before_loading_a_model_run_and_dry_run_alike(tmp_path):
    (tmp_path / "in.txt").write_text("hello\n")
    (tmp_path / "old.tsv").write_text("old\n")
    cases = [
        (["--input=in.txt", "--output=old.tsv"], 1, "--output old.tsv exists: pass --overwrite to replace it."),
        (  # the input was read, then replaced by its predictions
            ["--input=old.tsv", "--output=./old.tsv", "--overwrite"],
            1,
            "--output ./old.tsv is the --input file: name another file, so that the input stays.",
        ),
        (
            ["--input=in.txt", "--output=p.tsv"],
            1,
            "--model no_model: no such folder; pass the --output_dir of a kgpt-train --task NAME run.",
        ),
        (
            ["--input=in.txt", "--split=dev", "--output=p.tsv"],
            2,
            "--split dev picks a split of --data_dir; --input in.txt is predicted whole: drop --split.",
        ),
        (
            ["--input=gs://b/in.csv", "--output=p.csv"],
            1,
            "--input gs://b/in.csv: kgpt reads its inputs from local files (copy it here first; outputs may be "
            "remote).",
        ),
    ]
    commands = [args + dry for args, _, _ in cases for dry in ([], ["--dry_run"])]
    results = run_predict(tmp_path, *commands)
    for (args, code, message), ran, dry in zip(cases, results[::2], results[1::2]):
        for result in (ran, dry):
            assert (result["code"], result["error"]) == (code, message), (args, result)
    assert (tmp_path / "old.tsv").read_text() == "old\n"
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "old.tsv"]


@pytest.fixture
def umask():
    """Sets the process's umask for a test, and restores it after."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_outputs_are_created_with_the_umask_and_keep_the_mode_of_the_file_they_replace(umask, tmp_path):
    umask(0o022)
    storage.write_text(str(tmp_path / "a.txt"), "a")
    storage.write_json(str(tmp_path / "b.json"), {})
    umask(0o027)
    storage.write_text(str(tmp_path / "c.txt"), "c")
    assert (mode(tmp_path / "a.txt"), mode(tmp_path / "b.json"), mode(tmp_path / "c.txt")) == (0o644, 0o644, 0o640)
    os.chmod(tmp_path / "a.txt", 0o664)
    storage.write_text(str(tmp_path / "a.txt"), "again")  # as open(path, "w") would: its mode stays
    assert mode(tmp_path / "a.txt") == 0o664 and (tmp_path / "a.txt").read_text() == "again"
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []


def test_a_predict_output_that_is_a_symbolic_link_is_written_through_and_stays_a_link(tmp_path):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "p.tsv").write_text("old\n")
    os.symlink(tmp_path / "shared" / "p.tsv", tmp_path / "p.tsv")  # the link was replaced by a file
    storage.write_text(predict.through_link(str(tmp_path / "p.tsv")), "new\n")
    assert os.path.islink(tmp_path / "p.tsv") and (tmp_path / "shared" / "p.tsv").read_text() == "new\n"
    assert predict.through_link(str(tmp_path / "q.tsv")) == str(tmp_path / "q.tsv")


def test_a_claimed_directorys_run_file_is_readable_by_the_group_and_others_under_umask_022(umask, tmp_path):
    umask(0o022)
    with RunDirectory(str(tmp_path / "run"), "pretrain", {"seed": 0}):
        pass
    assert mode(tmp_path / "run" / "run.json") == 0o644


def test_a_setting_left_unset_is_named_so_when_a_rerun_gives_it(tmp_path):
    # --max_length unset is the model's context: "None" read as if it could not be 64.
    with RunDirectory(str(tmp_path), "finetune", {"max_length": None, "seed": 0}):
        pass
    with pytest.raises(OutputDirError, match=r"other settings \(max_length: not set there, 64 now\)"):
        RunDirectory(str(tmp_path), "finetune", {"max_length": 64, "seed": 0}).inspect()


def test_an_unset_max_length_is_recorded_as_the_length_it_stands_for(tiny_preset, tmp_path):
    # A rerun giving --max_length 128 to a 128-token model is the same run, not "other settings".
    def recorded(init, max_length=None):
        return finetune.run_settings(FinetuneConfig(task="rte", init=init, max_length=max_length))["max_length"]

    assert recorded(tiny_preset) == recorded(tiny_preset, 128) == recorded(tiny_preset, 1000) == 128
    assert recorded(tiny_preset, 20) == 20
    assert recorded("scratch") == recorded("scratch", 512) == 512
    assert recorded("demo") == recorded("demo", 64) == 64
    preprocessor = kgpt.GPTTaskPreprocessor(
        kgpt.GPTTokenizer.from_preset(tiny_preset), kgpt.TaskRegistry().get("rte").transform, sequence_length=40
    )
    model = kgpt.GPTTaskModel(
        kgpt.GPTBackbone.from_preset(tiny_preset),
        kgpt.tasks.heads.ClassificationHead(["a", "b"]),
        preprocessor=preprocessor,
    )
    model.save_to_preset(str(tmp_path / "tuned"))
    assert recorded(str(tmp_path / "tuned")) == recorded(str(tmp_path / "tuned"), 40) == 40  # its saved length
    assert recorded(str(tmp_path / "missing")) is None  # loading it says what is wrong


def test_a_fine_tuned_init_with_a_damaged_or_edited_preprocessor_names_the_file(tiny_preset, tmp_path):
    # The model loads the preprocessor in task.json; preprocessor.json, keras-hub's copy, is what kgpt's readers
    # and Preprocessor.from_preset see. An edit of either alone would be ignored by one of them.
    preprocessor = kgpt.GPTTaskPreprocessor(
        kgpt.GPTTokenizer.from_preset(tiny_preset), kgpt.TaskRegistry().get("rte").transform, sequence_length=40
    )
    kgpt.GPTTaskModel(
        kgpt.GPTBackbone.from_preset(tiny_preset),
        kgpt.tasks.heads.ClassificationHead(["a", "b"]),
        preprocessor=preprocessor,
    ).save_to_preset(str(tmp_path / "saved"))
    copy_edited = (
        r"tuned/preprocessor.json differs from the preprocessor saved in .*tuned/task.json \(sequence_length: "
    )
    cases = [
        (("preprocessor.json",), -3, copy_edited + r"-3 in preprocessor.json, 40 in task.json\): the model loads"),
        (("task.json",), 20, copy_edited + r"40 in preprocessor.json, 20 in task.json\)"),
        (
            ("preprocessor.json", "task.json"),
            -3,
            r"tuned/task.json: the preprocessor's sequence_length must be an integer >= 1, got -3\.$",
        ),
        (("preprocessor.json", "task.json"), 200, r"is 200, more than the model's context max_sequence_length=128"),
    ]
    for files, value, error in cases:
        shutil.rmtree(tmp_path / "tuned", ignore_errors=True)
        shutil.copytree(tmp_path / "saved", tmp_path / "tuned")
        for name in files:
            path = tmp_path / "tuned" / name
            path.write_text(path.read_text().replace('"sequence_length": 40', f'"sequence_length": {value}'))
        tuned = str(tmp_path / "tuned")
        for load in (finetune_model.starting_tokenizer, kgpt.GPTTaskModel.from_preset, predict.trained_columns):
            with pytest.raises(kgpt.errors.CheckpointError, match=error):  # the dry run, the run, kgpt-predict
                load(tuned)
