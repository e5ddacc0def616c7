"""``python -m integration_tests.chaos``: the random chaos soak (``make chaos KILLS=200``).

Runs every pipeline of ``pipelines.PIPELINES`` (files, postgres, kafka...) one after another, each
with its share of ``--kills`` drawn from ``--seed`` (printed: ``--seed N`` replays the same
schedules), against the servers of ``make services``; verifies each with ``twophase.verify``;
prints a Markdown table (kills by kind, batches, records, lost, duplicated, longest recovery)
and writes it with a JSON twin to ``--out``. Exit 1 when any record is lost or duplicated.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from integration_tests.chaos.pipelines import PIPELINES
from integration_tests.chaos.report import resultJson, summaryTable
from integration_tests.chaos.setup import drawSchedule, runPipeline, servicesFromEnvironment


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m integration_tests.chaos", description=__doc__)
    p.add_argument("--kills", type=int, default=200, help="kills in all, split over pipelines")
    p.add_argument("--seed", type=int, help="default: random (printed)")
    p.add_argument("--pipelines", default=",".join(PIPELINES))
    p.add_argument("--rows-per-batch", type=int, default=500)
    p.add_argument("--cover-points", action="store_true", help="every protocol point first")
    p.add_argument("--workdir", default="chaos-runs")
    p.add_argument("--out", default="chaos-runs/report")
    p.add_argument(
        "--print-schedules", action="store_true", help="print each schedule and exit, run nothing"
    )
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    pipelines = [name.strip() for name in args.pipelines.split(",") if name.strip()]
    unknown = sorted(set(pipelines) - set(PIPELINES))
    if unknown:
        p.error(f"unknown pipeline(s) {', '.join(unknown)}; choose from {', '.join(PIPELINES)}")
    shares = [
        args.kills // len(pipelines) + (1 if index < args.kills % len(pipelines) else 0)
        for index in range(len(pipelines))
    ]
    if args.print_schedules:
        for pipeline, share in zip(pipelines, shares, strict=True):
            schedule = drawSchedule(pipeline, seed, share, coverPoints=args.cover_points)
            print(f"{pipeline}: " + "; ".join(e.describe() for e in schedule.events))
        return 0
    services = servicesFromEnvironment()
    print(f"[chaos] seed {seed}: {args.kills} kills over {', '.join(pipelines)}", flush=True)
    began = time.monotonic()
    results = []
    for pipeline, share in zip(pipelines, shares, strict=True):
        workdir = Path(args.workdir).resolve() / f"{seed}-{pipeline}"
        result = runPipeline(
            pipeline,
            workdir,
            services,
            seed=seed,
            kills=share,
            rowsPerBatch=args.rows_per_batch,
            coverPoints=args.cover_points,
        )
        results.append(result)
        print(f"[chaos] {pipeline}: {result.report}", flush=True)
    table = summaryTable(results)
    minutes = (time.monotonic() - began) / 60
    print(f"\nseed {seed}, {minutes:.1f} min\n\n{table}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(f"seed {seed}, {minutes:.1f} min\n\n{table}\n")
    out.with_suffix(".json").write_text(
        json.dumps({"seed": seed, "results": [resultJson(r) for r in results]}, indent=1)
    )
    if not all(r.ok for r in results):
        print(f"[chaos] EXACTLY-ONCE VIOLATED; replay with --seed {seed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
