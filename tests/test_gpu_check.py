"""What of benchmarks/gpu_check.py a CPU machine can check: the model it builds is ~0.5B parameters
(counted on the meta device) and Qwen2-shaped; without CUDA, or without the vllm / deepspeed package
that --engine / --backend name, the check stops at once, naming what is missing; and `--smoke` runs
the check's whole code path on the CPU (a 2-layer model, the torch engine, DeepSpeed ZeRO-2 bf16 with
gradient checkpointing) and writes its table. The measurements themselves need a CUDA GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
import torch  # noqa: E402

from benchmarks import gpu_check  # noqa: E402
from benchmarks.gpu_check import QWEN2_05B, model_config, parameter_count  # noqa: E402
from rlcr.policy.tokenizer import build_tokenizer  # noqa: E402


def test_the_check_model_is_a_half_billion_parameter_qwen2():
    config = model_config(len(build_tokenizer("numbers")))
    n = parameter_count(config)
    print(f"gpu_check model: {n / 1e9:.3f}B parameters")
    assert config.model_type == "qwen2" and 0.45e9 <= n <= 0.55e9, n
    assert QWEN2_05B["hidden_size"] // QWEN2_05B["num_attention_heads"] == 128  # a head size vLLM supports


def run_check(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_check.py"), *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run for real")
@pytest.mark.parametrize("flags", [(), ("--engine", "torch", "--backend", "torch")])
def test_without_cuda_the_check_stops_at_once_naming_what_is_missing(flags):
    proc = run_check(*flags)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "gpu_check needs a CUDA device" in proc.stderr and "Traceback" not in proc.stderr


def test_only_the_packages_of_the_named_engine_and_backend_are_required(monkeypatch):
    """vllm is required by --engine vllm only, deepspeed by --backend deepspeed only; the message names
    the flag that does without it."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # neither package installed
    assert gpu_check.missing_requirements("torch", "torch", "cpu") == []
    assert gpu_check.missing_requirements("vllm", "torch", "cpu") == ["the vllm package (or --engine torch)"]
    assert gpu_check.missing_requirements("torch", "deepspeed", "cpu") == ["the deepspeed package (or --backend torch)"]
    assert gpu_check.vllm_not_measured() == ("not measured: the vllm package is not installed on this "
                                                    "machine (--engine torch)")


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs the deepspeed package")
def test_smoke_runs_the_check_end_to_end_on_the_cpu(tmp_path):
    """The GPU call's code path with a 2-layer model: both RL iterations train (every iteration's turns,
    with stand-in advantages where a random model's rewards are all equal) through DeepSpeed ZeRO-2 bf16
    with gradient checkpointing, and the table says vLLM was not measured and why."""
    out = tmp_path / "results.json"
    proc = run_check("--smoke", "--engine", "torch", "--backend", "deepspeed", "--tasks", "1", "--gen-prompts", "4",
                     "--gen-tokens", "8", "--token-budget", "512", "--out", str(tmp_path / "work"), "--json", str(out),
                     timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert rows["vLLM generated tokens/s (bf16)"].startswith("not measured: ")
    assert rows["RL loop: rollout engine"] == "torch engine (bfloat16, cpu)"
    assert rows["RL loop: trainer backend"] == "DeepSpeed ZeRO-2 bf16, gradient checkpointing on"
    assert rows["RL loop: org.token_budget, max_turn_tokens"].startswith("512, 256 ")
    iterations = [rows["RL iteration 1"], rows["RL iteration 2"]]
    assert all(it["train/turns"] > 0 and it["perf/trainer_tokens_per_s"] > 0 for it in iterations), iterations
    assert rows["torch engine generated tokens/s (bf16)"] > 0
    assert rows["training tokens/s, prompt + completion (deepspeed, mean of 2)"] > 0
    assert "vLLM generated tokens/s (bf16)" in proc.stdout  # the printed table
