"""CPU per publish of a service's bus (`Bus.publish`, as a coordinator replica publishes its
decisions: 200 at once, awaited together), against a running nats-server.

Builds a service's bus as deployed (`ckpt_ha.runtime.service.new_service`: faststream's
metrics middleware, the publish metrics), on private streams provisioned first and deleted
afterwards, publishes ``--rounds`` rounds of 1,000 events and prints the process's CPU time
per publish of each round and the wall time. Usage:
    .venv/bin/python bench/bench_publish.py [--rounds 5] [--nats nats://127.0.0.1:4222]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime

from bench_consume import private_names, provisioned

from ckpt_ha.contracts import build
from ckpt_ha.contracts.job import JobHeldV1
from ckpt_ha.restore_coordinator.settings import RestoreCoordinatorSettings
from ckpt_ha.runtime.service import new_service

PER_ROUND = 1000
AT_ONCE = 200


async def run(args: argparse.Namespace) -> None:
    settings = RestoreCoordinatorSettings(NATS_URL=args.nats, **private_names("pub"))
    async with provisioned(args.nats, settings.bus()):
        service = new_service("restore-coordinator", settings)
        await service.bus.broker.start()
        now = datetime.now(UTC)
        try:
            for n in range(args.rounds):
                held = [JobHeldV1(job_id=f"job-{i}", actor="bench") for i in range(PER_ROUND)]
                events = [
                    build(h, source="bench", time=now, key=f"{n}-{i}") for i, h in enumerate(held)
                ]
                cpu, wall = time.process_time(), time.perf_counter()
                for k in range(0, PER_ROUND, AT_ONCE):
                    await asyncio.gather(*(service.bus.publish(e) for e in events[k : k + AT_ONCE]))
                cpu_ms = (time.process_time() - cpu) / PER_ROUND * 1e3
                print(
                    f"round {n + 1}: {cpu_ms:.3f} ms of CPU per publish, "
                    f"{PER_ROUND:,} in {time.perf_counter() - wall:.2f}s"
                )
        finally:
            await service.bus.broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--nats", default="nats://127.0.0.1:4222")
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
