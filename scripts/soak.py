"""Soak mcdc under the chaos harness: seeded fault plans, one after another, for as long as asked.

    python scripts/soak.py --minutes 30 --seed 1000                 # both engines, every target
    python scripts/soak.py --minutes 30 --engine spark --sink mongo
    python scripts/soak.py --minutes 30 --sink lake                  # Delta Lake and Iceberg tables
    python scripts/soak.py --once --seed 1042 --mode tail --engine asyncio --sink mongo   # one plan again

Plan ``n`` of a soak uses seed ``--seed + n``; its engine, target and mode are drawn from that seed among
those asked for (targets: MongoDB, Kafka, Delta Lake and Iceberg tables; ``--sink all``, the default, or
``both`` draws any of them, ``lake`` either lake). Each plan writes a random mix of CRUD, transactions and
DDL while faults strike (kill -9, SIGTERM, pauses and restarts of the servers or the broker, restored
older checkpoints, and MongoDB's ``failCommand`` fail points on mcdc's reads of the source and its
writes to a MongoDB target: errors, closed connections, write concern errors and slow answers, a few
times or for a while; tests/chaos/failpoints.py), then checks that the target is identical to the source
(a lake: its state tables hold the source's documents byte for byte, its change tables no event twice),
and that catch-up from several saved checkpoint versions, each restored in turn, converges too
(tests/chaos/harness.py). A run that an outage under a fail point ended (exit 75) is run again, as an
operator would; any other exit it did not ask for fails the plan. The first failure stops the soak with
its seed, its plan and the command that runs it again; the exit code is then 1.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.chaos.harness import (  # noqa: E402
    ENGINES,
    LAKE_SINKS,
    MODES,
    SINK_ENGINES,
    SINKS,
    ChaosFailure,
    Plan,
    Tally,
    local_servers,
    run_plan,
)
from tests.chaos.workload import DDL_KINDS  # noqa: E402


def _choices(value: str, every: tuple[str, ...]) -> tuple[str, ...]:
    if value == "lake":
        return LAKE_SINKS
    return every if value == "both" or value == "all" else (value,)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to keep starting plans")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000, help="seed of the first plan")
    parser.add_argument("--engine", choices=[*ENGINES, "both"], default="both")
    parser.add_argument(
        "--sink", choices=[*SINKS, "lake", "all", "both"], default="all", help="the target (both: the same as all)"
    )
    parser.add_argument("--mode", choices=[*MODES, "both"], default="both")
    parser.add_argument("--length", type=int, default=8, help="write steps per plan")
    parser.add_argument("--replays", type=int, default=4, help="saved checkpoint versions replayed per plan")
    parser.add_argument(
        "--filter", choices=["drawn", "yes", "no"], default="drawn",
        help="plans with a --filter (partial replication): as each seed draws it (about a third), always, never",
    )  # fmt: skip
    parser.add_argument(
        "--field-exclude", choices=["drawn", "yes", "no"], default="drawn",
        help="MongoDB plans with a --field-exclude: as each seed draws it (about a third), always, never",
    )  # fmt: skip
    parser.add_argument("--once", action="store_true", help="run the one plan of --seed, then stop")
    parser.add_argument("--workdir", type=Path, help="keep servers' data and mcdc's logs here")
    args = parser.parse_args()

    engines, sinks, modes = _choices(args.engine, ENGINES), _choices(args.sink, SINKS), _choices(args.mode, MODES)
    sinks = tuple(sink for sink in sinks if set(engines) & set(SINK_ENGINES[sink]))
    if not sinks:
        parser.error(f"--sink {args.sink} does not run on --engine {args.engine}")
    base = args.workdir or Path(tempfile.mkdtemp(prefix="mcdc-soak-"))
    total = Tally(plans=0)
    deadline = time.monotonic() + args.minutes * 60
    started = time.monotonic()
    print(f"soak: seeds from {args.seed}, engines {'/'.join(engines)}, targets {'/'.join(sinks)}; work in {base}")
    with local_servers(base / "servers", kafka="kafka" in sinks) as servers:
        n = 0
        while n == 0 or (not args.once and time.monotonic() < deadline):
            seed = args.seed + n
            pick = random.Random(seed)
            mode, engine, sink = pick.choice(modes), pick.choice(engines), pick.choice(sinks)
            if engine not in SINK_ENGINES[sink]:  # a sink that runs on fewer engines: one of its own
                engine = pick.choice([e for e in engines if e in SINK_ENGINES[sink]])
            filtered = None if args.filter == "drawn" else args.filter == "yes"
            excluded = None if args.field_exclude == "drawn" else args.field_exclude == "yes"
            plan = Plan.draw(
                seed, mode=mode, engine=engine, sink=sink, length=args.length, replays=args.replays, filtered=filtered,
                excluded=excluded,
            )  # fmt: skip
            began = time.monotonic()
            try:
                tally = run_plan(plan, servers, base / f"plan-{seed}")
            except ChaosFailure as exc:
                print(f"\nFAILED after {n} plans passed:\n{exc}", flush=True)
                return 1
            total.add(tally)
            print(
                f"plan {n + 1} (seed {seed}, {plan.mode}, {plan.engine}, {plan.sink}"
                f"{', filtered' if plan.filter else ''}{', field-exclude' if plan.exclude else ''}"
                f"{', and back' if plan.back else ''}): ok in "
                f"{time.monotonic() - began:.0f} s, {tally.faults} faults, {tally.failpoints} fail points"
                f"{f' ({tally.outages} runs ended by one, run again)' if tally.outages else ''}, "
                f"{tally.writes} writes, "
                f"{tally.events} events applied",
                flush=True,
            )
            n += 1
    minutes = (time.monotonic() - started) / 60
    ddl = sum(v for k, v in total.kinds.items() if k.rstrip("!") in DDL_KINDS)
    print(
        f"soak: {total.plans} plans passed in {minutes:.1f} min: {total.faults} faults, {total.failpoints} fail points "
        f"armed ({total.outages} runs ended by one, run again), {total.writes} writes "
        f"({ddl} DDL), {total.events} events applied by {total.runs} mcdc runs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
