"""Register the pipeline as a Prefect deployment on a process work pool (a GPU machine runs the worker).

    python flows/deploy.py --pool rlcr-gpu --cron "0 2 * * *"      # nightly default pipeline
    prefect worker start --pool rlcr-gpu                             # on the GPU machine, in the repo

Parameters (stages, set_params) can be changed per run in the Prefect UI.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pool", default="rlcr-process", help="process work pool (created if missing)")
    parser.add_argument("--name", default="rlcr-default", help="deployment name")
    parser.add_argument("--cron", default=None, help="cron schedule, e.g. '0 2 * * *'")
    parser.add_argument("--root", default=str(ROOT), help="project checkout the worker runs in")
    args = parser.parse_args(argv)

    from prefect import flow

    subprocess.run(["prefect", "work-pool", "create", args.pool, "--type", "process", "--overwrite"],
                   check=True, capture_output=True)
    deployment = flow.from_source(source=args.root, entrypoint="flows/pipeline.py:pipeline")
    deployment_id = deployment.deploy(
        name=args.name, work_pool_name=args.pool, cron=args.cron, parameters={"root": args.root},
        build=False, push=False, print_next_steps=False,
    )
    print(f"deployment rlcr-pipeline/{args.name} ({deployment_id}) on pool {args.pool}")
    return str(deployment_id)


if __name__ == "__main__":
    main()
