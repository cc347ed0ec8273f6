"""What DVC sees as each stage's dependencies (dvc.yaml): the params a stage reads, the SELECTED
profile's block only, users' data files, and matrix instances named by policy and org; and the
default remote (.dvc/config) that `dvc push` fills and `dvc pull` restores a fresh clone from.

Cheap by design: no stage runs. A copy of the project gets a placeholder for every out, `dvc commit`
records the pipeline as it stands, and each test edits one thing and reads `dvc status --json`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import copy_project
from helpers import dvc

from rlcr.config import ConfigError, load_params

pytestmark = pytest.mark.slow

USER_ROWS = "".join(json.dumps({"question": f"What is {i} plus 2?", "answer": str(i + 2)}) + "\n" for i in range(8))


def stage_outs(root: Path) -> list[str]:
    """Every out of every stage of the copy's dvc.yaml, matrix instances expanded (DVC's own parser)."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        return sorted({str(out.def_path) for stage in repo.index.stages for out in stage.outs})


def place(root: Path, out: str, content: str) -> None:
    """A stand-in for a stage's out: a file, or a folder holding one file (outs without a suffix)."""
    path = root / out
    target = path if path.suffix else path / "placeholder"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)


def changes(root: Path, *stages: str) -> dict[str, list]:
    """What `dvc status` reports (for `stages`, else all), stage by stage: {stage: [{"changed deps": {...}}]}."""
    return json.loads(dvc(root, "status", "--json", *stages).stdout or "{}")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The project with a user's JSONL file in prepare's eval split, every out in place, committed. The
    ablate matrix is cut to 2 variants x 1 seed: each `dvc status` then checks 12 stages, not 31."""
    root = copy_project(tmp_path_factory.mktemp("deps") / "project")
    (root / "data/raw/user.jsonl").write_text(USER_ROWS)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["prepare"]["eval"].append({"name": "jsonl/user", "n": 4, "options": {"path": "data/raw/user.jsonl"}})
    params["ablate"].update(variants=["collective", "no_hiring"], seeds=[0])
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for out in stage_outs(root):
        place(root, out, "v1")
    dvc(root, "commit", "--force", "--quiet")
    return root


def edit_params(root: Path, edit) -> None:
    path = root / "params.yaml"
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_matrix_instances_are_named_by_policy_and_org(project):
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    assert {"rollout@bootstrap-company", "rollout@bootstrap-single", "rollout@trained-company",
            "rollout@trained-single", "ablate@collective-0", "ablate@no_hiring-0"} <= set(lock)
    assert not any("policy0" in n or "policy1" in n for n in lock)
    assert "models/trained" in {d["path"] for d in lock["rollout@trained-company"]["deps"]}  # the trained policy
    assert "models/bootstrap" not in {d["path"] for d in lock["rollout@trained-company"]["deps"]}


def test_each_edit_stales_only_the_stages_that_read_it(project):
    """Three edits at once, one `dvc status`: another profile's block (nothing), bootstrap.steps (bootstrap
    alone, not prepare) and the user's JSONL file (prepare, through its data/raw dep); then bootstrap's
    rerun writing another models/bootstrap stales exactly the stages that read it."""
    assert load_params(project / "params.yaml").profile == "tiny"

    def edit(data):
        data["profiles"]["quick"]["bootstrap"]["steps"] += 1
        data["profiles"]["quick"]["train"]["lr"] = 0.5
        data["profiles"]["long"]["org"]["token_budget"] += 8
        data["bootstrap"]["steps"] += 1

    edit_params(project, edit)
    with open(project / "data/raw/user.jsonl", "a") as f:
        f.write(json.dumps({"question": "What is 40 plus 2?", "answer": "42"}) + "\n")
    assert changes(project) == {"prepare": [{"changed deps": {"data/raw": "modified"}}],
                                "bootstrap": [{"changed deps": {"params.yaml": {"bootstrap": "modified"}}}]}

    place(project, "models/bootstrap", "v2")  # what bootstrap's rerun does
    after = changes(project)
    assert set(after) == {"prepare", "bootstrap", "train", "rollout@bootstrap-company", "rollout@bootstrap-single",
                          "ablate@collective-0", "ablate@no_hiring-0"}
    assert after["train"] == [{"changed deps": {"models/bootstrap": "modified"}}]


def test_the_selected_profiles_block_reruns_the_stages(project_copy):
    """With `profile: quick` selected, an edit of profiles.quick reruns the stages; of profiles.tiny, none."""
    root = project_copy
    edit_params(root, lambda d: d.update(profile="quick"))
    for out in ("data/tasks/train.parquet", "data/tasks/eval.parquet", "metrics/prepare.json", "models/bootstrap",
                "metrics/bootstrap.json"):
        place(root, out, "v1")
    dvc(root, "commit", "--force", "--quiet", "prepare", "bootstrap")
    edit_params(root, lambda d: d["profiles"].update(tiny={"bootstrap": {"steps": 7}}))
    assert changes(root, "prepare", "bootstrap") == {}
    edit_params(root, lambda d: d["profiles"]["quick"]["bootstrap"].update(steps=30))
    assert load_params(root / "params.yaml").bootstrap.steps == 30
    changed = changes(root, "prepare", "bootstrap")
    assert changed["bootstrap"] == [{"changed deps": {"params.yaml": {"profiles.quick": "modified"}}}]
    assert "prepare" in changed  # the selected block counts whole (dvc.yaml says why)
def test_a_users_file_outside_data_raw_is_refused(tmp_path):
    params = yaml.safe_load((Path(__file__).parents[1] / "params.yaml").read_text())
    params["prepare"]["eval"].append({"name": "jsonl/user", "n": 4, "options": {"path": str(tmp_path / "u.jsonl")}})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=r"prepare\.eval\[14\]\.options\.path: .* is not in data/raw/"):
        load_params(tmp_path / "params.yaml")
    for bad in ("../data/raw/u.jsonl", "data/raw", "data/rawish/u.jsonl"):
        params["prepare"]["eval"][-1]["options"]["path"] = bad
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
        with pytest.raises(ConfigError, match="is not in data/raw/"):
            load_params(tmp_path / "params.yaml")


def test_default_remote_push_then_pull_in_a_fresh_clone(tmp_path):
    """The project's .dvc/config in a one-stage project: its default remote `rlcr` is the folder
    rlcr-dvc-remote NEXT TO the checkout, so a clone beside it pulls what the first one pushed."""
    git = lambda cwd, *a: subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *a], cwd=cwd,  # noqa: E731
                                         check=True, capture_output=True)
    first = tmp_path / "first"
    (first / ".dvc").mkdir(parents=True)
    git(first, "init", "-q")
    (first / ".dvc/config").write_text((Path(__file__).parents[1] / ".dvc/config").read_text())
    (first / "dvc.yaml").write_text("stages:\n  make:\n    cmd: mkdir -p out && echo 42 > out/answer.txt\n"
                                    "    outs: [out]\n")
    (first / ".gitignore").write_text("/out\n/.dvc/cache\n/.dvc/tmp\n")
    dvc(first, "repro")
    git(first, "add", "-A")
    git(first, "commit", "-qm", "one stage")
    assert "2 files pushed" in dvc(first, "push").stdout  # out/answer.txt and the folder's listing
    assert (tmp_path / "rlcr-dvc-remote/files/md5").is_dir()  # outside the checkout, beside it

    git(tmp_path, "clone", "-q", str(first), "second")
    second = tmp_path / "second"
    assert not (second / "out").exists()
    dvc(second, "pull")
    assert (second / "out/answer.txt").read_text() == "42\n"
    assert "up to date" in dvc(second, "status").stdout


@pytest.mark.parametrize("section,key,value", [("ablate", "seeds", [0]), ("rollout", "policies", ["bootstrap"])])
def test_a_profile_cannot_change_what_the_matrix_is_built_from(tmp_path, section, key, value):
    params = yaml.safe_load((Path(__file__).parents[1] / "params.yaml").read_text())
    params["profiles"]["quick"].setdefault(section, {})[key] = value
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=rf"profiles\.quick\.{section}\.{key}: dvc.yaml's matrix reads the top-level"):
        load_params(tmp_path / "params.yaml", profile="tiny")
