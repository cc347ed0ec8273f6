"""Policies as MLflow models: a policy folder and a LoRA adapter logged with the mlflow.transformers
flavour into a real sqlite store, the policy registered as rlcr-policy@latest-trained, and both
loaded back in a FRESH process with `mlflow.transformers.load_model` (tiny Llama: seconds each)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import yaml  # noqa: E402
from helpers import varied_tiny  # noqa: E402
from mlflow import MlflowClient  # noqa: E402

from rlcr.config import resolve  # noqa: E402
from rlcr.policy.lora import serving_state, wrap_lora  # noqa: E402
from rlcr.policy.mlflow_model import ALIAS, REGISTERED_MODEL, log_trained, pip_requirements  # noqa: E402
from rlcr.policy.models import save_policy  # noqa: E402
from rlcr.tracking import MlflowTracker, NullTracker  # noqa: E402

LOADER = """
import json, sys, mlflow, torch
mlflow.set_tracking_uri(sys.argv[1])
out = {}
for key, uri in json.loads(sys.argv[2]).items():
    parts = mlflow.transformers.load_model(uri, return_type="components")
    model = parts["model"]
    out[key] = {"class": type(model).__name__, "tokenizer": type(parts["tokenizer"]).__name__,
                "logits": model(input_ids=torch.tensor([[1, 5, 9, 2]])).logits[0, -1, :8].tolist()}
print(json.dumps(out))
"""


def test_policy_and_adapter_are_logged_registered_and_load_in_a_fresh_process(tmp_path):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    p = resolve(raw, {"model.hidden_size": 64, "model.num_layers": 2, "model.num_heads": 4,
                      "model.intermediate_size": 128, "train.finetune": "lora", "train.lora_rank": 4})
    start_model, tok = varied_tiny(p.model, 0)
    start = save_policy(start_model, tok, tmp_path / "start")
    lora = wrap_lora(varied_tiny(p.model, 0)[0], p.train)
    with torch.no_grad():
        for name, w in lora.named_parameters():
            if "lora_B" in name:
                w.normal_(0.0, 0.3)
    trained, _ = varied_tiny(p.model, 0)
    trained.load_state_dict(serving_state(lora))
    folder = save_policy(trained.eval(), tok, tmp_path / "policy", adapter=lora)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("t", artifact_location=str(tmp_path / "artifacts"))
    run = client.create_run(exp)
    tracker = MlflowTracker(client, run.info.run_id)
    assert log_trained(NullTracker(), folder, start, register=True) is None  # no MLflow: nothing, no error
    info = log_trained(tracker, folder, start, register=True)
    assert info.model_uri == f"runs:/{run.info.run_id}/policy" and "transformers" in info.flavors
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"policy", "lora_adapter"} <= artifacts
    assert "MLmodel" in {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "policy")}
    version = client.get_model_version_by_alias(REGISTERED_MODEL, ALIAS)
    assert version.run_id == run.info.run_id and version.source.endswith("/policy")
    reqs = client.download_artifacts(run.info.run_id, "lora_adapter/requirements.txt", str(tmp_path / "dl"))
    assert set(pip_requirements("peft")) <= set(Path(reqs).read_text().split())

    uris = {"registered": f"models:/{REGISTERED_MODEL}@{ALIAS}", "adapter": f"runs:/{run.info.run_id}/lora_adapter"}
    proc = subprocess.run([sys.executable, "-c", LOADER, uri, json.dumps(uris)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    with torch.no_grad():
        want = trained(input_ids=torch.tensor([[1, 5, 9, 2]])).logits[0, -1, :8]
    assert got["registered"]["class"] == "LlamaForCausalLM"
    assert got["adapter"]["class"].startswith("PeftModel")  # the adapter on its base folder
    for key in ("registered", "adapter"):
        assert torch.allclose(torch.tensor(got[key]["logits"]), want, atol=1e-4), key
