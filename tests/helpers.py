"""Small builders shared by several test files."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import torch

from rlcr.config import ModelConfig, Params, resolve
from rlcr.policy.models import build_tiny


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (benchmarks/ is a folder of scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def torchrun_cmd(script: str, *args: str, nproc: int = 2) -> tuple[list[str], dict[str, str]]:
    """`torchrun` of `script args` on `nproc` CPU ranks (gloo) at a free port, with an environment that
    carries no rank variables of an outer launch and one thread per rank. -> (command, env)"""
    import socket
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", str(nproc), "--master_port", str(port),
           script, *args]
    return cmd, env


def params_with(over: dict[str, dict]) -> Params:
    """The repo's params.yaml with `over` ({section: {key: value}}) set on top, checked like the stages'."""
    import yaml

    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    return resolve(raw, {f"{section}.{k}": v for section, d in over.items() for k, v in d.items()})


def vary(model, seed: int):
    """`model` with its matrices redrawn at std 0.2, so its outputs vary: at the default init (std 0.02)
    a tiny model just repeats the last character, which would make equality tests pass for the wrong
    reason. Returns the model, in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2, generator=gen)
    return model.eval()


def varied_tiny(cfg: ModelConfig, seed: int):
    """A tiny model whose outputs vary (see `vary`). -> (model, tokenizer)"""
    model, tok = build_tiny(cfg, seed)
    return vary(model, seed), tok


def dvc(root: Path, *args: str, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    """`dvc <args>` in a project copy, with its own site cache, the imports record of RLCR_IMPORTS_OUT,
    and no MLFLOW_TRACKING_URI left over from an in-process stage run of the same test."""
    env = {**os.environ, "DVC_SITE_CACHE_DIR": str(root / ".state/dvc"), "RLCR_IMPORTS_OUT": str(root / "imports.json")}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(["dvc", *args], cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    return proc


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("PPid:"))


def sandbox_processes() -> list[str]:
    """Processes of any sandbox of this process still alive or unreaped, looked up at once (no waiting
    first): as root every sandbox runs as uid 65534, so any process of that uid; otherwise any `bwrap` of
    ours or any process of ours in another PID namespace. One whose line of parents reaches this
    process's ancestors through another ordinary process (a sibling: another pytest-xdist worker running
    sandboxes at the same time) is that sibling's and skipped; one that descends from this process, or
    was orphaned (reparented to pid 1 or to a subreaper: a leaked daemon), is counted."""
    from rlcr.sandbox import NOBODY

    root, mine, uid_mine = os.geteuid() == 0, os.readlink("/proc/self/ns/pid"), os.getuid()

    def sandboxed(pid: int) -> str | None:
        """The process's command name if it is a sandbox process, else None."""
        uid = os.stat(f"/proc/{pid}").st_uid
        if uid != (NOBODY if root else uid_mine):
            return None
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        return comm if root or comm == "bwrap" or os.readlink(f"/proc/{pid}/ns/pid") != mine else None

    me, ancestors = os.getpid(), set()
    with contextlib.suppress(OSError, StopIteration):
        pid = os.getppid()
        while pid > 1:
            ancestors.add(pid)
            pid = _parent(pid)
    found = []
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            comm = sandboxed(pid)
            if comm is None:
                continue
            below, up = pid, _parent(pid)
            while up > 1 and up != me and up not in ancestors:
                below, up = up, _parent(up)
            if up in ancestors and sandboxed(below) is None:  # under a sibling of this process
                continue
            found.append(f"{pid} {comm}")
        except (OSError, StopIteration):  # gone meanwhile (or a zombie's namespaces, already released)
            continue
    return found
