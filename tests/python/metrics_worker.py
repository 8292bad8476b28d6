"""A training-like process for tests/python/test_metrics_export.py: reads every object of a
prefix through a DataLoader with worker processes (WHARF_METRICS_ADDR set by the test), writes
a line to its stdout when done, then stays alive until stdin closes, so the test can scrape
its /metrics endpoint (and a Prometheus server can)."""
import json
import sys

import torch

import wharf
from wharf.torch import IterableDataset


def identity(batch):
    return batch


def main():
    uri, workers = sys.argv[1], int(sys.argv[2])
    # One read in this process too: its series and the workers' must add up as one.
    store = wharf.Store(uri)
    store.get(next(iter(store.list()))["key"])
    ds = IterableDataset.from_prefix(uri, shuffle=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=workers,
                                         collate_fn=identity)
    n = sum(len(b) for b in loader)
    print(json.dumps({"samples": n, "exporter": wharf._wharf._metrics_exporter()}), flush=True)
    sys.stdin.read()  # until the test closes it


if __name__ == "__main__":
    main()
