"""Benchmark: raw BSON -> extended JSON text, python-bsonjs (libbson, in C) against mcdc's walker + orjson.

    python scripts/bench_extjson.py [--rounds 5]

Two documents of bench_kafka's shape (``make_doc``): a small one (~315 BSON bytes) and a large one (~16 KB:
the same with 50 such documents in an array). For each, in canonical and relaxed mode: µs per document, best of
``--rounds``, for ``bsonjs.dumps(raw, mode=...)`` and for ``orjson.dumps(to_json_value(RawBSONDocument))``
(what the event sinks run), and the ratio bsonjs/walker (below 1: bsonjs wins). It also checks that both
parse to the same values (bsonjs writes doubles with 17+ digits, which parse to the same bits).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import random
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bson
import bsonjs
import orjson
from bench_kafka import make_doc
from bson import json_util
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument

from replicator.bsonkit.extjson import CANONICAL, to_json_value
from replicator.source.connection import RAW_CODEC


def documents() -> dict[str, bytes]:
    small = make_doc(ObjectId("6b045916116fbc02bd7b6552"), 1, random.Random(1))
    large = make_doc(ObjectId("6b045916116fbc02bd7b6553"), 2, random.Random(2))
    large["items"] = [make_doc(ObjectId(), i, random.Random(i)) for i in range(50)]
    return {"small": bson.encode(small), "large": bson.encode(large)}


def best_us(fn: object, number: int, rounds: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=rounds)) / number * 1e6  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds, the best counts (default 5)")
    args = parser.parse_args(argv)
    print(f"python-bsonjs {importlib.metadata.version('python-bsonjs')}, orjson {orjson.__version__}")
    print(f"{'document':<8} {'bytes':>6} {'mode':<9} {'bsonjs µs':>10} {'walker µs':>10} {'bsonjs/walker':>14}")
    for name, raw in documents().items():
        doc = RawBSONDocument(raw, RAW_CODEC)
        number = 20_000 if len(raw) < 1000 else 500
        for mode, relaxed in (("canonical", False), ("relaxed", True)):
            flag = bsonjs.RELAXED if relaxed else bsonjs.CANONICAL
            theirs = json_util.loads(bsonjs.dumps(raw, mode=flag), json_options=CANONICAL)
            ours = json_util.loads(orjson.dumps(to_json_value(doc, relaxed=relaxed)), json_options=CANONICAL)
            if not relaxed:
                assert theirs == ours, f"{name}: bsonjs and the walker disagree"
            c = best_us(lambda raw=raw, flag=flag: bsonjs.dumps(raw, mode=flag), number, args.rounds)
            w = best_us(
                lambda doc=doc, relaxed=relaxed: orjson.dumps(to_json_value(doc, relaxed=relaxed)), number, args.rounds
            )
            print(f"{name:<8} {len(raw):>6} {mode:<9} {c:>10.2f} {w:>10.2f} {c / w:>14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
