"""Process environment every entry point sets first: telemetry off, tool state inside the project.

Values already set by the user win (setdefault), so a researcher can point MLflow or Prefect
elsewhere. Call before importing torch, mlflow, prefect or great-expectations.
"""

from __future__ import annotations

import os
from pathlib import Path

QUIET = {
    "DO_NOT_TRACK": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "GX_ANALYTICS_ENABLED": "False",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # with 2 threads under load torch can be 10x slower with busy-waiting OpenMP workers
    "OMP_WAIT_POLICY": "PASSIVE",
}


def project_env(root: Path) -> dict[str, str]:
    """Variables that keep tool state under `root/.state` (Prefect home, caches)."""
    state = root / ".state"
    return {
        **QUIET,
        "PREFECT_HOME": str(state / "prefect"),
        "DVC_SITE_CACHE_DIR": str(state / "dvc-site-cache"),
        "TORCH_EXTENSIONS_DIR": str(state / "torch_extensions"),
        "MPLCONFIGDIR": str(state / "matplotlib"),
    }


def cpu_kernels(machine: str | None = None, cpu_flags: str | None = None) -> dict[str, str]:
    """Variables that pin torch's and MKL's CPU kernels on an x86-64 CPU that has AVX2.

    torch picks its vector kernels by the CPU it finds (AVX-512 where there is one) and each sums in
    its own order, so the same run gave other metrics on another machine: measured on the default
    model, AVX-512 and AVX2 kernels give different bits from the first step, and the tiny profile's
    fresh-clone repro moved its RL gain from +0.23 to +0.13. So torch's kernels are pinned to AVX2 and
    MKL's to its AVX2 branch in strict reproducibility mode (`MKL_CBWR=AVX2,STRICT`: its matrix
    products give the same bits at any thread count; without STRICT, an Intel Xeon with AMX computed
    the default model's probe differently at 1 and 2 threads, tests/test_repro.py). On a CPU with AMX
    torch's own kernels stay (AVX-512): its bf16 attention packs its operands for AMX with AVX-512
    code and refuses an AVX2 pin ("pack_vnni2 is only supported when avx512 is supported"), and such a
    machine computed other bits than the AVX2-pinned AMD EPYC whatever torch's pin. Elsewhere (no AVX2,
    another architecture) nothing is pinned. Set ATEN_CPU_CAPABILITY or MKL_CBWR yourself to choose."""
    import platform

    machine = machine if machine is not None else platform.machine()
    if machine.lower() not in ("x86_64", "amd64"):
        return {}
    if cpu_flags is None:
        try:
            cpu_flags = Path("/proc/cpuinfo").read_text()
        except OSError:
            return {}
    if " avx2" not in cpu_flags:
        return {}
    mkl = {"MKL_CBWR": "AVX2,STRICT"}
    return mkl if " amx_tile" in cpu_flags else {"ATEN_CPU_CAPABILITY": "avx2", **mkl}


STAGE_THREADS = {"bootstrap": 2}
"""torch threads of a stage process (the name before any `@`), 1 for every other stage. CPU matrix
products do not give the same bits at every thread count: rarely, a row at the boundary of two threads'
shares rounds differently (measured: one element of a 5109 x 128 MLP output in the `hierarchy` profile's
SFT, 7e-9, at 1 and at 2 threads), and the SFT's trajectory carries it on (that profile's bootstrap
company, 2-term sums: 0.94 greedy at 1 thread, 0.34 at 2). So the count is part of a run's definition,
fixed here rather than taken from the machine: the bootstrap runs alone at 2 (`make repro`'s first
phase), every other stage at 1 (its lanes). OMP_NUM_THREADS set by you wins, and may give other bits."""


def stage_threads(stage: str) -> int:
    return STAGE_THREADS.get(stage.split("@", 1)[0], 1)


def setup(root: Path, stage: str | None = None) -> None:
    """The variables above, and with `stage` its torch thread count (`stage_threads`), each unless set."""
    pinned = {"OMP_NUM_THREADS": str(stage_threads(stage))} if stage else {}
    for key, value in {**project_env(root), **cpu_kernels(), **pinned}.items():
        os.environ.setdefault(key, value)
