"""CPU per publish of a service's bus, 200 at once as a coordinator replica publishes a round's
decisions: each `Bus.publish` awaited together (``gathered``), against `Bus.publish_many`
(``pipelined``: sent without waiting, the acks awaited together), alternated every round,
against a running nats-server.

Builds a service's bus as deployed (`ckpt_ha.runtime.service.new_service`: faststream's
metrics middleware, the publish metrics), on private streams provisioned first and deleted
afterwards, publishes ``--rounds`` rounds of 1,000 events and prints the process's CPU time
per publish of each round and the wall time. Usage:
    .venv/bin/python bench/bench_publish.py [--rounds 5] [--nats nats://127.0.0.1:4222]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
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
        ways: dict[str, list[float]] = {"gathered": [], "pipelined": []}
        try:
            for n in range(args.rounds):
                for way, per in ways.items():  # side by side, alternated every round
                    held = [JobHeldV1(job_id=f"job-{i}", actor="bench") for i in range(PER_ROUND)]
                    events = [
                        build(h, source="bench", time=now, key=f"{way}-{n}-{i}")
                        for i, h in enumerate(held)
                    ]
                    cpu, wall = time.process_time(), time.perf_counter()
                    for k in range(0, PER_ROUND, AT_ONCE):
                        chunk = events[k : k + AT_ONCE]
                        if way == "pipelined":
                            assert await service.bus.publish_many(chunk) == [None] * len(chunk)
                        else:
                            await asyncio.gather(*(service.bus.publish(e) for e in chunk))
                    cpu_ms = (time.process_time() - cpu) / PER_ROUND * 1e3
                    per.append(cpu_ms)
                    print(
                        f"round {n + 1}, {way}: {cpu_ms:.3f} ms of CPU per publish, "
                        f"{PER_ROUND:,} in {time.perf_counter() - wall:.2f}s "
                        f"(load {os.getloadavg()[0]:.2f})"
                    )
            print(
                "median CPU per publish: "
                + ", ".join(f"{way} {statistics.median(per):.3f} ms" for way, per in ways.items())
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
