"""The parts of a run on several processes that one process can check: finding the processes, shards built by a
team, each process's rows, gradient accumulation, progress lines, an interrupted epoch's loss."""

import json
import os
import signal
import threading

import keras
import numpy as np
import pytest
from conftest import TINY, char_tokenizer

import kgpt
from kgpt.data import batching, shards
from kgpt.errors import ConfigError, Preempted
from kgpt.jobs import pretrain as pretrain_lib
from kgpt.jobs.config import FinetuneConfig, PretrainConfig
from kgpt.jobs.finetune import finetune
from kgpt.jobs.pretrain import pretrain
from kgpt.parallel import cluster, distribute, placement
from kgpt.train import callbacks
from kgpt.train.optimizers import WarmupSchedule

JAX = keras.config.backend() == "jax"


# --- finding the processes -----------------------------------------------------------------------------


def test_flags_make_a_cluster_and_tensorflow_gets_every_address():
    found = placement.resolve("10.0.0.1:8476", 2, 1, environ={}, backend="jax")
    assert (found.num_processes, found.process_id, found.coordinator, found.chief) == (2, 1, "10.0.0.1:8476", False)
    found = placement.resolve("10.0.0.1:8476", 3, 0, environ={}, backend="tensorflow")
    assert found.addresses == ("10.0.0.1:8476", "10.0.0.1:8477", "10.0.0.1:8478")  # one host: consecutive ports
    found = placement.resolve("a:1,b:2", 2, 1, environ={}, backend="tensorflow")
    assert found.addresses == ("a:1", "b:2") and found.coordinator == "a:1"
    assert placement.resolve("10.0.0.1:8476", 1, 0, environ={}, backend="jax") == placement.Cluster()


@pytest.mark.parametrize(
    "args, message",
    [
        (("h:1", 2, 2), "--process_id: process 2 is not one of the 2 processes (0..1)."),
        (("h:1", 0, 0), "--num_processes must be an integer >= 1, got 0."),
        (("h:1", 2.5, 0), "--num_processes must be an integer, got 2.5 (float)."),  # read as 2 once
        (("h:1", 2, -1), "--process_id must be an integer >= 0, got -1."),
        ((None, 2, 0), "--coordinator_address missing"),
        (("h:1", None, None), "--num_processes, --process_id missing"),
        (("h", 2, 0), "--coordinator_address: expected HOST:PORT"),
        (("h:99999", 2, 0), "--coordinator_address: expected HOST:PORT"),
        (("a:1,b:2,c:3", 2, 0), "--coordinator_address: 3 addresses for 2 processes"),
    ],
)
def test_flags_that_cannot_run_are_named(args, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        placement.resolve(*args, environ={}, backend="jax")


@pytest.mark.parametrize(
    "environ, backend, expected",
    [
        (
            {
                "SLURM_JOB_ID": "7",
                "SLURM_STEP_NODELIST": "n[1-2]",
                "SLURM_NTASKS": "4",
                "SLURM_PROCID": "3",
                "SLURM_LOCALID": "1",
            },
            "jax",
            (4, 3, "SLURM"),
        ),
        (
            {"OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"},
            "jax",
            (2, 1, "Open MPI"),
        ),
        ({"TPU_WORKER_HOSTNAMES": "t0,t1,t2,t3", "TPU_WORKER_ID": "2"}, "jax", (4, 2, "Cloud TPU")),
        (
            {
                "TF_CONFIG": json.dumps(
                    {"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"]}, "task": {"type": "worker", "index": 1}}
                )
            },
            "tensorflow",
            (3, 2, "TF_CONFIG"),
        ),
        (
            {
                "SLURM_JOB_ID": "7",
                "SLURM_STEP_NODELIST": "n1",
                "SLURM_NTASKS": "1",
                "SLURM_PROCID": "0",
                "SLURM_LOCALID": "0",
            },
            "jax",
            (1, 0, ""),
        ),  # one task: one process, nothing to join
        ({"TF_CONFIG": "{}"}, "jax", (1, 0, "")),  # TF_CONFIG is TensorFlow's
    ],
)
def test_the_environment_describes_the_processes(environ, backend, expected):
    found = placement.resolve(environ=environ, backend=backend)
    assert (found.num_processes, found.process_id, found.found_by) == expected


def test_a_tf_config_that_cannot_be_read_is_named():
    with pytest.raises(ConfigError, match="TF_CONFIG cannot be read"):
        placement.resolve(environ={"TF_CONFIG": "{not json"}, backend="tensorflow")
    with pytest.raises(ConfigError, match="on TensorFlow pass every process's address"):
        placement.resolve("auto", environ={}, backend="tensorflow")


@pytest.mark.parametrize("count", ["x", "1_000", "\u0664", "2.5", "nan"])
def test_a_count_in_the_environment_that_is_no_integer_is_named(count):
    environ = {"OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:1", "OMPI_COMM_WORLD_SIZE": count}
    with pytest.raises(ConfigError, match=rf"^OMPI_COMM_WORLD_SIZE must be an integer, got {count!r}\.$"):
        placement.resolve(environ=environ, backend="jax")


@pytest.mark.parametrize("devices", [0, 1.5])
def test_model_parallel_takes_a_count_of_devices(devices):
    # The only check of RunConfig.model_parallel too; before the backend's, so on both backends.
    with pytest.raises(ConfigError, match=r"^model_parallel must be an integer"):
        distribute.check_placement("model_parallel", batch_size=4, model_devices=devices)


def test_differing_settings_are_listed_by_flag():
    chief = {"kgpt": "0.1.0 (source a)", "settings": {"learning_rate": 1e-3, "seed": 0}}
    other = {"kgpt": "0.1.0 (source b)", "settings": {"learning_rate": 2e-3, "seed": 0}}
    assert cluster._differences(chief, other) == [
        "kgpt is '0.1.0 (source a)' on process 0, '0.1.0 (source b)' there",
        "--learning_rate is 0.001 on process 0, 0.002 there",
    ]


def test_one_process_exchanges_with_itself():
    assert cluster.allgather(b"abc") == [b"abc"] and cluster.any_process(True) and not cluster.any_process(False)
    cluster.check_agreement({"settings": {}})  # nothing to compare


# What the runtimes said when process 1 was killed (kill -9), on process 0; the third names the peer by address.
LOST = [
    "UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:538] Read error "
    "[127.0.0.1]:19689: Connection reset by peer",
    "Collective ops is aborted by: recvmsg:Connection reset by peer\nAdditional GRPC error information from "
    "remote target /job:worker/replica:0/task:2 while calling /tensorflow.WorkerService/RecvBuf",
    "UNAVAILABLE: failed to connect to all addresses; last error: ipv4:10.0.0.3:8478: Connection refused",
]


@pytest.mark.parametrize(
    "count, text, expected",
    [
        (2, LOST[0], "process 1 of 2 stopped (its connection closed)"),
        (3, LOST[0], "another of the 3 processes stopped (its connection closed)"),  # gloo names a socket only
        (3, LOST[1], "process 2 of 3 stopped (its connection closed)"),
        (3, LOST[2], "process 2 of 3 stopped (UNAVAILABLE: failed to connect"),
    ],
)
def test_a_lost_process_is_named_in_one_line(monkeypatch, capfd, count, text, expected):
    addresses = tuple(f"10.0.0.{i + 1}:{8476 + i}" for i in range(count))
    monkeypatch.setattr(cluster, "_current", placement.Cluster(count, 0, addresses[0], addresses, "flags"))
    monkeypatch.setattr(cluster, "PROG", "kgpt")
    monkeypatch.setattr(cluster.os, "_exit", lambda code: (_ for _ in ()).throw(SystemExit(code)))
    error = RuntimeError(text)
    assert cluster.lost_process(error)
    with pytest.raises(SystemExit):
        cluster.stop_lost(error)
    (line,) = capfd.readouterr().err.splitlines()
    assert line.startswith(f"kgpt: error: {expected}") and "process 0 stopped too. Rerun every process" in line, line


@pytest.mark.parametrize(
    "answers, expected",
    [
        ({0: "1", 2: "1"}, [1]),  # process 1 did not answer
        ({0: "1"}, [1, 2]),  # nor 2, within the wait
        (RuntimeError("UNAVAILABLE: recvmsg:Connection reset by peer"), [0]),  # the store is process 0's
        (RuntimeError("INTERNAL: something else"), None),
    ],
)
def test_a_roll_call_of_a_jax_run_finds_the_processes_that_do_not_answer(monkeypatch, answers, expected):
    from jax._src import distributed

    class Store:  # the coordination service's key-value store, as jax.distributed's client reaches it
        def key_value_set(self, key, value, allow_overwrite=False):
            if isinstance(answers, Exception):
                raise answers

        def key_value_dir_get(self, prefix):
            return [(f"{prefix}{i}", v) for i, v in answers.items()]

    monkeypatch.setattr(distributed.global_state, "client", Store())
    assert cluster.roll_call(3, 0, seconds=0.5) == expected


def test_the_runtimes_report_of_a_lost_process_is_not_repeated():
    from kgpt import _quiet

    for line in (
        "E0000 00:00:1795806503.639976   18776 ring_alg.cc:291] Aborting RingGather with UNAVAILABLE: "
        "recvmsg:Connection reset by peer",
        "Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling",
        ':UNKNOWN:Error received from peer  {grpc_message:"recvmsg:Connection reset by peer", grpc_status:14}',
        "E0000 00:00:1795806503.647740   18776 base_collective_executor.cc:252] "
        "BaseCollectiveExecutor::StartAbort UNAVAILABLE: recvmsg:Connection reset by peer",
    ):
        assert _quiet.NOISE.search(line), line


# --- shards built by a team ---------------------------------------------------------------------------


def test_a_team_builds_the_shards_one_process_builds(tmp_path):
    """Three processes (threads here) each tokenize every third chunk; process 0 joins them: the same bytes."""
    tokenizer = kgpt.GPTTokenizer.gpt1()
    files = []
    for name, count in (("a.txt", 40), ("b.txt", 1), ("c.txt", 25)):
        path = tmp_path / name
        path.write_text("".join(f"Line {i} of {name}: the keeper &amp; the sea.\n\n" for i in range(count)))
        files.append(str(path))
    alone = shards.build_shards(files, tokenizer, str(tmp_path / "alone"), workers=1, chunk_bytes=200, shard_tokens=300)
    barrier, votes = threading.Barrier(3, timeout=60), {}

    def agree(index, flag):
        votes[index] = flag
        barrier.wait()
        result = all(votes.values())
        barrier.wait()
        return result

    built, errors = {}, []

    def member(index):
        try:
            team = shards.Team(index, 3, lambda flag: agree(index, flag))
            built[index] = shards.build_shards(
                files, tokenizer, str(tmp_path / "team"), workers=1, chunk_bytes=200, shard_tokens=300, team=team
            )
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=member, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and len(built) == 3, errors
    assert len(alone.shards) > 1 and all(index.total_tokens == alone.total_tokens for index in built.values())
    for shard in alone.shards:
        assert (tmp_path / "team" / shard["file"]).read_bytes() == (tmp_path / "alone" / shard["file"]).read_bytes()
    assert not (tmp_path / "team" / shards.PARTS).exists()  # the parts are removed once joined
    # Built again with the same files, they are reused by every member.
    again = shards.build_shards(files, tokenizer, str(tmp_path / "team"), team=shards.Team(0, 1))
    assert again.shards == built[0].shards


# --- each process's rows ------------------------------------------------------------------------------


def test_the_shards_of_a_batch_are_the_batch_filled_to_split_evenly():
    split = batching.SplitBuilder("train", num_views=1)
    rng = np.random.default_rng(0)
    for i in range(13):
        split.add([list(rng.integers(1, 50, rng.integers(3, 20)))], target=i % 2, uid=str(i))
    split = split.build()
    whole = list(batching.dataset(split, 5, seed=3).as_numpy_iterator())
    parts = [
        list(batching.dataset(split, 5, seed=3, shards=(i, i + 1, 2), pad_to=2).as_numpy_iterator()) for i in range(2)
    ]
    assert len(whole) == len(parts[0]) == len(parts[1]) == 3
    for batch, first, second in zip(whole, *parts):
        (x, y, _w), (x0, _y0, w0), (x1, _y1, w1) = batch, first, second
        rows = len(y["task"])
        joined = np.concatenate([x0["token_ids"], x1["token_ids"]])
        assert len(joined) == rows + rows % 2  # filled to an even count, with rows that weigh nothing
        np.testing.assert_array_equal(joined[:rows], x["token_ids"])
        weights = np.concatenate([w0["task"], w1["task"]])
        assert weights.tolist() == [1.0] * rows + [0.0] * (rows % 2)
        assert not np.concatenate([w0["lm"], w1["lm"]])[rows:].any()
    # Micro-batches (gradient accumulation): each batch comes as 2 consecutive halves, filled to split in 2.
    micro = list(batching.dataset(split, 5, seed=3, micro_batches=2).as_numpy_iterator())
    assert len(micro) == 6
    rows = len(whole[0][1]["task"])
    np.testing.assert_array_equal(
        np.concatenate([micro[0][0]["token_ids"], micro[1][0]["token_ids"]])[:rows], whole[0][0]["token_ids"]
    )


def test_one_process_feeds_every_row():
    assert distribute.local_shards() == (0, 1, 1)
    assert distribute.local_rows(8, (1, 2, 4)) == (2, 4)


def test_tensorflow_replicas_refuse_gradient_accumulation(monkeypatch):
    if JAX:
        pytest.skip("JAX accumulates on any number of devices")

    monkeypatch.setattr(distribute, "mesh_devices", lambda: ["/cpu:0", "/cpu:1"])
    with pytest.raises(ConfigError, match="gradient_accumulation_steps 2 with 2 TensorFlow replicas"):
        distribute.check_placement("data_parallel", batch_size=4, accumulation=2)
    with pytest.raises(
        ConfigError,
        match="each micro-batch .batch_size / gradient_accumulation_steps = 3 rows. must be a multiple of 2",
    ):
        distribute.check_placement("data_parallel", batch_size=3, accumulation=2)
    assert distribute.check_placement("data_parallel", batch_size=4) == 2


def test_every_held_out_window_is_scored_however_many_devices_share_a_batch(causal_lm):
    # 11 windows in batches of 4: the last 3 split over 2 devices only when filled (they were dropped).
    tokens = np.random.default_rng(0).integers(1, 97, 11 * 8 + 1)
    causal_lm.compile()
    scores = {}
    for devices in (1, 2):
        data = pretrain_lib._validation(tokens, 8, devices, 4)
        batches = list(data.as_numpy_iterator())
        assert [len(y) for _, y, _ in batches] == [4, 4, 3 if devices == 1 else 4]
        scored = np.concatenate([x["token_ids"][w[:, 0] > 0] for x, _, w in batches])
        np.testing.assert_array_equal(scored, tokens[:88].reshape(11, 8))
        scores[devices] = causal_lm.evaluate(data, return_dict=True, verbose=0)
    for name in scores[1]:
        np.testing.assert_allclose(scores[2][name], scores[1][name], rtol=1e-6, err_msg=name)


# --- gradient accumulation ------------------------------------------------------------------------------


def test_the_schedule_counts_updates_not_micro_batches():
    plain, accumulated = WarmupSchedule(1e-3, 10, 100), WarmupSchedule(1e-3, 10, 100, gradient_accumulation_steps=4)
    for update in (0, 5, 10, 50, 99):
        for micro in range(4):
            assert float(accumulated(update * 4 + micro)) == pytest.approx(float(plain(update)))
    assert accumulated.get_config()["gradient_accumulation_steps"] == 4
    assert "gradient_accumulation_steps" not in plain.get_config()  # configs saved before it still read the same


def tiny_pretrain(tmp_path, name, **overrides):
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        rng = np.random.default_rng(0)
        words = "the keeper of the lighthouse wrote a date in the log every night".split()
        corpus.write_text("\n".join(" ".join(rng.choice(words, 12)) for _ in range(400)))
    settings = dict(
        corpus=str(corpus),
        tokenizer="train",
        num_merges=30,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        sequence_length=16,
        batch_size=8,
        max_steps=12,
        evaluations=2,
        warmup_steps=2,
        learning_rate=1e-2,
        sample_tokens=2,
        output_dir=str(tmp_path / name),
    )
    return pretrain(PretrainConfig(**{**settings, **overrides}))[2]


def test_an_accumulated_run_trains_like_one_without(tmp_path):
    whole = tiny_pretrain(tmp_path, "whole", dropout=0.0)
    accumulated = tiny_pretrain(tmp_path, "accumulated", dropout=0.0, gradient_accumulation_steps=4)
    assert accumulated["optimizer_steps"] == whole["optimizer_steps"] == 12
    np.testing.assert_allclose(accumulated["train_loss"], whole["train_loss"], rtol=1e-5)
    np.testing.assert_allclose(accumulated["validation_loss"], whole["validation_loss"], rtol=1e-5)


def test_an_accumulated_fine_tuning_reports_the_loss_of_its_examples(tmp_path):
    # 10 examples in batches of 4 accumulated over 4 micro-batches of 1: the last batch's 2 are filled to 4
    # micro-batches with rows that weigh nothing, which Keras' running loss counted (10/12 of it; an issue
    # reported 40 rows in batches of 32 over 32 micro-batches: 40/64).
    tokenizer = char_tokenizer()
    backbone = kgpt.GPTBackbone(
        **{**TINY, "vocabulary_size": tokenizer.vocabulary_size(), "dropout": 0.0, "max_sequence_length": 32}
    )
    backbone.save_to_preset(str(tmp_path / "preset"))
    tokenizer.save_to_preset(str(tmp_path / "preset"))
    rng = np.random.default_rng(0)
    words = "sun moon star ice cold hot".split()
    rows = [
        f"{' '.join(rng.choice(words, 3))}\t{' '.join(rng.choice(words, 2))}\t{('entails', 'neutral')[i % 2]}"
        for i in range(10)
    ]
    (tmp_path / "data" / "tsv_format").mkdir(parents=True)
    for split, n in (("train", 10), ("dev", 3), ("test", 2)):
        (tmp_path / "data" / "tsv_format" / f"scitail_1.0_{split}.tsv").write_text("\n".join(rows[:n]) + "\n")
    history = {}
    for steps in (1, 4):  # a learning rate of ~0: both runs score the same weights
        config = FinetuneConfig(
            task="scitail",
            init=str(tmp_path / "preset"),
            data_dir=str(tmp_path / "data"),
            output_dir=str(tmp_path / str(steps)),
            epochs=1,
            batch_size=4,
            learning_rate=1e-9,
            max_length=32,
            classifier_dropout=0.0,
            gradient_accumulation_steps=steps,
        )
        history[steps] = finetune(config)[1]["history"]
    np.testing.assert_allclose(history[4]["task_loss"], history[1]["task_loss"], rtol=1e-5)
    # The LM term is each micro-batch's mean over its tokens, so the total is close, not equal.
    np.testing.assert_allclose(history[4]["loss"], history[1]["loss"], rtol=1e-3)
    np.testing.assert_allclose(history[4]["val_loss"], history[1]["val_loss"], rtol=1e-5)


# --- progress lines --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected", [("100", (100, None)), ("30s", (None, 30.0)), ("0", (None, None)), ("0s", (None, None))]
)
def test_log_every_takes_steps_or_seconds(text, expected):
    assert callbacks.parse_every(text) == expected


@pytest.mark.parametrize("text", ["5m", "-1", "1.5", "s", "nan s", ""])
def test_a_bad_log_every_is_named(text):
    with pytest.raises(ConfigError, match="log_every must be"):
        callbacks.parse_every(text)


def test_progress_lines_give_step_loss_throughput_and_time_left(capsys, progress):
    line = callbacks.ProgressLog("2", total_steps=10, first_step=2, tokens_per_step=512, accumulation=2)
    for batch in range(12):  # 6 steps of 2 micro-batches: steps 3..8
        line.on_train_batch_end(batch, {"loss": 3.25 - batch / 100})
    messages = [m for m in capsys.readouterr().out.splitlines() if m.startswith("step ")]
    assert [m.split(",")[0] for m in messages] == ["step 4/10", "step 6/10", "step 8/10"]
    assert all("tokens/s" in m and m.endswith(" left") for m in messages)
    assert "loss 3.2200" in messages[0]  # the loss Keras reported at the batch that ended step 4


# --- an interrupted epoch's loss --------------------------------------------------------------------------


def test_sigterm_checkpoints_and_the_resumed_epoch_records_all_its_steps(tmp_path, monkeypatch):
    whole = tiny_pretrain(tmp_path, "whole", evaluations=1, max_steps=10)
    original = callbacks.Progress.on_train_batch_begin

    def terminate_at_step_4(self, batch, logs=None):
        original(self, batch, logs)
        if self.step == 3:  # step 4 begins: SIGTERM arrives during it
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(callbacks.Progress, "on_train_batch_begin", terminate_at_step_4)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Preempted, match="stopped by SIGTERM at step 4; checkpoint written in"):
        tiny_pretrain(tmp_path, "cut", evaluations=1, max_steps=10, checkpoint_every=3)
    assert signal.getsignal(signal.SIGTERM) is before  # the run puts back the handler it replaced
    monkeypatch.setattr(callbacks.Progress, "on_train_batch_begin", original)
    resumed = tiny_pretrain(tmp_path, "cut", evaluations=1, max_steps=10, checkpoint_every=3)
    assert resumed["resumed_from_step"] == 4
    # One epoch of 10 steps, cut after 4: its loss is the mean of all 10, as the uninterrupted run's.
    np.testing.assert_allclose(resumed["train_loss"], whole["train_loss"], rtol=1e-5)


def test_sigterm_while_the_corpus_is_tokenized_stops_before_it_ends(tmp_path, monkeypatch):
    from kgpt.jobs import pretrain as pretrain_job

    def terminated_first(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the notice comes as the first chunk is tokenized
        return real(*args, **kwargs)

    real = pretrain_job.build_shards
    monkeypatch.setattr(pretrain_job, "build_shards", terminated_first)
    with pytest.raises(Preempted, match=r"while tokenizing the corpus \(file 1 of 1, .*corpus.txt\)"):
        tiny_pretrain(tmp_path, "cut")
    assert not (tmp_path / "cut" / "shards" / "index.json").exists()


def test_tensorflow_replicas_feed_the_blocks_keras_puts_back_in_order():
    """Keras joins a multi-worker strategy's outputs as `gather` (worker-major: w0r0, w0r1, w1r0, ...) taken
    replica by replica (`replicas[r::replicas_per_worker]`, keras/src/backend/tensorflow/trainer.py
    `_multi_worker_concat`): the blocks each replica feeds must come back as 0, 1, 2, ..."""
    for workers, replicas in ((2, 1), (2, 2), (3, 4)):
        fed = {
            (w, r): block
            for w in range(workers)
            for r, block in enumerate(distribute.replica_blocks(w, workers, replicas))
        }
        gathered = [fed[(w, r)] for w in range(workers) for r in range(replicas)]
        joined = [block for r in range(replicas) for block in gathered[r::replicas]]
        assert joined == list(range(workers * replicas))


def test_zero_shot_on_several_processes_is_refused_once_they_join_and_before_the_output_dir_is_claimed(
    monkeypatch, tmp_path
):
    from kgpt.jobs import run

    addresses = ("10.0.0.1:8476", "10.0.0.2:8477")
    joined = []
    monkeypatch.setattr(
        run, "join", lambda *args: joined.append(args[1]) or placement.Cluster(2, 0, addresses[0], addresses, "flags")
    )
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"^--zero_shot scores tasks .* one process only: evaluate the saved model"):
        pretrain(PretrainConfig(output_dir=str(out), zero_shot={"sst2": None}))
    assert joined == ["pretrain"] and not out.exists()
