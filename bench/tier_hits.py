"""Tier read-through hits and fills from one Python thread: 2,000 x 1 KiB objects of a local
folder read through Store(cache=...): filled once, then read 10 times from the tier. Prints
the mean microseconds per fill and per hit. For A/B runs of two builds (docs/benchmarks.md,
"Tier counters written while a process reads"):
    PYTHONPATH=<checkout>/python python bench/tier_hits.py"""
import os
import shutil
import tempfile
import time

import wharf

OBJECTS = 2000
ROUNDS = 10


def main():
    base = os.path.join(tempfile.gettempdir(), "wharf-bench-tier-hits")
    src = os.path.join(base, "src")
    if not os.path.isdir(src):  # the same objects for every run
        os.makedirs(src + ".tmp", exist_ok=True)
        for i in range(OBJECTS):
            with open(os.path.join(src + ".tmp", f"k{i:05d}"), "wb") as f:
                f.write(os.urandom(1024))
        os.rename(src + ".tmp", src)
    tier = tempfile.mkdtemp(dir=base)
    try:
        store = wharf.Store(f"file://{src}/", cache=tier)
        keys = [f"k{i:05d}" for i in range(OBJECTS)]
        t0 = time.perf_counter()
        for k in keys:
            store.get(k)  # misses: each fills the tier
        t1 = time.perf_counter()
        for _ in range(ROUNDS):
            for k in keys:
                store.get(k)  # hits
        t2 = time.perf_counter()
        print(f"fill {1e6 * (t1 - t0) / OBJECTS:.1f} us/obj  "
              f"hit {1e6 * (t2 - t1) / (OBJECTS * ROUNDS):.2f} us/obj")
        del store
    finally:
        shutil.rmtree(tier)


if __name__ == "__main__":
    main()
