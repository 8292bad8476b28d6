"""from_files(format="csv") on a file whose quoted field of many lines crosses wharf's 4 MiB text
block, against pandas.read_csv of the same bytes (file://, no server). Prints seconds and rows.

    .venv/bin/python bench/csv_blocks.py [LINES ...]
"""
import io
import os
import sys
import tempfile
import time

import pandas as pd

from wharf.torch import IterableDataset


def main(counts):
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            row = b"1234567,plain\n"
            head = b"id,text\n" + row * ((4 * 1024 * 1024 - 9 * n // 2) // len(row))
            body = head + b'999999,"' + b"line-xyz\n" * n + b'"\n'
            path = f"{tmp}/q{n}/x.csv"
            os.makedirs(os.path.dirname(path))
            with open(path, "wb") as f:
                f.write(body)
            t0 = time.perf_counter()
            want = len(pd.read_csv(io.BytesIO(body)))
            t_pandas = time.perf_counter() - t0
            t0 = time.perf_counter()
            got = sum(b.num_rows for b in IterableDataset.from_files(
                f"file://{tmp}/q{n}/", format="csv", shuffle=False))
            t_wharf = time.perf_counter() - t0
            print(f"{n} quoted lines, {len(body) / 1e6:.1f} MB: pandas {t_pandas:.2f} s "
                  f"({want} rows), wharf from_files {t_wharf:.2f} s ({got} rows)")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [3000, 20000])
