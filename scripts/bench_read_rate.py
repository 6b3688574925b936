"""Benchmark: ``mcdc sync --max-read-rate`` holds its cap over every 5-second window; on the same two servers,
capped and uncapped, in one run.

    python scripts/bench_read_rate.py [--docs 40000] [--doc-size 200] [--rate 2000] [--json]
    python scripts/bench_read_rate.py --source mongodb://... --target mongodb://...

1. Loads ``bench.docs`` (``--docs`` documents of about ``--doc-size`` bytes; an earlier matching load is
   reused, as scripts/bench_sync.py does) and scans it once.
2. Capped: ``mcdc sync --include 'bench\\.docs' --max-read-rate RATE --metrics-port P`` into the wiped target
   with a fresh checkpoint. ``GET /progress`` is polled every 0.5 s for ``collectionCopy.copiedDocuments``
   (documents the target acknowledged; the source's reads run at most one read-ahead ahead of them), each
   sample timed when its answer came.
3. Uncapped: the same without ``--max-read-rate``, into the wiped target again.

For each run, the copy's samples are those from the last one showing 0 documents to the first showing all
of them. Over every window of them that spans at least 5 s (from each sample to the first one 5 s or more
later), the documents copied per second; the table shows their maximum and median, the overall rate (all
documents over the copy's time) and the number of windows. PASS/FAIL: the capped run's largest window is
at most 5 % over ``--rate`` (the bucket allows a tenth of a second's burst: 2 % over 5 s), and the uncapped
run is faster than the cap (else the cap was not what held the rate). Exits 0 whatever they say: it is a
measurement. Exits 1 only when a step fails (mcdc exits non-zero, the target is not complete).

Without ``--source/--target`` it starts two local SecantusDB servers (a Python MongoDB-compatible server,
several times slower than mongod) in a temporary directory: figures are for that server, not for MongoDB;
the ratio within one run is what counts. With them, only the ``bench`` database is touched (dropped on the
target, reloaded on the source if its ``bench.meta`` marker does not match the requested data).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import harness

from tests.support.servers import free_port

WINDOW_S = 5.0
SAMPLE_EVERY_S = 0.5
OVER_CAP = 0.05  # the largest 5-second window may be this much over the cap


@dataclass
class Run:
    """One copy and its samples: (seconds since the command started, documents copied)."""

    kind: str  # "capped" | "uncapped"
    docs: int
    wall_s: float
    samples: list[tuple[float, int]] = field(default_factory=list)
    window_rates: list[float] = field(default_factory=list)
    max_window: float = 0.0
    median_window: float = 0.0
    overall: float = 0.0


def copy_span(samples: Sequence[tuple[float, int]], docs: int) -> list[tuple[float, int]]:
    """The samples of the copy itself: from the last one with nothing copied to the first with all of it."""
    start = max((i for i, (_, n) in enumerate(samples) if n == 0), default=0)
    end = next((i for i, (_, n) in enumerate(samples) if n >= docs), len(samples) - 1)
    return list(samples[start : end + 1])


def window_rates(samples: Sequence[tuple[float, int]], span: float = WINDOW_S) -> list[float]:
    """Documents per second over every window from a sample to the first sample ``span`` seconds or more
    after it (none when the samples cover less than ``span``)."""
    rates = []
    j = 0
    for i, (t0, n0) in enumerate(samples):
        j = max(j, i + 1)
        while j < len(samples) and samples[j][0] - t0 < span:
            j += 1
        if j == len(samples):
            break
        t1, n1 = samples[j]
        rates.append((n1 - n0) / (t1 - t0))
    return rates


def _copied(port: int) -> int | None:
    """collectionCopy.copiedDocuments of the running sync's /progress; None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/progress", timeout=1.0) as answer:
            progress = json.load(answer)["progress"]
    except (OSError, ValueError, KeyError):
        return None
    return int(progress.get("collectionCopy", {}).get("copiedDocuments") or 0)


def run_sync(
    kind: str, source: str, target: str, workdir: Path, docs: int, extra: Sequence[str]
) -> tuple[Run, list[str]]:
    """Run one mcdc sync of bench.docs into the wiped target, polling /progress; the run and its argv."""
    harness.reset_target(target)
    checkpoint = harness.fresh_checkpoint(workdir, f"checkpoint-{kind}.json")
    port = free_port()
    argv = harness.mcdc(
        "sync", "--source", source, "--target", target, "--include", harness.INCLUDE,
        "--checkpoint", str(checkpoint), "--metrics-port", str(port), "--no-progress", *extra,
    )  # fmt: skip
    print(f"$ {harness.show(argv)}", flush=True)
    samples: list[tuple[float, int]] = []
    with open(workdir / f"{kind}.err", "wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
        next_at = started
        try:
            while proc.poll() is None:
                copied = _copied(port)
                if copied is not None:
                    samples.append((time.perf_counter() - started, copied))
                next_at += SAMPLE_EVERY_S  # on a fixed schedule, whatever a poll took
                time.sleep(max(0.0, next_at - time.perf_counter()))
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
        wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise harness.BenchError(f"mcdc sync ({kind}) exited {proc.returncode}: see {workdir / (kind + '.err')}")
    harness.check_target(target, docs, f"mcdc sync ({kind})")
    samples.append((wall, docs))  # the process ended: everything was copied by then
    run = Run(kind, docs, round(wall, 3), samples)
    span = copy_span(samples, docs)
    run.window_rates = [round(r, 1) for r in window_rates(span)]
    if run.window_rates:
        run.max_window = max(run.window_rates)
        run.median_window = round(statistics.median(run.window_rates), 1)
    if len(span) > 1 and span[-1][0] > span[0][0]:
        run.overall = round((span[-1][1] - span[0][1]) / (span[-1][0] - span[0][0]), 1)
    print(f"{wall:.1f} s; {len(samples)} samples; max 5-s window {run.max_window:,.0f} docs/s, overall "
          f"{run.overall:,.0f} docs/s")  # fmt: skip
    return run, argv


def bench(args: argparse.Namespace) -> dict[str, Any]:
    with harness.bench_setup("bench_read_rate", args, "mcdc-bench-rate-", load=True) as setup:
        workdir, source, target, server = setup
        harness.heading(f"Capped: mcdc sync --max-read-rate {args.rate}")
        capped, capped_argv = run_sync(
            "capped", source, target, workdir, args.docs, ["--max-read-rate", str(args.rate), *args.mcdc_arg]
        )
        harness.heading("Uncapped: mcdc sync")
        uncapped, uncapped_argv = run_sync("uncapped", source, target, workdir, args.docs, args.mcdc_arg)
    ratio = uncapped.overall / capped.overall if capped.overall else 0.0
    limit = args.rate * (1 + OVER_CAP)
    return {
        "server": server,
        "docs": args.docs,
        "doc_size": args.doc_size,
        "rate": args.rate,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "mcdc_code": harness.code_version(),
        "ratio_uncapped_capped": round(ratio, 2),
        "targets": {
            f"capped: every 5-s window <= {limit:,.0f} docs/s": bool(capped.window_rates)
            and capped.max_window <= limit,
            f"uncapped: faster than {args.rate:,} docs/s overall": uncapped.overall > args.rate,
        },
        "runs": [asdict(capped), asdict(uncapped)],
        "commands": {
            "bench": harness.show([sys.executable, *sys.argv]),
            "capped": harness.show(capped_argv),
            "uncapped": harness.show(uncapped_argv),
        },
    }


def print_report(data: dict[str, Any]) -> None:
    harness.heading(
        f"Results: {data['docs']:,} documents of ~{data['doc_size']} bytes, cap {data['rate']:,} docs/s, "
        f"measured on {data['server']}"
    )
    print(f"{data['cpus']} CPUs, Python {data['python']}; mcdc code: {data['mcdc_code']}")
    print(f"{'run':<10}{'wall s':>8}{'windows':>9}{'max 5-s docs/s':>16}{'median 5-s':>12}{'overall docs/s':>16}")
    for r in data["runs"]:
        print(f"{r['kind']:<10}{r['wall_s']:>8.1f}{len(r['window_rates']):>9}{r['max_window']:>16,.0f}"
              f"{r['median_window']:>12,.0f}{r['overall']:>16,.0f}")  # fmt: skip
    print(f"uncapped/capped overall: {data['ratio_uncapped_capped']:.2f}")
    harness.print_verdicts(data["targets"], data["commands"])


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    harness.size_options(parser, docs=(40_000, "documents to copy"), doc_size=200)
    parser.add_argument("--rate", type=int, default=2000, help="mcdc sync --max-read-rate (default 2000)")
    harness.add_server_options(parser, "one more argument for both mcdc syncs (repeatable), e.g. --mcdc-arg=-w2")
    parser.error_if(lambda a: a.docs < 1 or a.rate < 1, "--docs and --rate must be at least 1")
    return harness.main("bench_read_rate", parser, argv, bench, print_report)


if __name__ == "__main__":
    sys.exit(main())
