"""The policy: models as HF folders (tiny, smollm2, any HF folder) and the rollout engines.

models.py     build_tiny / build_smollm2 / materialize, save_policy (atomic), load_policy, render_chat
tokenizer.py  the tiny model's character tokenizer; `encode` that never fails on hostile text
engine.py     the Engine interface: Sampling, Completion, sequence_logprobs (trainer parity), make_engine
torch_engine  batched KV-cached decoding in plain torch (CPU and CUDA)
vllm_engine   vllm.LLM behind the same interface (GPU profile; weights pushed after each update)
bridge.py     EnginePolicy: the organisation's Policy over an engine, one call per round
instruct.py   the protocol system prompt of chat-template (instruct) models
lora.py       LoRA adapters through peft (train.finetune: lora) and the merged weights the engine serves
mlflow_model  policies and adapters logged as mlflow.transformers models, registered with the alias
"""

from rlcr.policy.engine import Completion, Engine, Sampling, make_engine, sequence_logprobs

__all__ = ["Completion", "Engine", "Sampling", "make_engine", "sequence_logprobs"]
