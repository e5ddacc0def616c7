"""``make bench``'s output: the throughput table, the chart and the report."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from bench._common import (
    fmtNumber,
    markdownTable,
    percentiles,
    ratio,
    writeCsv,
)
from bench.flink import FLINK_VERSION
from bench.measures import (
    COMMIT_GOAL_MS,
    FLINK_PATH,
    GOALS,
    MIB,
    PATH_TITLES,
    PATHS,
    RAW_PATH,
    SPARK_PATH,
    TARGET_TITLES,
    TARGETS,
    TWOPHASE_PATH,
    Measure,
    Profile,
)
from bench.session import log


def throughputRows(measures: dict[tuple[str, str], Measure]) -> tuple[list[str], list[list[str]]]:
    header = [
        "target", "path", "rows", "seconds", "rows/s", "twophase / this", "goal", "met",
        "driver MiB", "JVM MiB", "Py workers MiB", "note",
    ]  # fmt: skip
    rows = []
    for target in TARGETS:
        tp = measures[(target, "twophase")]
        for path in PATHS:
            m = measures[(target, path)]
            name = {
                "twophase": TWOPHASE_PATH, "spark": SPARK_PATH, "flink": FLINK_PATH, "raw": RAW_PATH
            }[path][target]  # fmt: skip
            r = ratio(tp.rate, m.rate) if path != "twophase" else float("nan")
            goal = GOALS.get(path)
            met = "-" if goal is None or r != r else ("yes" if r >= goal else "no")
            rows.append([
                TARGET_TITLES[target], name, fmtNumber(m.rows) if m.rows else "-",
                fmtNumber(m.seconds, 1), fmtNumber(m.rate), fmtNumber(r, 2),
                f">= {goal}" if goal else "", met,
                fmtNumber(m.memory.driver / MIB) if m.memory.samples else "-",
                fmtNumber(m.memory.jvm / MIB) if m.memory.samples else "-",
                fmtNumber(m.memory.workers / MIB) if m.memory.samples else "-",
                m.note,
            ])  # fmt: skip
    return header, rows


def chart(measures: dict[tuple[str, str], Measure], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.8))
    width = 0.2
    for i, p in enumerate(PATHS):
        values = [measures[(t, p)].rate for t in TARGETS]
        xs = [j + (i - 1.5) * width for j in range(len(TARGETS))]
        bars = ax.bar(xs, [0 if v != v else v for v in values], width, label=PATH_TITLES[p])
        for bar, v in zip(bars, values, strict=True):
            label = "n/m" if v != v else f"{v / 1000:,.0f}k"
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, max(bar.get_height(), 1)),
                        ha="center", va="bottom", fontsize=7)  # fmt: skip
    ax.set_xticks(range(len(TARGETS)), [TARGET_TITLES[t] for t in TARGETS])
    ax.set_ylabel("rows/s (log scale)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------


def report(
    out: Path, prof: Profile, measures: dict[tuple[str, str], Measure],
    commit: dict[str, tuple[float, float, int]], latency: dict[str, list[float]],
    sweep: list[list[str]], sparkVersion: str, elapsed: float, args: argparse.Namespace,
) -> None:  # fmt: skip
    header, rows = throughputRows(measures)
    writeCsv(out / "bench.csv", header, rows)
    batches = -(-prof.rows // prof.rowsPerBatch)
    title = f"{prof.rows:,} rows, batches of {prof.rowsPerBatch:,}, {prof.partitions} partitions"
    chart(measures, out / "bench.png", title)
    commitRows = []
    for target in TARGETS:
        p50, p95, n = commit[target]
        tp = measures[(target, "twophase")]
        batchMs = tp.seconds / batches * 1000
        goal = COMMIT_GOAL_MS[target]
        commitRows.append([
            TARGET_TITLES[target], str(n), fmtNumber(p50), fmtNumber(p95), f"<= {goal:.0f}",
            "yes" if p50 <= goal else "no", fmtNumber(batchMs), fmtNumber(ratio(p50, batchMs), 3),
        ])  # fmt: skip
    latencyRows = []
    for target, values in latency.items():
        p50, p95, top = percentiles(values)
        latencyRows.append([
            f"twophase.{target}", str(prof.latencyRate), fmtNumber(len(values)),
            fmtNumber(p50 * 1000), fmtNumber(p95 * 1000), fmtNumber(top * 1000),
            fmtNumber(ratio(p50, 1.0), 2),
        ])  # fmt: skip
    load = os.getloadavg()
    lines = [
        f"# make bench: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, PySpark {sparkVersion}, apache-flink {FLINK_VERSION}; "
        f"load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.",
        f"Run: `python -m bench.bench {' '.join(sys.argv[1:])}`.",
        f"Rows: {prof.rows:,} (`id`, `payload` padded to {prof.valueBytes} bytes), batches of "
        f"{prof.rowsPerBatch:,} ({batches} batches), {prof.partitions} partitions / "
        f"parallelism {prof.partitions}, {prof.partitions} topic partitions. Total time "
        f"{elapsed / 60:.1f} min.",
        "",
        "## Throughput (rows visible to a committed reader / seconds)",
        "",
        markdownTable(header, rows),
        "",
        "## Driver commit time per batch (twophase, decision log)",
        "",
        markdownTable(
            [
                "target",
                "batches",
                "p50 ms",
                "p95 ms",
                "goal (p50)",
                "met",
                "batch ms",
                "p50 / batch",
            ],
            commitRows,
        ),  # fmt: skip
        "",
        f"## End-to-end latency at {prof.latencyRate} rows/s (rate source, trigger 1 s, "
        f"{prof.latencySeconds} s)",
        "",
        markdownTable(
            ["sink", "rows/s in", "rows seen", "p50 ms", "p95 ms", "max ms", "p50 / trigger"],
            latencyRows,
        ),  # fmt: skip
    ]
    if sweep:
        lines += [
            "",
            f"## Sweep: twophase, {prof.sweepRows:,} rows",
            "",
            markdownTable(
                [
                    "target",
                    "rows/batch",
                    "partitions",
                    "batches",
                    "rows/s",
                    "commit p50 ms",
                    "commit p95 ms",
                    "batch ms",
                    "p50 / batch",
                ],
                sweep,
            ),  # fmt: skip
        ]
    text = "\n".join(lines) + "\n"
    (out / "bench.md").write_text(text)
    print()
    print(text)
    log(f"wrote {out / 'bench.md'}, {out / 'bench.csv'}, {out / 'bench.png'}")
