"""Row files read in portions: Parquet by row groups, Avro by blocks, CSV and JSON lines by
file, each yielded as pyarrow.RecordBatch of up to `batch_rows` rows (docs/design/rows.md).

A data set of row files is a list of *units*, the pieces one reader takes whole:
 - Parquet: one row group of one file. Only the requested columns' column chunks are read,
   by parallel ranged GETs with neighbours coalesced (wharf's ReadRanges), and decoded by
   pyarrow from those bytes; the footer is read once per file.
 - Avro: a byte split of one file (`split_bytes`, default 64 MiB): the blocks that start in
   it, found by the file's sync marker as Hadoop's and Spark's Avro splits are, decoded by
   fastavro block by block.
 - CSV / JSON lines: one file, parsed by pyarrow's streaming readers (quoting as RFC 4180;
   a quoted field may hold newlines, so a file is not split by bytes).
Units are ordered per epoch by wharf's Sampler (a permutation from seed and epoch, the same
for any world size), dealt round-robin to ranks and then to the rank's DataLoader workers,
as RecordDataset deals shards. Batches never span units. Memory: one unit's decoded batches
at a time (a row group's chosen columns, an Avro block, a CSV block), never a whole file.

Resume is exact: a state holds how many of the share's units are done and how many rows of
the current one were yielded; load_state_dict() then iteration yields exactly the batches
that were not yet yielded (same boundaries). As for RecordDataset, positions live where the
rows are read: with num_workers=0 call state_dict() on the dataset, with DataLoader workers
use torchdata's StatefulDataLoader.
"""
import gzip
import io
import json
import os
import sys
import zlib
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import torch

from wharf import _profile, _wharf
from wharf._file import open as _open_object
from wharf.torch import _Distributed, _ShardEpochs
from wharf.torch._args import _callable_or_none, _check_int, _check_state

FORMATS = {"parquet": (".parquet", ".parq"), "avro": (".avro",),
           "csv": (".csv", ".csv.gz"),
           "jsonl": (".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz", ".ndjson.gz")}
_AVRO_MAGIC = b"Obj\x01"
_SYNC = 16


def _pa():
    try:
        import pyarrow
    except ImportError as e:  # pragma: no cover - the tests install it
        raise ImportError("IterableDataset.from_files needs pyarrow (pip install pyarrow)") from e
    return pyarrow


def _pq():
    """pyarrow.parquet (a submodule that `import pyarrow` does not load)."""
    _pa()
    import pyarrow.parquet
    return pyarrow.parquet


# ---------------------------------------------------------------------------------------------
# Parquet
class _Sparse(io.RawIOBase):
    """The bytes of a Parquet file that were fetched (column chunks, footer) as a seekable
    file: pyarrow reads only those; any other read is a bug, reported, never zeros."""

    def __init__(self, name, size, pieces):
        self._name, self._size, self._pos = name, size, 0
        self._pieces = sorted(pieces)  # (offset, bytes)

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def readinto(self, b):
        n = min(len(b), max(0, self._size - self._pos))
        done, view = 0, memoryview(b).cast("B")
        for off, data in self._pieces:  # sorted; a read may span neighbouring pieces
            at = self._pos + done
            if done == n:
                break
            if off <= at < off + len(data):
                take = min(n - done, off + len(data) - at)
                view[done:done + take] = memoryview(data)[at - off:at - off + take]
                done += take
        if done < n:
            at = self._pos + done
            raise OSError(f"reading {self._name}: bytes [{at}, {self._pos + n}) were not "
                          "fetched (a column chunk outside the row group's metadata)")
        self._pos += n
        return n


class _ParquetFile:
    """One Parquet file's footer (metadata) and the reads of its row groups' column chunks."""

    def __init__(self, ranges, key, uri, size, etag, footer):
        pq = _pq()
        self.key, self.uri, self.size, self.etag = key, uri, size, etag
        self._footer = footer  # (offset, bytes): the footer and its length, the file's end
        self._ranges = ranges
        self.metadata = pq.ParquetFile(_Sparse(uri, size, [footer]), pre_buffer=False).metadata

    @classmethod
    def open(cls, ranges, key, uri, size, etag):
        # The last 64 KiB hold most footers; a bigger one costs one more GET.
        tail = min(size, 64 << 10)
        (data,) = ranges.read([(key, size - tail, tail, etag or None)])
        if size < 12 or data[-4:] != b"PAR1":
            raise ValueError(f"{uri}: not a Parquet file (no PAR1 at its end)")
        flen = int.from_bytes(data[-8:-4], "little")
        if flen + 8 > size:
            raise ValueError(f"{uri}: corrupt Parquet footer (length {flen} in a {size}-byte "
                             "file)")
        if flen + 8 > tail:
            (data,) = ranges.read([(key, size - flen - 8, flen + 8, etag or None)])
            tail = flen + 8
        return cls(ranges, key, uri, size, etag, (size - tail, data))

    def column_indices(self, columns):
        schema = self.metadata.schema
        if columns is None:
            return None
        tops = {schema.column(i).path.split(".")[0] for i in range(len(schema))}
        missing = [c for c in columns if c not in tops]
        if missing:
            raise ValueError(f"{self.uri}: no column {missing[0]!r} (columns: {sorted(tops)})")
        return [i for i in range(len(schema)) if schema.column(i).path.split(".")[0] in columns]

    def fetch(self, rg, columns, coalesce_gap):
        """The bytes of the row group's chosen column chunks, [(offset, bytes)], fetched in
        one ReadRanges call (parallel ranged GETs, neighbours coalesced). Releases the GIL
        while it waits, so it runs well on a read-ahead thread."""
        meta = self.metadata.row_group(rg)
        wanted = self.column_indices(columns)
        spans = []
        for j in (range(meta.num_columns) if wanted is None else wanted):
            col = meta.column(j)
            start = col.data_page_offset
            if col.has_dictionary_page and col.dictionary_page_offset is not None:
                start = min(start, col.dictionary_page_offset)
            spans.append((start, col.total_compressed_size))
        data = self._ranges.read([(self.key, off, n, self.etag or None) for off, n in spans],
                                 coalesce_gap=coalesce_gap) if spans else []
        return list(zip((o for o, _ in spans), data))

    def decode(self, rg, columns, pieces):
        """The row group's chosen columns as a pyarrow Table, from fetch()'s bytes."""
        pq, pa = _pq(), _pa()
        # Read and decoded on this thread alone (the read-ahead threads decode row groups in
        # parallel): with pre_buffer or use_threads, pyarrow's I/O and CPU pools hold the
        # Python-owned bytes _Sparse returns and drop the last reference on their own threads,
        # after this call has returned; a pool thread that takes the GIL for that while the
        # interpreter exits aborts the process ("terminate called without an active exception").
        f = pq.ParquetFile(_Sparse(self.uri, self.size, [self._footer] + pieces),
                           metadata=self.metadata, pre_buffer=False)
        try:
            return f.read_row_group(rg, columns=None if columns is None else list(columns),
                                    use_threads=False)
        except (OSError, pa.ArrowException) as e:  # pyarrow's decoders: corrupt pages
            raise ValueError(f"read parquet {self.uri}: row group {rg}: corrupt data "
                             f"({e})") from None


# ---------------------------------------------------------------------------------------------
# Avro
def _varint(buf, pos):
    """A zigzag varint (Avro's long) at buf[pos:]: (value, next position)."""
    shift = value = 0
    while True:
        if pos >= len(buf):
            raise EOFError
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _avro_header(f, uri):
    """(header bytes, sync marker, schema JSON, codec) of the Avro file open in `f`."""
    buf = f.read(64 << 10)
    while True:
        try:
            if buf[:4] != _AVRO_MAGIC:
                raise ValueError(f"{uri}: not an Avro object container file (magic {buf[:4]!r})")
            pos, meta = 4, {}
            while True:
                count, pos = _varint(buf, pos)
                if count == 0:
                    break
                if count < 0:
                    count = -count
                    _, pos = _varint(buf, pos)  # the block's byte size
                for _ in range(count):
                    n, pos = _varint(buf, pos)
                    k = bytes(buf[pos:pos + n]).decode()
                    pos += n
                    n, pos = _varint(buf, pos)
                    meta[k] = bytes(buf[pos:pos + n])
                    pos += n
            if pos + _SYNC > len(buf):
                raise EOFError
            end = pos + _SYNC
            codec = meta.get("avro.codec", b"null").decode()
            return bytes(buf[:end]), bytes(buf[pos:end]), meta["avro.schema"].decode(), codec
        except EOFError:
            more = f.read(len(buf))
            if not more:
                raise ValueError(f"{uri}: truncated Avro header") from None
            buf += more


def _avro_blocks(f, uri, size, header_len, sync, begin, end):
    """The raw blocks (offset in the file, bytes including their header and sync) that start
    in [begin, end) of the file open in `f`."""
    # A block starts right after the header or right after a sync marker.
    if begin <= header_len:
        pos = header_len
    else:
        f.seek(begin - _SYNC)
        window, base = b"", begin - _SYNC
        while True:
            chunk = f.read(1 << 20)
            window += chunk
            i = window.find(sync)
            if i >= 0:
                pos = base + i + _SYNC
                break
            if not chunk:
                return
            window, base = window[-(_SYNC - 1):], base + len(window) - (_SYNC - 1)
    while pos < end and pos < size:
        f.seek(pos)
        head = f.read(20)
        try:
            count, p = _varint(head, 0)
            nbytes, p = _varint(head, p)
        except (EOFError, ValueError):
            raise ValueError(f"{uri}: corrupt Avro block header at byte {pos}") from None
        total = p + nbytes + _SYNC
        if count < 0 or nbytes < 0 or pos + total > size:
            raise ValueError(f"{uri}: corrupt Avro block at byte {pos} ({count} records, "
                             f"{nbytes} bytes)")
        f.seek(pos)
        block = f.read(total)
        if block[-_SYNC:] != sync:
            raise ValueError(f"{uri}: Avro block at byte {pos} does not end in the file's sync "
                             "marker (corrupt file)")
        yield pos, block
        pos += total


_AVRO_PRIMITIVE = {"null": "null", "boolean": "bool_", "int": "int32", "long": "int64",
                   "float": "float32", "double": "float64", "bytes": "binary", "string": "string"}


def _arrow_type(schema):
    """The Arrow type of an Avro schema, or None where inference is left to pyarrow."""
    pa = _pa()
    if isinstance(schema, str):
        name = _AVRO_PRIMITIVE.get(schema)
        return getattr(pa, name)() if name else None
    if isinstance(schema, list):
        inner = [s for s in schema if s != "null"]
        return _arrow_type(inner[0]) if len(inner) == 1 else None
    t = schema.get("type")
    logical = schema.get("logicalType")
    if logical == "timestamp-millis":
        return pa.timestamp("ms", tz="UTC")
    if logical == "timestamp-micros":
        return pa.timestamp("us", tz="UTC")
    if t == "record":
        fields = []
        for f in schema["fields"]:
            ft = _arrow_type(f["type"])
            if ft is None:
                return None
            fields.append(pa.field(f["name"], ft))
        return pa.struct(fields)
    if t == "array":
        it = _arrow_type(schema["items"])
        return None if it is None else pa.list_(it)
    if t == "map":
        vt = _arrow_type(schema["values"])
        return None if vt is None else pa.map_(pa.string(), vt)
    if t == "enum":
        return pa.string()
    if t == "fixed":
        return pa.binary(schema["size"])
    return _arrow_type(t) if isinstance(t, (str, list)) else None


# ---------------------------------------------------------------------------------------------
class RowDataset(_ShardEpochs, _Distributed, torch.utils.data.IterableDataset):
    """pyarrow.RecordBatch row batches of Parquet, Avro, CSV or JSON-lines files; made by
    wharf.torch.IterableDataset.from_files (see there and the module docstring)."""

    def __init__(self, uri: str, files: Union[None, str, Sequence[str]] = None, *,
                 format: Optional[str] = None, batch_rows: int = 65536,
                 columns: Optional[Sequence[str]] = None, shuffle: bool = True, seed: int = 0,
                 transform: Optional[Callable] = None, split_bytes: Union[int, str] = "64M",
                 coalesce_gap: Union[int, str] = "256K", csv_options: Optional[dict] = None,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 list_workers: int = 16, **store):
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be >= 1, not {batch_rows}")
        uri = str(uri)
        self._store_options = store
        # One object, a prefix, or keys below a prefix.
        listed, from_listing = None, False
        if files is None and not uri.endswith("/"):
            try:
                head = _wharf.Store(uri, **store).head("")
                cut = uri.rfind("/") + 1
                listed = [(uri[cut:], head["size"], head["etag"])]
                uri = uri[:cut]
            except _wharf.NotFoundError:
                listed = None
        store_ = _wharf.Store(uri, **store)
        if listed is None:
            if files is None or isinstance(files, str):
                from_listing = True
                listed = [(o["key"], o["size"], o["etag"])
                          for o in store_.list(files or "", parallel=list_workers)]
            else:
                listed = []
                for k in files:
                    h = store_.head(k)
                    listed.append((k, h["size"], h["etag"]))
        if format is None:
            found = {f for k, _, _ in listed for f, sfx in FORMATS.items() if k.endswith(sfx)}
            if len(found) != 1:
                raise ValueError("from_files: pass format= (one of "
                                 f"{sorted(FORMATS)}): the names say "
                                 f"{sorted(found) if found else 'none of them'}")
            format = found.pop()
        if format not in FORMATS:
            raise ValueError(f"format {format!r}: expected one of {sorted(FORMATS)}")
        if from_listing:  # the format's files only
            listed = [f for f in listed if f[0].endswith(FORMATS[format])]
        if not listed:
            raise ValueError(f"no {format} files found at {uri}"
                             + (f" under {files!r}" if isinstance(files, str) else ""))
        self.uri, self.format = uri, format
        self.files = listed  # (key relative to uri, size, etag)
        self.batch_rows = int(batch_rows)
        self.columns = None if columns is None else list(columns)
        _check_int("seed", seed, 0)
        self.shuffle, self.seed = shuffle, int(seed)
        self.transform = _callable_or_none("transform", transform)
        self.split_bytes = _wharf.parse_size(split_bytes)
        self.coalesce_gap = _wharf.parse_size(coalesce_gap)
        self.csv_options = dict(csv_options or {})
        self._init_dist(rank, world_size)  # None: resolved when iterating
        self._ranges = _wharf._RangeReader(uri, **store)
        self._parquet = {}  # file index -> _ParquetFile (its footer read once per process)
        self._text_block = 4 << 20  # CSV / JSON lines: bytes parsed at once
        self._units = self._make_units()
        self._epoch = 0
        self._init_epoch_sync()
        self._order = _wharf.current_order  # the unit order's version, part of a state
        self._resume = None      # a share state to continue at the next __iter__
        self._live = None        # (pid, the position dict the current __iter__ updates)

    # ---- units ----
    def _make_units(self):
        units = []
        if self.format == "parquet":
            for i in range(len(self.files)):
                pf = self._parquet_file(i)
                pf.column_indices(self.columns)  # an unknown column fails now, not in a worker
                units += [(i, rg, 0) for rg in range(pf.metadata.num_row_groups)]
        elif self.format == "avro":
            for i, (_, size, _) in enumerate(self.files):
                units += [(i, off, min(size, off + self.split_bytes))
                          for off in range(0, max(size, 1), self.split_bytes)]
        else:
            units = [(i, 0, 0) for i in range(len(self.files))]
        return units

    def _parquet_file(self, i):
        pf = self._parquet.get(i)
        if pf is None:
            key, size, etag = self.files[i]
            pf = self._parquet[i] = _ParquetFile.open(self._ranges, key, self.uri + key, size,
                                                      etag)
        return pf

    def _share(self, worker, num_workers):
        """This (rank, worker)'s units of the epoch, in order."""
        rank, world = self._dist()
        order = _wharf.Sampler(len(self._units), seed=self.seed, shuffle=self.shuffle,
                               order=self._order).permutation(self._epoch)
        mine = order[rank::world][worker::num_workers]
        return [self._units[u] for u in mine], (rank, world)

    # ---- resume ----
    def _identity(self) -> dict:
        return {"format": self.format, "files": [[k, e] for k, _, e in self.files],
                "units": len(self._units), "seed": self.seed, "shuffle": self.shuffle,
                "batch_rows": self.batch_rows, "columns": self.columns, "order": self._order}

    def state_dict(self) -> dict:
        """{identity..., "epoch", "share"}: "share" is where the share read in this process
        stands ({"rank", "world_size", "worker", "num_workers", "units_done", "rows"}), or
        None at the start of the epoch."""
        share = None
        if self._live is not None and self._live[0] == os.getpid():
            share = dict(self._live[1])
        elif self._resume is not None:
            share = self._resume
        return dict(self._identity(), epoch=self._epoch, share=share)

    def load_state_dict(self, state: dict) -> None:
        _check_state(state)
        mine = self._identity()
        theirs = {k: state.get(k) for k in mine}
        if json.loads(json.dumps(theirs)) != json.loads(json.dumps(mine)):
            diff = sorted(k for k in mine if json.dumps(mine[k]) != json.dumps(theirs[k]))
            raise ValueError(f"row dataset state does not match this dataset (differs in "
                             f"{', '.join(diff)})")
        self._epoch = int(state["epoch"])
        self._resume = state.get("share")
        self._live = None
        self._publish_epoch(restored=True)

    # ---- reading ----
    def __iter__(self) -> Iterator[Any]:
        from wharf.torch import _worker_info
        if (failed := self._follow_epoch()) is not None:
            return failed
        worker, num_workers = _worker_info()
        units, (rank, world) = self._share(worker, num_workers)
        pos = {"rank": rank, "world_size": world, "worker": worker,
               "num_workers": num_workers, "units_done": 0, "rows": 0}
        if self._resume is not None:
            want = {k: self._resume.get(k) for k in ("rank", "world_size", "worker",
                                                     "num_workers")}
            have = {k: pos[k] for k in want}
            if want != have:
                raise ValueError(f"row dataset state is for share {want}, this iterator reads "
                                 f"{have}")
            pos["units_done"] = int(self._resume["units_done"])
            pos["rows"] = int(self._resume["rows"])
        self._resume = None
        self._live = (os.getpid(), pos)
        it = self._batches(units, pos)
        if _profile.state.on:
            return _profile.consumer(it)
        return it

    def _batches(self, units, pos):
        transform = self.transform
        ahead = _UnitReadAhead(self, units, pos["units_done"]) if self.format == "parquet" \
            else None
        try:
            while pos["units_done"] < len(units):
                yield from self._unit_rows(units, pos, ahead, transform)
        finally:
            if ahead is not None:
                ahead.close()

    def _unit_rows(self, units, pos, ahead, transform):
        skip = pos["rows"]
        fetched = ahead.take(pos["units_done"]) if ahead is not None else None
        for batch in self._unit_batches(units[pos["units_done"]], fetched):
            if skip >= batch.num_rows:
                skip -= batch.num_rows
                continue
            if skip:
                batch, skip = batch.slice(skip), 0
            pos["rows"] += batch.num_rows
            yield batch if transform is None else transform(batch)
        pos["units_done"] += 1
        pos["rows"] = 0

    def _fetch_unit(self, unit):
        """A Parquet unit's rows as a pyarrow Table: its column chunks fetched, then decoded.
        Read-ahead threads call this, so row groups also decode in parallel (pyarrow releases
        the GIL while it decodes), as pyarrow's own readers decode them."""
        i, rg, _ = unit
        pf = self._parquet_file(i)
        return pf.decode(rg, self.columns, pf.fetch(rg, self.columns, self.coalesce_gap))

    def _unit_batches(self, unit, fetched=None):
        """The unit's rows as batches of batch_rows (the last one shorter)."""
        pa = _pa()
        pending, count = [], 0
        for b in self._unit_pieces(unit, fetched):
            while b.num_rows:
                take = min(b.num_rows, self.batch_rows - count)
                pending.append(b.slice(0, take))
                count += take
                b = b.slice(take)
                if count == self.batch_rows:
                    yield _combine(pa, pending)
                    pending, count = [], 0
        if count:
            yield _combine(pa, pending)

    def _unit_pieces(self, unit, fetched=None):
        i, a, b = unit
        key, size, etag = self.files[i]
        uri = self.uri + key
        if self.format == "parquet":
            table = fetched if fetched is not None else self._fetch_unit(unit)
            yield from table.to_batches(max_chunksize=self.batch_rows)
        elif self.format == "avro":
            yield from self._avro_pieces(uri, size, a, b)
        else:
            yield from self._text_pieces(uri)

    def _avro_pieces(self, uri, size, begin, end):
        import fastavro
        pa = _pa()
        with _open_object(uri, **self._store_options) as f:
            header, sync, schema_json, _ = _avro_header(f, uri)
            schema = json.loads(schema_json)
            arrow = _arrow_type(schema)
            if self.columns is not None and arrow is not None:
                arrow = pa.struct([arrow.field(c) for c in self.columns])
            for pos, block in _avro_blocks(f, uri, size, len(header), sync, begin, end):
                try:
                    records = list(fastavro.reader(io.BytesIO(header + block)))
                except Exception as e:  # noqa: BLE001 - the codecs' and decoder's many types
                    raise ValueError(f"{uri}: corrupt Avro block at byte {pos} ({e!r})") from None
                if self.columns is not None:
                    records = [{c: r.get(c) for c in self.columns} for r in records]
                if arrow is not None:
                    yield pa.RecordBatch.from_struct_array(pa.array(records, type=arrow))
                else:
                    yield pa.RecordBatch.from_pylist(records)

    def _text_pieces(self, uri):
        """CSV / JSON lines in blocks of whole rows, each parsed by pyarrow from memory it
        owns. pyarrow's own streaming readers would call the wharf file object from their
        I/O threads, which then hold Python objects past the iteration (see _arrow_owned);
        parsing blocks keeps every Python call on this thread. The first block fixes the
        column names and types for the rest (as pyarrow's streaming readers do); JSON lines
        may add fields later (a field first seen, or first not null, in a later block)."""
        pa = _pa()
        csv = self.format == "csv"
        if csv:
            import pyarrow.csv as pcsv
            opts = dict(self.csv_options)
            read_kw = dict(opts.pop("read_options", {}))
            parse = pcsv.ParseOptions(**opts.pop("parse_options", {}))
            convert_kw = dict(opts.pop("convert_options", {}))
            if opts:
                raise ValueError(f"csv_options: unknown {sorted(opts)} (use read_options, "
                                 "parse_options, convert_options)")
            quote = parse.quote_char.encode() if parse.quote_char else None
        else:
            import pyarrow.json as pjson
            quote = None

        def parse_rows(rows, schema, names):
            """(table, the column names for later blocks) of a block of whole rows, typed as
            `schema` when given (the first block's)."""
            if csv:
                kw = dict(read_kw)
                if names:  # later blocks: no header, nothing to skip
                    kw = {k: v for k, v in read_kw.items() if k not in (
                        "skip_rows", "skip_rows_after_names", "autogenerate_column_names")}
                    kw["column_names"] = names
                convert = pcsv.ConvertOptions(**convert_kw)
                if schema is not None:
                    convert.column_types = schema
                if self.columns is not None:
                    convert.include_columns = self.columns
                # pyarrow's chunker cuts its chunks at newlines: a quoted field holding a
                # newline across a cut misparses, and a row longer than a chunk is refused.
                # The block is whole rows cut outside quotes, so where quotes are (or the
                # chunker refused a long row) it is parsed as one chunk, on one thread.
                whole = dict(kw, block_size=max(int(kw.get("block_size") or 0), len(rows) + 1))

                def read_with(options):
                    read = pcsv.ReadOptions(**options)
                    return read, pcsv.read_csv(pa.BufferReader(_arrow_owned(pa, rows)),
                                               read_options=read, parse_options=parse,
                                               convert_options=convert)

                try:
                    read, table = read_with(whole if quote and quote in rows else kw)
                except pa.ArrowInvalid as e:
                    if "straddl" not in str(e):
                        raise
                    read, table = read_with(whole)
                if names is None:
                    names = read.column_names or _csv_names(pcsv, rows, read_kw, parse)
                return table, names
            # Later blocks: the fields seen so far keep their types; a field that was null
            # until now, or is new, is inferred (and added, as read_json of the whole file
            # would add it: the rows before it lack it, and their batches lack the column).
            known = None if schema is None else pa.schema(
                [f for f in schema if not pa.types.is_null(f.type)])
            table = pjson.read_json(pa.BufferReader(_arrow_owned(pa, rows)), parse_options=(
                pjson.ParseOptions(explicit_schema=known) if known is not None else None))
            if self.columns is not None:
                table = table.select(self.columns)
            return table, names

        schema, names, carry, quotes = None, None, b"", 0
        offset, line = 0, 1  # where the next rows start in the (inflated) text, for errors
        with _open_object(uri, **self._store_options) as raw:
            # A gzip file (.csv.gz, .jsonl.gz) is inflated as it streams (zlib, bounded memory).
            f = gzip.GzipFile(fileobj=raw, mode="rb") if uri.endswith(".gz") else raw
            while True:
                try:
                    block = f.read(self._text_block)
                except (gzip.BadGzipFile, EOFError, zlib.error) as e:
                    raise ValueError(f"{uri}: corrupt or truncated gzip data ({e})") from None
                data = carry + block
                if not data:
                    return
                if block:
                    # The last row end outside quotes (RFC 4180: a newline is inside a quoted
                    # field exactly when an odd number of quote characters precede it).
                    cut = data.rfind(b"\n")
                    if quote and cut >= 0:
                        # Stepping back newline by newline, the quotes before each one are
                        # those before the last step less those between: linear in the block
                        # (a quoted field of many lines is not counted again for each).
                        before = quotes + data.count(quote, 0, cut)
                        while cut >= 0 and before % 2:
                            prev = data.rfind(b"\n", 0, cut)
                            before -= data.count(quote, max(prev, 0), cut)
                            cut = prev
                    if cut < 0:
                        carry = data  # one row longer than a block: read on
                        continue
                    rows, carry = data[:cut + 1], data[cut + 1:]
                else:
                    rows, carry = data, b""
                if quote:
                    quotes += rows.count(quote)
                    if not block and quotes % 2:
                        raise ValueError(
                            f"read {self.format} {uri}: the object ends inside a quoted field "
                            f"(an unbalanced quote in the rows from byte {offset}, line {line})")
                try:
                    table, names = parse_rows(rows, schema, names)
                except pa.ArrowInvalid as e:
                    # pyarrow counts rows from the block it was given: say where that is.
                    raise ValueError(f"read {self.format} {uri}: in the rows from byte {offset} "
                                     f"(line {line} is their row 0): {e}") from None
                if csv and schema is None and block and table.num_rows == 0:
                    # The first block held the header alone (the next row is longer than a
                    # block): its columns' types would be null; read on to a row.
                    carry, names = rows + carry, None
                    if quote:
                        quotes -= rows.count(quote)
                    continue
                offset += len(rows)
                line += rows.count(b"\n")
                if schema is None:
                    schema = table.schema
                elif not csv and table.schema != schema:
                    schema = pa.unify_schemas([schema, table.schema], promote_options="default")
                yield from table.to_batches()
                if not block:
                    return

    def __getstate__(self):
        state = self._snapshot_state()  # the main process's rank, for spawn workers
        state["_live"] = None
        state["_parquet"] = {}  # footers are read again where needed (pyarrow's metadata
        return state            # objects are not all picklable)


class _UnitReadAhead:
    """Fetches and decodes the next units (Parquet row groups' chosen column chunks) on
    threads while the current one is consumed: up to `depth` units ahead, which bounds what
    is held to that many row groups' chosen columns."""

    def __init__(self, ds, units, first, depth=4):
        import concurrent.futures
        self._ds, self._units, self._next, self._depth = ds, units, first, depth
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=depth, thread_name_prefix="wharf-rows")
        self._futures = {}
        self._top_up(first)

    def _top_up(self, current):
        while self._next < len(self._units) and self._next < current + 1 + self._depth:
            self._futures[self._next] = self._pool.submit(self._ds._fetch_unit,
                                                          self._units[self._next])
            self._next += 1

    def take(self, k):
        """Unit k's bytes (fetching errors raise here, for the unit that needs them)."""
        fut = self._futures.pop(k, None)
        self._top_up(k)
        return None if fut is None else fut.result()

    def close(self, _finalizing=sys.is_finalizing):  # bound now: globals are gone at exit
        for fut in self._futures.values():
            fut.cancel()
        self._futures.clear()
        if _finalizing():
            # An iterator left open is closed in the interpreter's teardown, after the modules
            # the pool's shutdown uses are gone; concurrent.futures joined its threads before.
            return
        self._pool.shutdown(wait=True, cancel_futures=True)


def _combine(pa, pieces):
    if len(pieces) == 1:
        return pieces[0]
    if any(p.schema != pieces[0].schema for p in pieces):
        # JSON lines whose later rows add a field (or give one that was null a type): the
        # earlier rows of the batch get nulls in it.
        table = pa.concat_tables([pa.Table.from_batches([p]) for p in pieces],
                                 promote_options="default")
    else:
        table = pa.Table.from_batches(pieces)
    return table.combine_chunks().to_batches()[0]


def _csv_names(pcsv, rows, read_kw, parse):
    """The column names of a CSV's first block (its header row, or pyarrow's generated names),
    for the blocks after it, which have no header. Parsed from the first row alone, with
    read_csv (open_csv's read-ahead thread would hold the block past this call)."""
    quote = parse.quote_char.encode() if parse.quote_char else None
    end = rows.find(b"\n")
    while end >= 0 and quote and rows.count(quote, 0, end) % 2:
        end = rows.find(b"\n", end + 1)
    head = rows if end < 0 else rows[:end + 1]
    skip = int(read_kw.get("skip_rows", 0))
    if skip:  # the header comes after the skipped rows: parse through it
        head = rows
    kw = {k: v for k, v in read_kw.items() if k != "skip_rows_after_names"}
    pa = _pa()
    return pcsv.read_csv(pa.BufferReader(_arrow_owned(pa, head)),
                         read_options=pcsv.ReadOptions(**kw), parse_options=parse).schema.names


def _arrow_owned(pa, data):
    """`data` copied into memory Arrow owns. pyarrow's parsers read ahead on their own I/O
    threads, which may drop their last slice of the input after the call returns; a slice of a
    Python bytes object then takes the GIL to release it, and one doing that while the
    interpreter exits aborts the process."""
    buf = pa.allocate_buffer(len(data))
    memoryview(buf).cast("B")[:] = data
    return buf
