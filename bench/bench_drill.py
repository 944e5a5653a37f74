"""How much of a recovery is the control plane's: run the node-exit drill on a private embedded
stack and print, for each restore, the seconds from the fault to `resume.verified` split into
detection, planning, relaunch and the continuity verdict (ckpt-ha) versus loading and computing
(the job).

    .venv/bin/python bench/bench_drill.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=1)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "REDIS_URL")}
        env["CKPT_HA_HOME"] = str(home)
        try:
            for _ in range(args.runs):
                done = subprocess.run(
                    [sys.executable, "-m", "ckpt_ha.cli.main", "drill", "--scenario",
                     "node-exit", "--json"],
                    env=env, capture_output=True, text=True, check=False,
                )  # fmt: skip
                result = json.loads(done.stdout)
                for phase in result["phases"]:
                    if phase.get("durations"):
                        rows.append((phase["scenario"], phase["durations"]))
        finally:
            subprocess.run([sys.executable, "-m", "ckpt_ha.cli.main", "down"], env=env, check=False)
    print(f"{'phase':<22} {'total s':>8} {'control s':>9} {'share':>6}  detect  plan   relaunch "
          "verdict  load   compute")  # fmt: skip
    for name, d in rows:
        print(
            f"{name:<22} {d['total']:8.3f} {d['control_plane']:9.3f} "
            f"{100 * d['control_plane_share']:5.1f}%  {d['detect']:.3f}  {d['plan']:.3f}  "
            f"{d['relaunch']:.3f}    {d['verdict']:.3f}    {d['load']:.3f}  {d['compute']:.3f}"
        )
    if rows:
        shares = [d["control_plane_share"] for _, d in rows]
        print(f"control plane share: median {100 * statistics.median(shares):.1f}% over "
              f"{len(rows)} restores")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
