"""One attempt of a training job, as a real process, for tests/integration/test_fencing.py: it
writes checkpoints and reports progress with the SDK under the runner's variables
(``CKPT_HA_*``, `ckpt_ha.sdk.protocol`), one command per line on stdin, so the test decides
when each write happens (a zombie attempt keeps writing after the next one was planned).

Commands: ``save <step>`` (a native checkpoint, announced), ``progress <step>`` (a
``job.progress``, flushed), ``quit``. Each answers one JSON line on stdout.

Usage (from the repository root): ``python tests/support/fence_writer.py``
"""

from __future__ import annotations

import json
import sys

import numpy as np

from ckpt_ha import sdk


def main() -> int:
    ctx = sdk.context()
    assert ctx is not None, "run under a runner's variables (CKPT_HA_JOB, ...)"
    assert ctx.storage_root is not None
    for line in sys.stdin:
        command, _, arg = line.strip().partition(" ")
        if command == "quit":
            break
        step = int(arg)
        if command == "save":
            state = {"w": np.full(4, float(step)), "pos": step * 8}
            saved = sdk.save(ctx.storage_root, ctx.job_id, step, state, ctx=ctx)
            answer = {
                "uri": saved.uri,
                "checkpoint_id": saved.checkpoint_id,
                "announced": saved.announced,
            }
        elif command == "progress":
            sdk.progress(step, data_position=step * 8, metrics={"loss": 1.0 / step}, ctx=ctx)
            answer = {"flushed": sdk.flush_progress(10)}
        else:
            answer = {"error": f"unknown command {command!r}"}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
