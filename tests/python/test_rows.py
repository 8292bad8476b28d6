"""IterableDataset.from_files: Parquet by row groups, Avro by blocks, CSV and JSON lines by
file, as pyarrow.RecordBatch row batches, sharded, shuffled and resumed exactly (issue 17,
item 3). Files are written by pandas, pyarrow and fastavro themselves; every test compares
with what those libraries read from the same bytes."""
import io
import json

import fastavro
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json
import pyarrow.parquet as pq
import pytest
import torch

import wharf
from wharf.torch import IterableDataset


def _frame(rows, columns=8, seed=1):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({f"c{i}": rng.integers(0, 1 << 40, rows) for i in range(columns)})
    df["id"] = np.arange(rows)
    return df


def _put_parquet(root, key, df, row_group_size):
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), buf,
                   row_group_size=row_group_size)
    wharf.Store(root).put(key, buf.getvalue())
    return buf.getvalue()


def _rows(batches, column="id"):
    return [v for b in batches for v in b.column(column).to_pylist()]


def test_parquet_by_row_groups_fetches_only_the_columns_asked_for(root):
    df = _frame(60_000, columns=16)
    sizes = [len(_put_parquet(root, f"p/{k}.parquet", df.iloc[k * 20_000:(k + 1) * 20_000],
                              5_000)) for k in range(3)]
    ds = IterableDataset.from_files(root + "p/", batch_rows=2_000, columns=["c3", "id"],
                                    shuffle=False)
    batches = list(ds)
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert batches[0].schema.names == ["c3", "id"]
    assert _rows(batches) == list(range(60_000))
    assert _rows(batches, "c3") == df["c3"].tolist()
    assert {b.num_rows for b in batches} == {2_000, 1_000}  # 5,000-row groups: 2+2+1
    # 2 of 17 columns, and each file's footer
    fetched = ds._ranges.stats()["bytes_fetched"]
    assert fetched < 0.25 * sum(sizes), (fetched, sizes)
    with pytest.raises(ValueError, match="no column 'nope'"):
        IterableDataset.from_files(root + "p/", columns=["nope"])


def test_one_file_and_format_from_the_suffix(root):
    df = _frame(10_000)
    _put_parquet(root, "one.parquet", df, 3_000)
    ds = IterableDataset.from_files(root + "one.parquet", batch_rows=10_000, shuffle=False)
    batches = list(ds)
    assert [b.num_rows for b in batches] == [3_000, 3_000, 3_000, 1_000]
    assert pa.Table.from_batches(batches).to_pandas().equals(df)
    wharf.Store(root).put("x/a.bin", b"not rows")
    with pytest.raises(ValueError, match="format="):
        IterableDataset.from_files(root + "x/")
    with pytest.raises(ValueError, match="no parquet files"):
        IterableDataset.from_files(root + "x/", format="parquet")
    wharf.Store(root).put("bad.parquet", b"x" * 100)
    with pytest.raises(ValueError, match="bad.parquet: not a Parquet file"):
        IterableDataset.from_files(root + "bad.parquet")


def test_shards_across_ranks_and_workers_and_shuffles_per_epoch(root):
    df = _frame(48_000)
    for k in range(2):
        _put_parquet(root, f"p/{k}.parquet", df.iloc[k * 24_000:(k + 1) * 24_000], 2_000)
    seen = []
    for rank in range(2):
        ds = IterableDataset.from_files(root + "p/", batch_rows=1_000, rank=rank,
                                        world_size=2, seed=5)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        seen.append(_rows(loader))
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(48_000))
    assert len(seen[0]) == len(seen[1]) == 24_000  # 24 row groups dealt 12 and 12
    ds = IterableDataset.from_files(root + "p/", batch_rows=1_000, seed=5)
    e0 = _rows(ds)
    ds.set_epoch(1)
    e1 = _rows(ds)
    assert sorted(e0) == sorted(e1) == list(range(48_000)) and e0 != e1
    ds.set_epoch(0)
    assert _rows(ds) == e0  # the order is a function of (seed, epoch)


@pytest.mark.parametrize("fmt", ["parquet", "avro", "csv", "jsonl"])
def test_exact_mid_epoch_resume(root, fmt):
    df = _frame(9_000, columns=3)
    store = wharf.Store(root)
    for k in range(3):
        part = df.iloc[k * 3_000:(k + 1) * 3_000]
        key = f"d/{k}.{fmt}"
        if fmt == "parquet":
            _put_parquet(root, key, part, 1_000)
        elif fmt == "avro":
            buf = io.BytesIO()
            schema = {"type": "record", "name": "r",
                      "fields": [{"name": c, "type": "long"} for c in part.columns]}
            fastavro.writer(buf, schema, part.to_dict("records"), sync_interval=2_000)
            store.put(key, buf.getvalue())
        elif fmt == "csv":
            store.put(key, part.to_csv(index=False).encode())
        else:
            store.put(key, part.to_json(orient="records", lines=True).encode())
    kw = dict(batch_rows=700, seed=3, split_bytes=4_096)
    full = [b.to_pylist() for b in IterableDataset.from_files(root + "d/", **kw)]
    assert sorted(r["id"] for b in full for r in b) == list(range(9_000))
    for stop in (1, 5, len(full) - 1):
        ds = IterableDataset.from_files(root + "d/", **kw)
        it = iter(ds)
        head = [next(it).to_pylist() for _ in range(stop)]
        state = json.loads(json.dumps(ds.state_dict()))
        again = IterableDataset.from_files(root + "d/", **kw)
        again.load_state_dict(state)
        assert head + [b.to_pylist() for b in again] == full, (fmt, stop)
    other = IterableDataset.from_files(root + "d/", **dict(kw, seed=4))
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(state)


def test_avro_blocks_in_byte_splits_match_fastavro(root):
    schema = {"type": "record", "name": "r", "fields": [
        {"name": "a", "type": "long"}, {"name": "b", "type": ["null", "string"]},
        {"name": "c", "type": {"type": "array", "items": "double"}}]}
    records = [{"a": i, "b": None if i % 3 else f"s{i}", "c": [i / 2] * (i % 4)}
               for i in range(20_000)]
    buf = io.BytesIO()
    fastavro.writer(buf, schema, records, codec="deflate", sync_interval=8_000)
    data = buf.getvalue()
    wharf.Store(root).put("t.avro", data)
    for split in (1_000, 30_000, 1 << 30):
        ds = IterableDataset.from_files(root + "t.avro", batch_rows=1_500, split_bytes=split,
                                        shuffle=False)
        got = [r for b in ds for r in b.to_pylist()]
        assert got == list(fastavro.reader(io.BytesIO(data))), split
    ds = IterableDataset.from_files(root + "t.avro", columns=["a"], shuffle=False)
    assert [r["a"] for b in ds for r in b.to_pylist()] == list(range(20_000))
    # a damaged block is an error naming the file, never rows read silently wrong
    sync = data[-16:]
    second = data.index(sync) + 16
    bad = data[:second] + b"\xff" * 4 + data[second + 4:]
    wharf.Store(root).put("bad.avro", bad)
    with pytest.raises(ValueError, match="bad.avro"):
        list(IterableDataset.from_files(root + "bad.avro", shuffle=False))


def test_csv_and_jsonl_as_pandas_writes_them(root):
    df = _frame(5_000, columns=3)
    df["text"] = [f"a, \"quoted\"\nline {i}" if i % 9 == 0 else f"t{i}" for i in range(len(df))]
    store = wharf.Store(root)
    store.put("t.csv", df.to_csv(index=False).encode("utf-8-sig"))  # with a byte-order mark
    store.put("t.jsonl", df.to_json(orient="records", lines=True).encode())
    for key in ("t.csv", "t.jsonl"):
        ds = IterableDataset.from_files(root + key, batch_rows=999, shuffle=False)
        ds._text_block = 4_096  # many blocks: rows and quoted newlines cross block ends
        got = pa.Table.from_batches(list(ds)).to_pandas()
        assert got.columns.tolist() == df.columns.tolist(), key
        pd.testing.assert_frame_equal(got, df, check_dtype=False)
    ds = IterableDataset.from_files(root + "t.csv", columns=["text"], shuffle=False)
    assert _rows(ds, "text") == df["text"].tolist()


def test_csv_quoted_newlines_and_long_rows_at_any_size(root):
    # Blocks are whole rows cut outside quotes; pyarrow parses each as one chunk, so a quoted
    # field full of newlines (here across many blocks, and longer than pyarrow's 1 MiB chunk)
    # and a row longer than a block read as pandas reads them, without newlines_in_values.
    store = wharf.Store(root)
    many = b"id,text\n" + b"".join(b'%d,"line\nnext %d"\n' % (i, i) for i in range(60_000))
    field = b'id,text\n1,"' + b"abcdefghi\n" * 150_000 + b'"\n2,b\n'
    huge = b"id,text\n1," + b"z" * (3 << 20) + b"\n2,b\n"  # the first block: the header alone
    for key, data in (("many.csv", many), ("field.csv", field), ("huge.csv", huge)):
        store.put(key, data)
        want = pd.read_csv(io.BytesIO(data))
        ds = IterableDataset.from_files(root + key, shuffle=False)
        ds._text_block = 1 << 20
        got = pa.Table.from_batches(list(ds)).to_pandas()
        pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_malformed_csv_and_jsonl_name_the_object_and_where(root):
    store = wharf.Store(root)
    # A bad JSON line in the third block: the error names the file and the block's first byte
    # and line (pyarrow counts rows from the block it parsed).
    good = b"".join(b'{"a": %d}\n' % i for i in range(1000))
    store.put("m.jsonl", good + b'{"a": 1000\n' + good)
    ds = IterableDataset.from_files(root + "m.jsonl", shuffle=False)
    ds._text_block = 4_096
    with pytest.raises(ValueError, match=r"read jsonl .*m\.jsonl: in the rows from byte \d+ "
                                         r"\(line \d+ is their row 0\): JSON parse error"):
        list(ds)
    # An unbalanced quote swallowed the rows after it into one field; pandas refuses it too.
    store.put("u.csv", b'id,text\n1,a\n2,"oops\n3,c\n')
    with pytest.raises(ValueError, match=r"u\.csv: the object ends inside a quoted field "
                                         r"\(an unbalanced quote in the rows from byte 12, line 3\)"):
        list(IterableDataset.from_files(root + "u.csv", shuffle=False))
    with pytest.raises(pd.errors.ParserError):
        pd.read_csv(io.BytesIO(b'id,text\n1,a\n2,"oops\n3,c\n'))


def test_gzip_csv_and_jsonl_stream_inflated(root):
    import gzip
    df = _frame(3_000, columns=2)
    store = wharf.Store(root)
    store.put("z/t.csv.gz", gzip.compress(df.to_csv(index=False).encode()))
    store.put("z/t.jsonl.gz", gzip.compress(df.to_json(orient="records", lines=True).encode()))
    for key in ("z/t.csv.gz", "z/t.jsonl.gz"):
        ds = IterableDataset.from_files(root + key, batch_rows=1_000, shuffle=False)
        ds._text_block = 4_096
        got = pa.Table.from_batches(list(ds)).to_pandas()
        pd.testing.assert_frame_equal(got, df, check_dtype=False)
    store.put("z/bad.csv.gz", gzip.compress(b"a,b\n1,2\n" * 1000)[:-20])  # truncated
    with pytest.raises(ValueError, match="bad.csv.gz: corrupt or truncated gzip"):
        list(IterableDataset.from_files(root + "z/bad.csv.gz"))


def test_corrupt_parquet_and_avro_name_the_file_and_where(root):
    # pyarrow's and fastavro's decoders raised their own errors (OSError "Corrupt snappy
    # compressed data.", zlib.error) without the file; they name it now, as the CSV errors do.
    store = wharf.Store(root)
    buf = io.BytesIO()  # snappy pages (Parquet pages carry no checksum unless asked to)
    pq.write_table(pa.table({"a": range(4_000), "s": [f"x{i}" for i in range(4_000)]}), buf,
                   row_group_size=1_000, compression="snappy")
    data = bytearray(buf.getvalue())
    data[200:260] = b"\xff" * 60  # inside the first row group's compressed pages
    store.put("bad.parquet", bytes(data))
    with pytest.raises(ValueError, match=r"read parquet .*bad\.parquet: row group 0: corrupt"):
        list(IterableDataset.from_files(root + "bad.parquet", shuffle=False))
    schema = {"type": "record", "name": "r",
              "fields": [{"name": "a", "type": "long"}, {"name": "s", "type": "string"}]}
    buf = io.BytesIO()
    fastavro.writer(buf, schema, [{"a": i, "s": "y" * 50} for i in range(20_000)],
                    codec="deflate", sync_interval=16_000)
    avro = bytearray(buf.getvalue())
    avro[len(avro) // 2] ^= 0xFF
    store.put("bad.avro", bytes(avro))
    with pytest.raises(ValueError, match=r"bad\.avro: corrupt Avro block at byte \d+"):
        list(IterableDataset.from_files(root + "bad.avro", shuffle=False))


def test_jsonl_fields_that_appear_in_a_later_block_are_added(root):
    # A field first seen (or first not null) after the first block was an ArrowInvalid from
    # combining batches of two schemas; read_json of the whole file reads it. Later batches
    # carry it, and the earlier rows of a batch that spans it get nulls.
    lines = [json.dumps({"a": i, "pad": "p" * 40, "z": None}) for i in range(3_000)]
    lines.append(json.dumps({"a": 3_000, "pad": "x", "newf": 3, "z": 7}))
    body = ("\n".join(lines) + "\n").encode()
    wharf.Store(root).put("nf.jsonl", body)
    for batch_rows in (1_000, 10_000):
        ds = IterableDataset.from_files(root + "nf.jsonl", batch_rows=batch_rows, shuffle=False)
        ds._text_block = 16_384
        batches = list(ds)
        got = pa.concat_tables([pa.Table.from_batches([b]) for b in batches],
                               promote_options="default")
        want = pa.json.read_json(pa.BufferReader(body))
        assert got.num_rows == 3_001
        assert got.column("a").to_pylist() == want.column("a").to_pylist()
        assert got.column("newf").to_pylist() == want.column("newf").to_pylist()
        assert got.column("z").to_pylist() == want.column("z").to_pylist()
        assert "newf" in batches[-1].schema.names


def test_parquet_in_a_fresh_process_and_an_iterator_left_open_at_exit(root):
    # A fresh process that never imported pyarrow.parquet itself (`import pyarrow` does not
    # load it: from_files raised AttributeError), and an iterator it leaves open, which its
    # teardown closes after the modules the read-ahead pool's shutdown needs are gone.
    import os
    import pathlib
    import subprocess
    import sys
    _put_parquet(root, "open.parquet", _frame(5_000, columns=2), 1_000)
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(wharf.__file__).parent.parent))
    script = ("from wharf.torch import IterableDataset\n"
              f"it = iter(IterableDataset.from_files({root + 'open.parquet'!r}, batch_rows=100))\n"
              "next(it)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
