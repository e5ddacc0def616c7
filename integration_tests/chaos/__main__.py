"""``python -m integration_tests.chaos``: the random chaos soak (``make chaos KILLS=200``).

Runs every pipeline of ``pipelines.PIPELINES`` (files, postgres, kafka...), one after another or
``--parallel`` at a time, each with its share of ``--kills`` and of ``--faults`` (faults beyond
kills, of every kind that reaches it: ``setup.faultTargets``) drawn from ``--seed`` (printed:
``--seed N`` replays the same schedules), against the servers of ``make services``; verifies
each with ``twophase.verify``; prints a Markdown table (kills and faults by kind, batches,
records, lost, duplicated, longest recovery) and the liveness table (per kind, seconds to the
next committed batch), and writes them with a JSON twin to ``--out``. Exit 1 when any record is
lost or duplicated.

Side by side, pipelines share the servers: a fault one schedule puts on a server reaches every
pipeline using it (the table counts it once, for the schedule that drew it), and the faults and
kills of a server take turns (``Services.exclusive``).

``--cluster`` runs the pipelines on the compose cluster (``make compose-up``, servers as in
``services/docker.env``): each driver in a container, the faults of nodes besides (``cluster``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from integration_tests.chaos.cluster import PIPELINES as CLUSTER_PIPELINES
from integration_tests.chaos.cluster import PROCESS_KINDS as CLUSTER_PROCESS_KINDS
from integration_tests.chaos.cluster import Cluster
from integration_tests.chaos.faultkinds import Disk
from integration_tests.chaos.pipelines import PIPELINES
from integration_tests.chaos.report import ChaosResult, livenessTable, resultJson, summaryTable
from integration_tests.chaos.schedule import PROCESS_KINDS
from integration_tests.chaos.setup import (
    drawSchedule,
    faultTargets,
    pipelineLog,
    runPipeline,
    servicesFromEnvironment,
)
from twophase.cli.console import LiveDisplay


def shares(total: int, parts: int) -> list[int]:
    """``total`` split over ``parts``, the first ones taking the remainder."""
    return [total // parts + (1 if index < total % parts else 0) for index in range(parts)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m integration_tests.chaos", description=__doc__)
    p.add_argument("--kills", type=int, default=200, help="kills in all, split over pipelines")
    p.add_argument(
        "--faults", type=int, default=0, help="faults beyond kills in all, split over pipelines"
    )
    p.add_argument("--seed", type=int, help="default: random (printed)")
    p.add_argument("--pipelines", default=",".join(PIPELINES))
    p.add_argument("--rows-per-batch", type=int, default=500)
    p.add_argument("--cover-points", action="store_true", help="every protocol point first")
    p.add_argument(
        "--upgrades",
        type=int,
        default=1,
        help="starts by the previous release in each pipeline's schedule (default 1)",
    )
    p.add_argument("--parallel", type=int, default=1, help="pipelines run side by side (default 1)")
    p.add_argument(
        "--cluster",
        action="store_true",
        help="on the compose cluster (make compose-up): drivers in containers, node faults",
    )
    p.add_argument("--workdir", default="chaos-runs")
    p.add_argument("--out", default="chaos-runs/report")
    p.add_argument(
        "--print-schedules", action="store_true", help="print each schedule and exit, run nothing"
    )
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    pipelines = [name.strip() for name in args.pipelines.split(",") if name.strip()]
    known = CLUSTER_PIPELINES if args.cluster else tuple(PIPELINES)
    if args.cluster and args.pipelines == p.get_default("pipelines"):
        pipelines = list(CLUSTER_PIPELINES)
    unknown = sorted(set(pipelines) - set(known))
    if unknown:
        p.error(f"unknown pipeline(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    kills = shares(args.kills, len(pipelines))
    faults = shares(args.faults, len(pipelines))
    if args.print_schedules:
        for pipeline, k, f in zip(pipelines, kills, faults, strict=True):
            targets = faultTargets(
                pipeline, proxies=not args.cluster, disk=not args.cluster, cluster=args.cluster
            )
            schedule = drawSchedule(
                pipeline,
                seed,
                k,
                coverPoints=args.cover_points,
                faults=f,
                targets=targets,
                processKinds=CLUSTER_PROCESS_KINDS if args.cluster else PROCESS_KINDS,
                upgrades=0 if args.cluster else args.upgrades,
            )
            print(f"{pipeline}: " + "; ".join(e.describe() for e in schedule.events))
        return 0
    cluster = Cluster() if args.cluster else None
    if cluster is not None:
        cluster.up()
    services = servicesFromEnvironment(proxies=cluster is None)
    if args.faults and cluster is None and (services.proxies is None or not Disk.possible()):
        print(
            "[chaos] some fault kinds cannot be delivered here: "
            + ("no proxies (services/toxiproxy.sh); " if services.proxies is None else "")
            + ("no tmpfs for a full disk (needs root)" if not Disk.possible() else ""),
            flush=True,
        )
    print(
        f"[chaos] seed {seed}: {args.kills} kills and {args.faults} faults over "
        f"{', '.join(pipelines)}",
        flush=True,
    )
    began = time.monotonic()

    def runOne(pipeline: str, share: int, faultShare: int) -> ChaosResult:
        try:
            result = runPipeline(
                pipeline,
                Path(args.workdir).resolve() / f"{seed}-{pipeline}",
                services,
                seed=seed,
                kills=share,
                rowsPerBatch=args.rows_per_batch,
                coverPoints=args.cover_points,
                faults=faultShare,
                log=pipelineLog(pipeline) if args.parallel > 1 else print,
                display=display,
                cluster=cluster,
                upgrades=args.upgrades,
            )
        except BaseException:  # said now, not when the pipelines before it are done
            print(f"[chaos] {pipeline} stopped:\n{traceback.format_exc()}", flush=True)
            raise
        print(f"[chaos] {pipeline}: {result.report}", flush=True)
        return result

    # On a terminal a live row per pipeline under the log lines, gone before the tables.
    with (
        LiveDisplay(sys.stdout, "events") as display,
        ThreadPoolExecutor(max(1, args.parallel)) as pool,
    ):
        results = list(pool.map(runOne, pipelines, kills, faults))
    table = summaryTable(results) + "\n\n" + livenessTable(results)
    minutes = (time.monotonic() - began) / 60
    side = f", {args.parallel} pipelines side by side" if args.parallel > 1 else ""
    print(f"\nseed {seed}, {minutes:.1f} min{side}\n\n{table}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(f"seed {seed}, {minutes:.1f} min{side}\n\n{table}\n")
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "seed": seed,
                "parallel": args.parallel,
                "results": [resultJson(r) for r in results],
            },
            indent=1,
        )
    )
    if not all(r.ok for r in results):
        print(f"[chaos] EXACTLY-ONCE VIOLATED; replay with --seed {seed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
