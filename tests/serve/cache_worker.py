"""A serving replica for test_cache.py: answers requests through a PredictionCache and prints
what it got as one JSON line.

    cache_worker.py BACKEND --prefix P --tag T --requests JSON [--threads N]
                    [--compute-sleep S] [--count-file F] [--barrier]

Each request is answered by N threads at once. compute() returns b"<tag>:<request JSON>", so
the parent sees which process computed a value, and counts itself (an INCR of <prefix>computes
on Redis, else a line appended to --count-file). With --barrier the worker prints "ready" and
waits for a line on stdin before it starts, so several workers start together.
"""
import argparse
import json
import os
import pathlib
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))

from wharf.serve import PredictionCache  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("backend")
    p.add_argument("--prefix", default="wharf:pc:")
    p.add_argument("--model-version", default="v1")
    p.add_argument("--tag", required=True)
    p.add_argument("--requests", required=True, help="a JSON list of requests")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--compute-sleep", type=float, default=0.0)
    p.add_argument("--count-file")
    p.add_argument("--barrier", action="store_true")
    args = p.parse_args()
    requests = json.loads(args.requests)

    counter = None
    if args.backend.startswith("redis://"):
        import redis
        counter = redis.Redis.from_url(args.backend)

    def compute(request):
        if counter is not None:
            counter.incr(args.prefix + "computes")
        elif args.count_file:
            fd = os.open(args.count_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(fd, f"{args.tag}\n".encode())
            os.close(fd)
        time.sleep(args.compute_sleep)
        return f"{args.tag}:{json.dumps(request, sort_keys=True)}".encode()

    cache = PredictionCache(args.backend, key_prefix=args.prefix)
    if args.barrier:
        print("ready", flush=True)
        sys.stdin.readline()
    values = [[None] * args.threads for _ in requests]

    def run(t):
        for i, request in enumerate(requests):
            values[i][t] = cache.get_or_compute(args.model_version, request, compute).decode()

    threads = [threading.Thread(target=run, args=(t,)) for t in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = cache.stats()
    cache.close()
    print(json.dumps({"values": values, "stats": stats}), flush=True)


if __name__ == "__main__":
    main()
