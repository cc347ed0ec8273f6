"""Deploy every RLCR flow of prefect.yaml: the work pools first (created if missing, never re-created,
so their settings and queues survive), then `prefect deploy --all`.

    PREFECT_API_URL=http://127.0.0.1:4200/api python flows/deploy.py [--gpu-slots N]

--gpu-slots N caps the rlcr-gpu pool at N concurrent runs (the GPUs of all its machines together).
`prefect deploy --all` alone does the same once the pools exist.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POOLS = ("rlcr-gpu", "rlcr-control")


def prefect(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [str(Path(sys.executable).parent / "prefect"), *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[1:])} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc


def ensure_pool(name: str) -> bool:
    """Create the process work pool `name` unless it exists; True when it was created."""
    if prefect("work-pool", "inspect", name, check=False).returncode == 0:
        return False
    prefect("work-pool", "create", name, "--type", "process")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu-slots", type=int, default=None, help="concurrency limit of the rlcr-gpu pool")
    args = parser.parse_args(argv)
    for pool in POOLS:
        print(f"work pool {pool}: {'created' if ensure_pool(pool) else 'exists'}")
    if args.gpu_slots is not None:
        prefect("work-pool", "set-concurrency-limit", "rlcr-gpu", str(args.gpu_slots))
    out = prefect("--no-prompt", "deploy", "--all")
    print(out.stdout.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
