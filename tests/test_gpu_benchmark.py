"""benchmarks/gpu.sh: its table's arithmetic, and (large) the whole run at a tiny shape on this CPU."""

import os
import subprocess
import sys

import keras
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Its own process: the benchmark's absl flags would collide with other benchmark modules' in the test worker.
REPORT = """
import sys
sys.path.insert(0, "benchmarks")
import gpu, model
gpu.FLAGS(["gpu.py", "--num_layers=12", "--hidden_dim=768", "--num_heads=12", "--intermediate_dim=3072",
           "--sequence_length=512", "--vocabulary_size=40481", "--batch_size=32", "--lengths=128"])
half_peak = 0.5 * 989e12 / model.training_flops_per_token()
pre = {"kgpt_kernel": {"device": "NVIDIA H100 80GB HBM3", "gemm_tflops": 700.0, "train_tokens_per_s": half_peak,
                       "peak_device_mib": 7000.0},
       "keras_hub_gpt2": "failed: out of memory"}
fine = {(128, "kernel"): {"step_ms": 20.0, "tokens_per_step": 32 * 128, "warmup_s": 9.5, "peak_device_mib": None}}
gpu.report(pre, fine, 0.0)
"""


def test_the_table_divides_by_the_measured_rate_and_the_nominal_peak():
    done = subprocess.run([sys.executable, "-c", REPORT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    kernel = next(line for line in lines if line.startswith("| kgpt, fused dropout kernel (GPU default)"))
    assert "50.0%" in kernel and "70.6%" in kernel and "7,000" in kernel  # 989 / 700 x 50%
    assert "nominal peak: 989 TFLOP/s" in done.stdout
    assert any(line.startswith("| keras-hub GPT-2") and "failed: out of memory" in line for line in lines)
    tokens_per_s = 32 * 128 / 0.020
    finetune = next(line for line in lines if line.startswith("| kgpt, fused dropout kernel  "))
    assert f"{tokens_per_s:,.0f}" in finetune and "9.5" in finetune


@pytest.mark.large  # ten processes, each compiling a model (the kernel interpreted): minutes on a 2-core CPU
@pytest.mark.skipif(
    keras.config.backend() != "jax", reason="gpu.sh runs JAX whatever the suite's backend; the JAX setting runs it once"
)
def test_the_gpu_run_goes_end_to_end_at_a_tiny_shape():
    done = subprocess.run(
        ["bash", "benchmarks/gpu.sh", "--tiny"], cwd=ROOT, capture_output=True, text=True, timeout=1900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| kgpt") or line.startswith("| keras-hub")]
    assert len(rows) == 4 + 2 * 3, done.stdout
    assert all(line.count("|") >= 7 and "failed" not in line for line in rows), done.stdout
