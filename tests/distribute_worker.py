"""Runs a few pre-training steps on one device and data-parallel on 2 virtual CPU devices; prints JSON.

Run in its own process: the device count is fixed before JAX/TensorFlow start. Arguments: the corpus
folder, the jobs (job:mode,...) and the tiny preset fine-tuning starts from.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"

import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

from kgpt.jobs.config import FinetuneConfig, PretrainConfig  # noqa: E402
from kgpt.jobs.finetune import finetune  # noqa: E402
from kgpt.jobs.pretrain import pretrain  # noqa: E402
from kgpt.parallel import distribute  # noqa: E402

corpus, steps, preset = sys.argv[1], [step.split(":") for step in sys.argv[2].split(",")], sys.argv[3]
results = {"backend": keras.config.backend(), "devices": len(distribute.mesh_devices())}
# At most one data-parallel run per process on TensorFlow: a second
# MirroredStrategy in the same process can collide with the first's collective ops.
for job, mode in steps:
    if job == "pretrain":
        # A vocabulary learned from the corpus: loading GPT-1's 40,478 tokens would cost more than the run.
        config = PretrainConfig(
            corpus=corpus,
            tokenizer="train",
            num_merges=40,
            num_layers=2,
            num_heads=2,
            hidden_dim=16,
            intermediate_dim=32,
            dropout=0.0,
            sequence_length=16,
            batch_size=8,
            learning_rate=1e-2,
            warmup_steps=2,
            max_steps=6,
            evaluations=6,
            validation_fraction=0.0,
            sample_tokens=2,
            seed=3,
            distribution=mode,
            lm_loss_chunk_size=24,
        )  # several chunks per replica
        results[f"pretrain:{mode}"] = pretrain(config)[2]["train_loss"]
    elif job == "finetune":
        config = FinetuneConfig(
            task="scitail",
            init=preset,
            classifier_dropout=0.0,
            max_length=48,
            epochs=2,
            batch_size=16,
            learning_rate=1e-3,
            distribution=mode,
            lm_loss_chunk_size=40,
        )
        _, scores = finetune(config)
        results[f"finetune:{mode}"] = scores["history"]["loss"] + [scores["splits"]["dev"]["accuracy"]]
    elif job == "lm_evaluate":  # padded text, its short rows on one replica and its long ones on the other
        import numpy as np

        import kgpt

        rng = np.random.default_rng(0)
        ids = rng.integers(1, 64, (16, 24)).astype("int32")
        mask = (np.arange(24)[None, :] < np.repeat([3, 24], 8)[:, None]).astype("int32")
        x, y, weights = {"token_ids": ids[:, :-1], "padding_mask": mask[:, :-1]}, ids[:, 1:], mask[:, 1:]
        keras.utils.set_random_seed(5)
        sizes = dict(num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=32)
        plain = kgpt.GPTCausalLM(kgpt.GPTBackbone(vocabulary_size=64, **sizes))
        logits = keras.ops.convert_to_numpy(plain(x)).astype("float64")
        top = logits.max(-1, keepdims=True)
        log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        losses = -np.take_along_axis(log_probs, y[..., None], -1)[..., 0]
        results["lm_evaluate:exact"] = float((losses * weights).sum() / weights.sum())
        with distribute.training_scope(mode, batch_size=16):
            lm = kgpt.GPTCausalLM(kgpt.GPTBackbone(vocabulary_size=64, **sizes))
            lm.set_weights(plain.get_weights())
            lm.compile()
            results[f"lm_evaluate:{mode}"] = lm.evaluate(x, y, sample_weight=weights, batch_size=16, verbose=0)[0]
jobs = [job for job, _ in steps]
if "model_parallel" in jobs:  # JAX: a backbone sharded over a ("batch", "model") mesh of 2 devices
    import numpy as np

    import kgpt

    sizes = dict(
        vocabulary_size=64,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=16,
        dropout=0.0,
    )
    ids = np.random.default_rng(0).integers(0, 64, (2, 16)).astype("int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    keras.utils.set_random_seed(5)
    plain = kgpt.GPTBackbone(**sizes)
    mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], keras.distribution.list_devices())
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=distribute.model_parallel_layout(mesh), batch_dim_name="batch")
    )
    sharded = kgpt.GPTBackbone(**sizes)
    sharded.set_weights(plain.get_weights())
    kernel = sharded.transformer_layers[0].feedforward_intermediate_dense.kernel
    results["kernel_shards"] = len(kernel.value.addressable_shards)
    results["kernel_shard_shape"] = list(kernel.value.addressable_shards[0].data.shape)
    difference = np.abs(keras.ops.convert_to_numpy(sharded(x)) - keras.ops.convert_to_numpy(plain(x))).max()
    results["model_parallel_max_difference"] = float(difference)
print(json.dumps(results))
