"""One explicit, atomic, resumable checkpoint: {model, optim, sched, step, rng, data_cursor, config}.

Resuming N steps from a checkpoint must give the same weights and metrics as never stopping
(docs/reliability.md, item 4), so everything that decides the next step is in the dict: weights, optimiser and
scheduler state, the step, the python / numpy / torch (and CUDA) RNG states and where the data
order stands (`DataCursor`). The data order itself is a pure function of (seed, epoch), so the
cursor is two integers and resuming at an epoch boundary just continues (docs/reliability.md, item 5).

Covers:
- a writer killed at any point (SIGKILL, power loss after fsync): the file is written to a temp
  file in the same folder, flushed, fsynced, then os.replace'd onto `ckpt-<step>.pt` and the folder
  fsynced; `latest_checkpoint` returns the newest file that loads and skips temp files and torn or
  foreign files (docs/reliability.md, item 1);
- a checkpoint without RNG or data cursor: refused on save and on load with the reason (6);
- loading runs `torch.load(weights_only=True)`: no pickled code runs, so RNG states are stored as
  tensors and plain lists/ints (7);
- NaN/Inf in the model weights: refused on save, so a poisoned model is never checkpointed (11).
Does not cover: several writers in one folder (one run owns its folder; stale temp files of a
killed writer are deleted by the next save), DeepSpeed ZeRO 1-3 states partitioned over several
ranks (those go through DeepSpeed's own checkpoint files: `DeepSpeedBackend.save_checkpoint` in
rlcr/train/backend.py), a disk that lies about fsync.
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlcr.io import atomic_path

log = logging.getLogger(__name__)

CKPT_RE = re.compile(r"^ckpt-(\d+)\.pt$")
TMP_RE = re.compile(r"^\.ckpt-\d+\..*\.tmp$")
REQUIRED_KEYS = ("model", "optim", "sched", "step", "rng", "data_cursor", "config")
RNG_KEYS = ("python", "numpy", "torch")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or resumed from; the message says which file and why."""


# ---------------------------------------------------------------------------------------- RNG state


def capture_rng() -> dict[str, Any]:
    """All global RNG states, as types `torch.load(weights_only=True)` accepts."""
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    rng: dict[str, Any] = {
        "python": [version, list(mt), gauss],
        "numpy": {
            "kind": kind,
            "keys": keys.tolist(),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: dict[str, Any]) -> None:
    """Put back every RNG state `capture_rng` took; a missing one is an error, not a fresh seed."""
    missing = [k for k in RNG_KEYS if k not in rng]
    if missing:
        raise CheckpointError(f"rng state lacks {missing}: cannot resume bit-exactly")
    version, mt, gauss = rng["python"]
    random.setstate((int(version), tuple(int(x) for x in mt), gauss))
    n = rng["numpy"]
    np.random.set_state(
        (n["kind"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


# -------------------------------------------------------------------------------------- data cursor


@dataclass
class DataCursor:
    """Where the data order stands: epoch and position in that epoch's permutation.

    The permutation of epoch e is drawn from its own generator seeded by (seed, e), never from the
    global RNGs, so the cursor alone reproduces the order after a resume.
    """

    epoch: int = 0
    pos: int = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    @classmethod
    def from_state(cls, state: dict[str, int]) -> DataCursor:
        return cls(epoch=int(state["epoch"]), pos=int(state["pos"]))


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The shuffled order of n items in one epoch; a pure function of (n, seed, epoch)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g).tolist()


def next_indices(cursor: DataCursor, n: int, batch_size: int, seed: int) -> list[int]:
    """Take the next batch_size indices, crossing into the next epoch as needed; advances cursor.

    Every batch is full; an epoch's tail is followed by the next epoch's head. At an epoch's end the
    cursor moves to (epoch + 1, 0), so a checkpoint taken there resumes at the next epoch's start.
    """
    if n < 1:
        raise ValueError("cannot draw batches from an empty dataset")
    out: list[int] = []
    order = epoch_order(n, seed, cursor.epoch)
    while len(out) < batch_size:
        take = min(batch_size - len(out), n - cursor.pos)
        out += order[cursor.pos : cursor.pos + take]
        cursor.pos += take
        if cursor.pos == n:
            cursor.epoch, cursor.pos = cursor.epoch + 1, 0
            order = epoch_order(n, seed, cursor.epoch)
    return out


# ------------------------------------------------------------------------------------ state and disk


def make_checkpoint(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    step: int,
    data_cursor: DataCursor | dict[str, Any],
    config: dict[str, Any],
) -> dict[str, Any]:
    """The one checkpoint dict, RNG states taken now (so call it right after the step it records)."""
    cursor = data_cursor.state_dict() if isinstance(data_cursor, DataCursor) else dict(data_cursor)
    return {
        "model": model.state_dict(),
        "optim": optimizer.state_dict(),
        "sched": scheduler.state_dict() if scheduler is not None else None,
        "step": int(step),
        "rng": capture_rng(),
        "data_cursor": cursor,
        "config": config,
    }


def restore_training_state(
    ckpt: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> tuple[int, dict[str, Any]]:
    """Load weights, optimiser, scheduler and RNG from a checkpoint dict. -> (step, data_cursor)"""
    _check_keys(ckpt, "checkpoint")
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optim"])
    if scheduler is not None:
        if ckpt["sched"] is None:
            raise CheckpointError("checkpoint has no scheduler state but a scheduler was given")
        scheduler.load_state_dict(ckpt["sched"])
    restore_rng(ckpt["rng"])
    return ckpt["step"], ckpt["data_cursor"]


def _check_keys(state: dict[str, Any], where: str) -> None:
    if not isinstance(state, dict):
        raise CheckpointError(f"{where}: expected a dict, got {type(state).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise CheckpointError(
            f"{where}: missing {missing}; a checkpoint without rng or data_cursor cannot resume "
            "bit-exactly, so it is refused (docs/reliability.md, item 6)"
        )
    for key in ("rng", "data_cursor"):
        if not state[key]:
            raise CheckpointError(f"{where}: '{key}' is empty; cannot resume bit-exactly")
    lacking = [k for k in RNG_KEYS if k not in state["rng"]]
    if lacking:
        raise CheckpointError(f"{where}: rng lacks {lacking}; cannot resume bit-exactly")
    if isinstance(state["step"], bool) or not isinstance(state["step"], int) or state["step"] < 0:
        raise CheckpointError(f"{where}: step must be an int >= 0, got {state['step']!r}")


def _check_finite_weights(model_state: dict[str, Any]) -> None:
    for name, t in model_state.items():
        if torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"model tensor {name!r} contains NaN/Inf: refusing to checkpoint it")


def checkpoint_step(path: Path) -> int | None:
    """The step in a `ckpt-<step>.pt` name, None for any other file."""
    m = CKPT_RE.match(path.name)
    return int(m.group(1)) if m else None


def list_checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """Complete-looking checkpoint files by step, oldest first (temp files never match)."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    found = [p for p in d.iterdir() if checkpoint_step(p) is not None and p.is_file()]
    return sorted(found, key=lambda p: checkpoint_step(p))  # type: ignore[arg-type, return-value]


def save_checkpoint(ckpt_dir: str | Path, state: dict[str, Any], keep_last: int = 3) -> Path:
    """Write state atomically to `<ckpt_dir>/ckpt-<step>.pt`, keep the newest keep_last. -> its path"""
    _check_keys(state, "save_checkpoint")
    _check_finite_weights(state["model"])
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    d = Path(ckpt_dir)
    d.mkdir(parents=True, exist_ok=True)
    final = d / f"ckpt-{state['step']}.pt"
    # temp file in the same folder, fsync, os.replace, fsync of the folder (rlcr.io.atomic_path)
    with atomic_path(final) as tmp:
        torch.save(state, tmp)
    _prune(d, keep_last, keep=final)
    return final


def _prune(d: Path, keep_last: int, keep: Path) -> None:
    """Delete all but the newest keep_last checkpoints, and temp files left by killed writers."""
    for old in list_checkpoints(d)[:-keep_last]:
        if old != keep:
            old.unlink(missing_ok=True)
    for p in d.iterdir():
        if TMP_RE.match(p.name):
            p.unlink(missing_ok=True)


def _read(path: Path, map_location: Any = "cpu", mmap: bool = False) -> Any:
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # torn zip, foreign pickle, disallowed global: all "not a checkpoint"
        raise CheckpointError(
            f"{path}: cannot be loaded with weights_only=True: {type(e).__name__}: {e}"
        ) from e


def load_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint with torch.load(weights_only=True); refuse one that cannot resume exactly."""
    path = Path(path)
    state = _read(path, map_location)
    _check_keys(state, str(path))
    return state


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    """The newest checkpoint that loads and is complete, or None; broken newer files are skipped.

    Each candidate is opened memory-mapped (the pickle is read, tensor bytes are not), which is
    enough to reject a torn zip or a file written by something else.
    """
    for path in reversed(list_checkpoints(ckpt_dir)):
        try:
            _check_keys(_read(path, mmap=True), str(path))
        except CheckpointError as e:
            log.warning("skipping unusable checkpoint: %s", e)
            continue
        return path
    return None
