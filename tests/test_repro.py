"""`python -m rlcr.repro`: dvc repro in parallel lanes, on a real DVC project of the same shape as ours
(bootstrap -> train -> rollout@*, bootstrap -> ablate@*, then a stage that reads them all)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import dvc

from rlcr.env import cpu_kernels
from rlcr.repro import plan_lanes

ROOT = Path(__file__).resolve().parents[1]

# each stage writes its out, with when it ran: [start, end] (it sleeps so that lanes can overlap)
STAGE = ("import json,os,sys,time; t=time.time(); time.sleep(float(os.environ.get('NAP','1'))); "
         "fail=os.environ.get('FAIL_STAGE')=='{name}'; "
         "(fail and sys.exit(3)); os.makedirs('out',exist_ok=True); "
         "json.dump([t,time.time()],open('out/{name}.json','w'))")


def _stage(name: str, deps: list[str]) -> dict:
    return {"cmd": f'{sys.executable} -c "{STAGE.format(name=name)}"', "deps": deps, "outs": [f"out/{name}.json"]}


def toy_project(tmp_path: Path, ablations: int = 4) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    dvc(root, "init", "--no-scm", "-q")
    names = {"rollout": ["a", "b"], "ablate": [f"v{k}" for k in range(ablations)]}
    # as in our dvc.yaml, the rollouts come before train in the file (and so in `dvc stage list`)
    stages = {"bootstrap": _stage("bootstrap", []),
              "rollout": {"foreach": names["rollout"], "do": _stage("rollout@${item}", ["out/train.json"])},
              "train": _stage("train", ["out/bootstrap.json"])}
    stages["ablate"] = {"foreach": names["ablate"], "do": _stage("ablate@${item}", ["out/bootstrap.json"])}
    stages["report"] = _stage("report", [f"out/{g}@{i}.json" for g, items in names.items() for i in items])
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    return root


def _env(root: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "DVC_NO_ANALYTICS": "1", "DVC_SITE_CACHE_DIR": str(root / ".state/dvc"), **extra}


def _repro(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlcr.repro", "--root", str(root), *args], cwd=ROOT,
                          env=_env(root, **env), capture_output=True, text=True, timeout=300)


def _ran(root: Path) -> dict[str, list[float]]:
    return {p.stem: json.loads(p.read_text()) for p in (root / "out").glob("*.json")}


def test_plan_keeps_the_rollouts_together_and_deals_out_the_ablations():
    stages = ["prepare", "bootstrap", "rollout@x-1", "rollout@x-2", "rollout@y-1", "train"] + [
        f"ablate@v-{k}" for k in range(7)] + ["evaluate", "report"]
    lanes = plan_lanes(stages, 2)
    assert lanes[0][:4] == ["train", "rollout@x-1", "rollout@x-2", "rollout@y-1"]  # the globs' order
    assert sorted(lanes[0][4:] + lanes[1]) == [f"ablate@v-{k}" for k in range(7)]
    assert (len(lanes[0]), len(lanes[1])) == (6, 5)  # train, 3 rollouts + 2 ablations; 5 ablations
    assert plan_lanes(stages, 1) == [stages[5:6] + stages[2:5] + stages[6:13]]
    assert plan_lanes(["a", "ablate@1"], 4) == [["ablate@1"]]  # no empty lane
    with pytest.raises(ValueError, match="jobs"):
        plan_lanes(stages, 0)


STAGE_THREADS_PROBE = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from rlcr.stage import run_stage
def body(params, tracker, root):
    import torch
    print("threads", torch.get_num_threads())
sys.exit(run_stage(sys.argv[2], body, Path(sys.argv[1]), overrides={"tracking.enabled": False}))
"""


@pytest.mark.parametrize(("stage", "threads", "preset"), [("bootstrap", "2", None), ("train", "1", None),
                                                          ("ablate@collective-0", "1", None), ("bootstrap", "1", "1")])
def test_a_stage_runs_at_its_own_thread_count_whatever_the_machine_unless_you_set_one(stage, threads, preset):
    """The thread count is part of what a stage computes (env.STAGE_THREADS), so it is the stage's, not the
    machine's or the lanes'; an OMP_NUM_THREADS of the user's wins."""
    environ = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # conftest sets 1 for the suite
    if preset:
        environ["OMP_NUM_THREADS"] = preset
    r = subprocess.run([sys.executable, "-c", STAGE_THREADS_PROBE, str(ROOT), stage], capture_output=True,
                       text=True, env=environ, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"threads {threads}" in r.stdout


def test_lanes_run_at_once_and_leave_what_a_plain_repro_leaves(tmp_path):
    root = toy_project(tmp_path)
    proc = _repro(root, "--jobs", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = _ran(root)
    assert set(ran) == {"bootstrap", "train", "rollout@a", "rollout@b", "report"} | {f"ablate@v{k}" for k in range(4)}
    assert "[lane 0]" in proc.stdout and "[lane 1]" in proc.stdout
    lanes = [line for line in proc.stdout.splitlines() if line.startswith("[repro] 2 lanes")]
    assert lanes, proc.stdout
    # some stage of lane 1 ran while a stage of lane 0 ran
    lane1 = [s for s in ran if f" {s}" in lanes[0].split("; 1:")[1]]
    lane0 = [s for s in ran if f" {s}" in lanes[0].split("; 1:")[0]]
    assert lane0 and lane1
    overlap = max(min(ran[a][1], ran[b][1]) - max(ran[a][0], ran[b][0]) for a in lane0 for b in lane1)
    assert overlap > 0.3, ran
    assert all(ran["report"][0] >= end for s, (_, end) in ran.items() if s != "report")
    status = dvc(root, "status")
    assert "up to date" in status.stdout, status.stdout  # dvc.lock has every stage
    locked = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    assert set(locked) == set(ran)
    again = _repro(root, "--jobs", "2")  # nothing left to run
    assert again.returncode == 0 and _ran(root) == ran


def test_a_failed_lane_stops_the_others_and_its_exit_status_is_returned(tmp_path):
    root = toy_project(tmp_path, ablations=6)
    proc = _repro(root, "--jobs", "2", FAIL_STAGE="ablate@v1", NAP="1.5")
    assert proc.returncode != 0
    assert "lane 1 failed" in proc.stdout, proc.stdout[-3000:]
    ran = _ran(root)
    assert "ablate@v1" not in ran and "report" not in ran
    assert len([s for s in ran if s.startswith("ablate@")]) < 5  # the other lane was stopped, not run out
    status = dvc(root, "status")
    assert "ablate@v1" in status.stdout  # still to run: nothing recorded it as done
    fixed = _repro(root, "--jobs", "2")  # a rerun finishes it
    assert fixed.returncode == 0, fixed.stdout[-3000:]
    assert {f"ablate@v{k}" for k in range(6)} | {"report"} <= set(_ran(root))


def test_jobs_1_is_a_plain_dvc_repro_and_bad_jobs_is_an_error(tmp_path):
    root = toy_project(tmp_path, ablations=2)
    proc = _repro(root, "--jobs", "1", NAP="0")
    assert proc.returncode == 0 and "lanes" not in proc.stdout
    assert len(_ran(root)) == 7
    bad = _repro(root, "--jobs", "0")
    assert bad.returncode == 2 and "--jobs must be >= 1" in bad.stderr


THREADS_PROBE = """
import hashlib, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from rlcr import env
env.setup(Path(sys.argv[1]))  # as every stage does, before torch loads
import torch
from rlcr.config import load_params
from rlcr.policy.models import build_tiny
model, tok = build_tiny(load_params(sys.argv[1] + "/params.yaml").model, seed=0)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
torch.manual_seed(0)
ids = torch.randint(0, model.config.vocab_size, (8, 600))
digest = hashlib.md5()
for _ in range(2):
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    opt.zero_grad()
    digest.update(out.logits.detach().numpy().tobytes())
print(torch.get_num_threads(), digest.hexdigest(), torch.backends.cpu.get_cpu_capability())
"""


PINNED = ("ATEN_CPU_CAPABILITY", "MKL_CBWR")
PINNED_DIGESTS = {"AVX2": "91a1295a25e0728f8b987f46f7d89427"}
"""THREADS_PROBE's digest with the kernels rlcr.env pins, per torch capability, on the machine kind of
the committed run: an AMD EPYC with AVX-512 (torch's kernels pinned to AVX2, MKL's AVX2 branch in strict
mode), the same at 1 and 2 threads. A machine that prints another digest here computes other bits, and
a repro on it gives other metrics than the committed ones. (The Intel Xeon with AMX of the runs before
bef32eb prints 02e69976c7352b8f55611f931b03ee2e with torch's own AVX512 kernels.)"""


def _probe(**env_vars: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k not in PINNED}  # conftest's env.setup already pinned them
    r = subprocess.run([sys.executable, "-c", THREADS_PROBE, str(ROOT)], capture_output=True, text=True,
                       env={**base, **env_vars}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.split()


def test_the_default_policy_computes_the_same_bits_at_1_and_2_threads():
    """The default model's forward, backward and AdamW steps on this probe are bit-identical at 1 and 2
    torch threads. Not a guarantee for every batch (a row at two threads' boundary can round
    differently, rarely: rlcr.env.STAGE_THREADS), which is why each stage fixes its thread count."""
    outs = [_probe(OMP_NUM_THREADS=n) for n in ("1", "2")]  # each asserts its exit status
    assert [o[0] for o in outs] == ["1", "2"]
    assert outs[0][1] == outs[1][1]


def test_cpu_kernels_are_pinned_to_avx2_on_x86_cpus_that_have_it():
    avx2 = "flags : fpu sse2 avx avx2 fma avx512f\n"
    strict = {"MKL_CBWR": "AVX2,STRICT"}
    assert cpu_kernels("x86_64", avx2) == {"ATEN_CPU_CAPABILITY": "avx2", **strict}
    assert cpu_kernels("AMD64", avx2) == {"ATEN_CPU_CAPABILITY": "avx2", **strict}
    assert cpu_kernels("x86_64", "flags : fpu avx avx2 avx512f amx_bf16 amx_tile amx_int8\n") == strict  # AMX: torch's own
    assert cpu_kernels("x86_64", "flags : fpu sse2 avx\n") == {}  # no AVX2: the CPU's own kernels
    assert cpu_kernels("aarch64", avx2) == {}


@pytest.mark.skipif(not cpu_kernels(), reason="rlcr.env pins kernels on x86-64 CPUs with AVX2 only")
def test_a_stage_process_computes_the_committed_runs_bits():
    """env.setup pins the kernels, so a machine of the committed run's kind computes its bits; the
    user's own ATEN_CPU_CAPABILITY still wins. On another kind of CPU the probe's digest is said, not
    asserted: its repro gives that machine's own numbers (README, "Reproducibility")."""
    threads, digest, capability = _probe()
    if capability not in PINNED_DIGESTS:
        pytest.skip(f"the committed run was made with torch's {sorted(PINNED_DIGESTS)} kernels; this CPU runs "
                    f"{capability} (probe digest {digest}): a repro here gives this machine's own numbers")
    assert digest == PINNED_DIGESTS[capability], (
        f"this CPU computes other bits than the committed run's machine ({digest}): "
        "a repro here will not give the committed metrics")
    own = _probe(ATEN_CPU_CAPABILITY="default")
    assert own[2] == "DEFAULT" and own[1] != digest
