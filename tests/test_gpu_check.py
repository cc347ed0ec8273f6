"""What of benchmarks/gpu_check.py a CPU machine can check: the model it builds is ~0.5B parameters
(counted on the meta device) and Qwen2-shaped, and without CUDA the check stops at once, naming what
is missing. The measurements themselves need a CUDA GPU with vllm and deepspeed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
import torch  # noqa: E402

from benchmarks.gpu_check import QWEN2_05B, model_config, parameter_count  # noqa: E402
from rlcr.policy.tokenizer import build_tokenizer  # noqa: E402


def test_the_check_model_is_a_half_billion_parameter_qwen2():
    config = model_config(len(build_tokenizer("numbers")))
    n = parameter_count(config)
    print(f"gpu_check model: {n / 1e9:.3f}B parameters")
    assert config.model_type == "qwen2" and 0.45e9 <= n <= 0.55e9, n
    assert QWEN2_05B["hidden_size"] // QWEN2_05B["num_attention_heads"] == 128  # a head size vLLM supports


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run for real")
def test_without_cuda_the_check_stops_at_once_naming_what_is_missing():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_check.py")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "gpu_check needs a CUDA device" in proc.stderr and "Traceback" not in proc.stderr
