"""Checkpoints survive a killed writer, resume bit-exactly, and refuse what cannot resume."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from rlcr.train.checkpoint import (
    CheckpointError,
    DataCursor,
    capture_rng,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    make_checkpoint,
    next_indices,
    restore_rng,
    restore_training_state,
    save_checkpoint,
)

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}

# ----------------------------------------------------------------- a small run where every RNG matters

N_ITEMS, BATCH, DATA_SEED = 24, 8, 3  # 3 steps per epoch
X = torch.linspace(-1, 1, N_ITEMS * 8).reshape(N_ITEMS, 8)
Y = X.sum(1, keepdim=True)


def _seed_all(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _setup(init_seed=0):
    torch.manual_seed(init_seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3) * 0.9**s)
    return model, opt, sched


def _train(model, opt, sched, cursor, step, total, ckpt_dir=None, save_at=None):
    """Dropout (torch RNG), input noise (numpy RNG), target scale (python RNG), data order (cursor)."""
    losses = []
    while step < total:
        idx = next_indices(cursor, N_ITEMS, BATCH, DATA_SEED)
        x = X[idx] + 0.1 * torch.from_numpy(np.random.randn(BATCH, 8)).float()
        scale = random.uniform(0.5, 1.5)
        loss = (model(x) - scale * Y[idx]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        losses.append(loss.item())
        if step == save_at:
            save_checkpoint(ckpt_dir, make_checkpoint(model, opt, sched, step, cursor, {"lr": 1e-2}))
    return losses


def _continuous(total, ckpt_dir, save_at):
    _seed_all(0)
    model, opt, sched = _setup()
    losses = _train(model, opt, sched, DataCursor(), 0, total, ckpt_dir, save_at)
    return model, losses


def _resume(ckpt_dir, total, restore_rngs=True):
    """A fresh start: other seeds, other initial weights; only the checkpoint can make it match."""
    _seed_all(999)
    model, opt, sched = _setup(init_seed=123)
    ckpt = load_checkpoint(latest_checkpoint(ckpt_dir))
    if not restore_rngs:
        ckpt["rng"] = capture_rng()  # keep the scrambled RNGs: the control for "RNG matters"
    step, cursor = restore_training_state(ckpt, model, opt, sched)
    losses = _train(model, opt, sched, DataCursor.from_state(cursor), step, total)
    return model, losses


def _resume_main(ckpt_dir, total, out):
    model, losses = _resume(ckpt_dir, total)
    torch.save({"losses": losses, "model": model.state_dict()}, out)


def _same_weights(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------------ tests


def test_train_2n_equals_n_then_resume_n_in_a_fresh_process(tmp_path):
    n = 5  # mid-epoch: cursor (1, 16)
    model, losses = _continuous(2 * n, tmp_path, save_at=n)
    out = tmp_path / "resumed.pt"
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r}); import test_checkpoint as t; "
        f"t._resume_main({str(tmp_path)!r}, {2 * n}, {str(out)!r})"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=ENV, timeout=120)
    resumed = torch.load(out, weights_only=True)
    assert resumed["losses"] == losses[n:]  # identical metrics, to the bit
    assert _same_weights(model.state_dict(), resumed["model"])


def test_rng_restore_is_what_makes_resume_exact(tmp_path):
    n = 5
    model, _ = _continuous(2 * n, tmp_path, save_at=n)
    without_rng, _ = _resume(tmp_path, 2 * n, restore_rngs=False)
    assert not _same_weights(model.state_dict(), without_rng.state_dict())


def test_resume_exactly_at_epoch_boundary_runs_the_remaining_steps(tmp_path):
    model, losses = _continuous(6, tmp_path, save_at=3)  # 2 epochs of 3 steps, saved at the boundary
    assert load_checkpoint(latest_checkpoint(tmp_path))["data_cursor"] == {"epoch": 1, "pos": 0}
    resumed, resumed_losses = _resume(tmp_path, 6)
    assert len(resumed_losses) == 3  # "0 steps, exit 0" would be a failure
    assert resumed_losses == losses[3:]
    assert _same_weights(model.state_dict(), resumed.state_dict())


def test_next_indices_crosses_epochs_and_is_a_pure_function_of_cursor():
    cur = DataCursor()
    first = [next_indices(cur, 5, 2, seed=1) for _ in range(5)]  # 10 draws = exactly 2 epochs
    assert cur == DataCursor(epoch=2, pos=0)
    flat = sum(first, [])
    assert sorted(flat[:5]) == list(range(5)) and sorted(flat[5:]) == list(range(5))
    cur2 = DataCursor(epoch=0, pos=4)
    assert next_indices(cur2, 5, 2, seed=1) == flat[4:6]


# --------------------------------------------------------------------------------- killed writer (1)

WRITER = """
import sys, torch
from rlcr.train.checkpoint import DataCursor, make_checkpoint, save_checkpoint
m = torch.nn.Linear(2, 2)
state = make_checkpoint(m, torch.optim.SGD(m.parameters(), lr=0.1), None, 2, DataCursor(), {})
state["model"]["big"] = torch.zeros(48 * 1024 * 1024)  # 192 MB: the write takes a while
save_checkpoint(sys.argv[1], state)
"""


def _small_state(step, value=1.0):
    m = torch.nn.Linear(2, 2)
    torch.nn.init.constant_(m.weight, value)
    return make_checkpoint(m, torch.optim.SGD(m.parameters(), lr=0.1), None, step, DataCursor(0, step), {})


def test_sigkill_during_write_keeps_previous_checkpoint(tmp_path):
    first = save_checkpoint(tmp_path, _small_state(1, value=0.5))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], cwd=ROOT, env=ENV)
    deadline = time.monotonic() + 60
    killed_mid_write = False
    while time.monotonic() < deadline and proc.poll() is None:
        tmps = list(tmp_path.glob(".ckpt-2.*.tmp"))
        if tmps and tmps[0].exists() and tmps[0].stat().st_size > 1_000_000:
            os.kill(proc.pid, signal.SIGKILL)
            killed_mid_write = True
            break
        time.sleep(0.0005)
    proc.wait(timeout=30)
    assert killed_mid_write and proc.returncode == -signal.SIGKILL, "writer finished before the kill"
    assert not (tmp_path / "ckpt-2.pt").exists()
    assert list(tmp_path.glob(".ckpt-2.*.tmp"))  # the torn temp file is there...
    assert latest_checkpoint(tmp_path) == first  # ...and ignored
    state = load_checkpoint(first)
    assert torch.equal(state["model"]["weight"], torch.full((2, 2), 0.5))
    save_checkpoint(tmp_path, _small_state(3))  # the next save cleans up after the killed writer
    assert not list(tmp_path.glob("*.tmp"))


def test_torn_or_foreign_newer_files_are_skipped(tmp_path):
    good = save_checkpoint(tmp_path, _small_state(1))
    data = good.read_bytes()
    (tmp_path / "ckpt-5.pt").write_bytes(data[: len(data) // 2])  # a non-atomic writer's torn file
    (tmp_path / "ckpt-6.pt").write_bytes(b"not a checkpoint")
    assert latest_checkpoint(tmp_path) == good
    with pytest.raises(CheckpointError, match="ckpt-5.pt"):
        load_checkpoint(tmp_path / "ckpt-5.pt")


def test_keeps_only_the_last_k(tmp_path):
    for step in range(1, 6):
        save_checkpoint(tmp_path, _small_state(step), keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-4.pt", "ckpt-5.pt"]
    assert latest_checkpoint(tmp_path).name == "ckpt-5.pt"
    assert latest_checkpoint(tmp_path / "nothing-here") is None


# ----------------------------------------------------------------------- refusals (6, 7, 11)


def test_missing_rng_or_cursor_is_a_clear_error(tmp_path):
    state = _small_state(7)
    del state["rng"]
    torch.save(state, tmp_path / "ckpt-7.pt")  # written by something that forgot the RNG
    with pytest.raises(CheckpointError, match=r"missing \['rng'\].*cannot resume"):
        load_checkpoint(tmp_path / "ckpt-7.pt")
    assert latest_checkpoint(tmp_path) is None
    state = _small_state(8)
    del state["data_cursor"]
    with pytest.raises(CheckpointError, match="data_cursor"):
        save_checkpoint(tmp_path, state)
    with pytest.raises(CheckpointError, match="numpy"):
        restore_rng({"python": None, "torch": torch.get_rng_state()})


def test_weights_only_load_round_trips_every_rng(tmp_path):
    model = torch.nn.Linear(3, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    np.random.randn(3)  # leave numpy with a cached gaussian and a mid-stream position
    path = save_checkpoint(tmp_path, make_checkpoint(model, opt, sched, 1, DataCursor(), {"a": [1, 2]}))
    expected = (random.random(), np.random.randn(5).tolist(), torch.rand(5).tolist())
    torch.load(path, weights_only=True)  # the bare library call must accept the file
    restore_rng(load_checkpoint(path)["rng"])
    assert (random.random(), np.random.randn(5).tolist(), torch.rand(5).tolist()) == expected


class _Evil:
    def __reduce__(self):
        return (print, ("code ran",))


def test_pickled_code_is_not_executed(tmp_path):
    state = _small_state(1)
    state["config"] = _Evil()
    torch.save(state, tmp_path / "ckpt-1.pt")
    with pytest.raises(CheckpointError, match="weights_only"):
        load_checkpoint(tmp_path / "ckpt-1.pt")


def test_nan_weights_never_checkpointed(tmp_path):
    state = _small_state(1)
    state["model"]["weight"][0, 1] = float("nan")
    with pytest.raises(CheckpointError, match="'weight' contains NaN"):
        save_checkpoint(tmp_path, state)
    assert not list(tmp_path.iterdir())
