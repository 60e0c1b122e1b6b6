#!/usr/bin/env python
"""Chaos run: the pipeline and sinks under SIGKILLs (and broker restarts) for a while.

    .venv/bin/python scripts/chaos.py --duration 300
    .venv/bin/python scripts/chaos.py --duration 600 --broker-restarts --seed 7
    .venv/bin/python scripts/chaos.py --cluster --minutes 20

Starts a pipeline worker, a files sink and a recording sink (each its own
process, as in production), an OpenAI-compatible fake LLM on loopback, and a
producer streaming an endless multi-session workload. At random intervals it
SIGKILLs one or more workers and starts them again (and, with
``--broker-restarts``, restarts a broker of its own, never a shared one). With
``--cluster`` it runs against the 3-broker cluster of ``kafka.sh start --brokers 3``
(started if not running, and then stopped at the end) and its faults are the
cluster's: kill -9 the busiest partition's leader, a rolling restart, a node down
longer than the session timeout while workers are killed, and scaling between one
and three pipeline workers and one and two recorder workers. When
the time is up it stops producing, waits until everything produced has been
delivered, and checks the invariant from the destinations' own records
(tests/support/invariants.py):

* every action delivered exactly once in effect, per-session order kept;
* summaries rolling, windows contiguous, ranges at the threshold crossings,
  nothing summarised before it was delivered;
* each session's context file = last summary + exactly the batches after it;
* nothing in dead letters.

Prints progress while it runs and a summary at the end; exits 1 on any
violation (or if the system does not catch up), 0 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fakes.openai_server import FakeOpenAIServer  # noqa: E402
from tests.support import broker_cluster as faults  # noqa: E402
from tests.support.cluster import (  # noqa: E402
    RECORDER,
    Cluster,
    ManagedWorker,
    SeparateBroker,
    endless_stream,
    reliability_env,
)
from tests.support.invariants import (  # noqa: E402
    check_files,
    check_records,
    expected_from_topic,
    is_complete,
    progress,
)
from tests.support.kafka_io import (  # noqa: E402
    StreamProducer,
    delete_topics_at_the_end,
    read_topic,
)

THRESHOLD = 8
MAX_PER_BATCH = 500


def say(message: str, started: float) -> None:
    print(f"[chaos {time.monotonic() - started:6.1f}s] {message}", flush=True)


async def cluster_fault(
    rng: random.Random, brokers: faults.BrokerCluster, cluster: Cluster, started: float
) -> str:
    """One of the cluster's faults, picked at random; returns what it was."""
    env = cluster.env
    kind = rng.choice(["leader", "rolling", "down+workers", "scale", "workers"])
    if kind == "leader":
        node = await faults.kill_busiest_leader(brokers, env, down_s=rng.uniform(2, 10))
        return f"kill -9 busiest leader (node {node}), back and in sync"
    if kind == "rolling":
        await faults.rolling_restart(brokers, env)
        return "rolling restart of all nodes"
    running = [w for w in cluster.workers if not w.down]
    victims = rng.sample(running, rng.randint(1, len(running)))
    if kind == "down+workers":
        down_s = rng.uniform(12, 25)  # the session timeout is 6 s (FAST_REBALANCE)
        node = await faults.broker_down_with_workers(brokers, env, victims, down_s)
        return f"node {node} down {down_s:.0f}s, killed {[v.name for v in victims]}"
    if kind == "scale":
        pipelines, sinks = rng.randint(1, 3), rng.randint(1, 2)
        await faults.scale_workers(cluster, pipelines, sinks, RECORDER)
        return f"scaled to {pipelines} pipeline and {sinks} recorder workers"
    for victim in victims:
        victim.kill()
    await asyncio.sleep(rng.uniform(0.0, 2.0))
    for victim in victims:
        victim.start()
    await faults.cluster_ready(victims)
    return f"kill -9 {[v.name for v in victims]}"


async def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    rng = random.Random(args.seed)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (once, at start-up)
    say(f"seed {args.seed}, duration {args.duration}s, logs in {workdir}", started)

    broker: SeparateBroker | None = None
    bootstrap = args.bootstrap
    if args.broker_restarts:
        say("starting a broker of this run's own (it will be restarted)", started)
        broker = await asyncio.to_thread(SeparateBroker(workdir / "kafka").start)
        bootstrap = broker.bootstrap

    brokers: faults.BrokerCluster | None = None
    stop_brokers = False
    if args.cluster:
        brokers = faults.BrokerCluster()
        bootstrap = brokers.bootstrap
        if not await asyncio.to_thread(brokers.running):
            say("starting the 3-broker cluster (scripts/kafka.sh start --brokers 3)", started)
            await brokers.start()
            stop_brokers = True

    kills: Counter[str] = Counter()
    restarts = 0
    cluster: Cluster | None = None
    try:
        async with FakeOpenAIServer(latency_s=0.05) as llm:
            env = reliability_env(
                bootstrap,
                workdir,
                AC_THRESHOLD=str(THRESHOLD),
                AC_LLM_API_KEY="sk-chaos-not-a-secret",
                AC_LLM_BASE_URL=llm.base_url,
                AC_FORMAT_ACTIONS="tests.support.plugins:format_with_session",
                AC_IDLE_TIMEOUT_S="3600",
                AC_LLM_RETRY_MAX_WAIT_S="1",
            )
            cluster = Cluster(env, workdir)
            pipeline = cluster.pipeline()
            files = cluster.sink("files")
            recorder = cluster.sink(RECORDER)
            await cluster.ready()
            say(f"workers ready; producing ~{args.rate:g} payloads/s", started)
            producer = await StreamProducer(
                env, endless_stream(args.seed, args.wave_sessions), rate=args.rate
            ).start()

            targets: list[tuple[str, list[ManagedWorker]]] = [
                ("pipeline", [pipeline]),
                ("files sink", [files]),
                ("recorder sink", [recorder]),
                ("pipeline + recorder", [pipeline, recorder]),
                ("everything", [pipeline, files, recorder]),
            ]
            if broker is not None:
                targets.append(("broker", []))
            deadline = started + args.duration
            next_report = time.monotonic() + 10
            while time.monotonic() < deadline:
                pause = rng.uniform(args.kill_min, args.kill_max)
                wake = min(time.monotonic() + pause, deadline)
                while time.monotonic() < wake:
                    await asyncio.sleep(min(1.0, wake - time.monotonic()))
                    if time.monotonic() >= next_report:
                        next_report += 10
                        say(
                            f"produced {producer.produced} payloads, recorder has "
                            f"{len(cluster.records())} operations, kills {sum(kills.values())}, "
                            f"restarts {restarts}",
                            started,
                        )
                if time.monotonic() >= deadline:
                    break
                if brokers is not None:
                    say(await cluster_fault(rng, brokers, cluster, started), started)
                    kills["cluster faults"] += 1
                    next_report = time.monotonic() + 10
                    continue
                name, victims = rng.choice(targets)
                if not victims:
                    assert broker is not None
                    say("restarting the broker", started)
                    await broker.restart(down_s=rng.uniform(1, 4), hard=rng.random() < 0.5)
                    kills["broker"] += 1
                    say("broker back", started)
                    continue
                say(f"kill -9 {name}", started)
                for victim in victims:
                    victim.kill()
                    kills[victim.name] += 1
                await asyncio.sleep(rng.uniform(0.0, 2.0))
                for victim in victims:
                    victim.start()
                    restarts += 1
                await cluster.ready(*victims)

            await producer.stop()
            say(
                f"chaos over: {producer.produced} payloads produced; waiting for delivery",
                started,
            )
            records = await read_topic(env, "actions", timeout=120)
            expected = expected_from_topic(records, THRESHOLD, MAX_PER_BATCH)
            settle_deadline = time.monotonic() + args.settle_timeout
            caught_up = False
            while time.monotonic() < settle_deadline:
                if is_complete(cluster.records(), expected):
                    caught_up = True
                    break
                say(progress(cluster.records(), expected), started)
                await asyncio.sleep(5)
            report = check_records(cluster.records(), expected, complete=True)
            wrong_files: list[str] = []
            if caught_up:
                for _ in range(30):  # the files sink may trail the recorder a little
                    wrong_files = check_files(cluster.files_dir, cluster.records(), expected)
                    if not wrong_files:
                        break
                    await asyncio.sleep(2)
            dead_letters = await read_topic(env, "dead-letters", timeout=60)
    finally:
        if cluster is not None:
            cluster.stop()
            if brokers is not None:
                await delete_topics_at_the_end(cluster.env)
        if brokers is not None and stop_brokers:
            await brokers.stop()
        if broker is not None:
            await asyncio.to_thread(broker.remove)

    violations = list(report.violations)
    violations += [f"{sid}: context file differs" for sid in wrong_files]
    violations += [f"dead letter at {r.partition}@{r.offset}" for r in dead_letters]
    if not caught_up:
        violations.append(f"not caught up after {args.settle_timeout:.0f}s")
    print()
    print("chaos summary")
    print(f"  seed                 {args.seed}")
    total = time.monotonic() - started
    print(f"  duration             {args.duration:.0f}s of chaos, {total:.0f}s in all")
    print(f"  kills                {sum(kills.values())} ({dict(sorted(kills.items()))})")
    print(
        f"  restarts             {restarts} workers"
        + (f", {kills['broker']} broker" if broker else "")
    )
    print(
        f"  events               {len(records)} payloads, {expected.actions} actions, "
        f"{len(expected.sessions)} sessions"
    )
    print(f"  delivered            {report.line()}")
    exact = len(expected.sessions) - len(wrong_files)
    print(f"  files sink           {exact}/{len(expected.sessions)} context files exact")
    print(f"  invariant violations {len(violations)}")
    for violation in violations[:40]:
        print(f"    - {violation}")
    if violations:
        print(f"  logs kept in {workdir}")
    elif not args.workdir and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if violations else 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of chaos")
    parser.add_argument("--minutes", type=float, help="minutes of chaos (instead of --duration)")
    parser.add_argument(
        "--cluster", action="store_true", help="against the 3-broker cluster, with its faults"
    )
    parser.add_argument("--seed", type=int, default=random.randrange(1_000_000))
    parser.add_argument("--rate", type=float, default=30.0, help="payloads per second")
    parser.add_argument("--wave-sessions", type=int, default=20, help="sessions per wave")
    parser.add_argument("--kill-min", type=float, default=4.0, help="shortest pause between faults")
    parser.add_argument("--kill-max", type=float, default=15.0, help="longest pause between faults")
    parser.add_argument(
        "--broker-restarts", action="store_true", help="also restart a broker of the run's own"
    )
    parser.add_argument(
        "--bootstrap", default="127.0.0.1:9092", help="broker when not --broker-restarts"
    )
    parser.add_argument("--settle-timeout", type=float, default=300.0)
    parser.add_argument(
        "--workdir", help="keep logs and outputs here (default: a temp dir, removed on success)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir even on success")
    args = parser.parse_args()
    if args.minutes is not None:
        args.duration = args.minutes * 60
    # The run's own producer and readers: their reconnect noise during a broker
    # restart is expected; the workers' logs are in the work directory.
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
