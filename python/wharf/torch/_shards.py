"""Random access to the records inside tar and TFRecord shards (MapDataset.from_shards).

The shards are read once, in order, by the engine's record reader (the same grouping and
checks as RecordDataset: webdataset's for tar); that pass keeps only a record-offset index,
per record its shard and byte range [offset, end) (three integers, 24 bytes), plus the tar
sample's key. `ds[i]` then fetches record i's byte range with one ranged GET (a batch's ranges
together, in parallel and coalesced, through `_RangeReader`), pinned to the shard's ETag from
the listing, and decodes it: a TFRecord frame (length, data; a length that disagrees with the
range is an error naming the shard and offset), or the tar members of one sample
(`key.ext` -> bytes, extensions lower-cased as webdataset does). Compressed shards have no
random access and are refused.

The record index is built once per set of shards and kept as a file in the index cache (the
directory SampleIndex files go to: `index_cache=`, else the tier's `.wharf/index` when reading
through one, else $WHARF_INDEX_CACHE or ~/.cache/wharf/index; False keeps nothing). Its name is
a digest of the store spec, the URI, the format and every shard's key, size and ETag, so a
changed shard means a new index, never a stale one. The file: magic, a JSON header (the same
description, the record count), the columns, and a BLAKE2b digest of all that; one that does
not check out is rebuilt. Written as a 0600 temporary, synced, then renamed into place.
"""
import hashlib
import io
import json
import os
import struct
import sys
import tarfile
import tempfile
import warnings
from array import array
from typing import Any, Callable, Optional, Sequence, Union

import torch

from wharf import _wharf
from wharf.torch._args import _callable_or_none

_RANDOM_ACCESS = {"tar": (".tar",), "tfrecord": (".tfrecord", ".tfrecords")}


class _RecordIndex:
    """A ShardMapDataset's records as wharf.torch.DistributedSampler orders them."""

    def __init__(self, count: int, fingerprint: str):
        self._count, self.fingerprint = count, fingerprint

    def __len__(self) -> int:
        return self._count


class ShardMapDataset(torch.utils.data.Dataset):
    """Records of tar / TFRecord shards as a map-style dataset; see MapDataset.from_shards."""

    def __init__(self, uri: str, shards: Union[None, str, Sequence[str]] = None, *,
                 format: str = "tar", transform: Optional[Callable] = None,
                 list_workers: int = 16, index_cache=None, **store):
        if format not in _RANDOM_ACCESS:
            raise ValueError(f"MapDataset.from_shards: format {format!r}: random access is for "
                             f"{' and '.join(_RANDOM_ACCESS)} shards")
        uri = str(uri)
        s = _wharf.Store(uri, **store)
        if shards is None or isinstance(shards, str):
            listed = [o for o in s.list(shards or "", parallel=list_workers)]
            compressed = [o["key"] for o in listed if o["key"].endswith((".gz", ".tgz", ".zlib"))]
            listed = [o for o in listed if o["key"].endswith(_RANDOM_ACCESS[format])]
            if not listed and compressed:
                raise ValueError(f"MapDataset.from_shards: {uri}{compressed[0]} is compressed; "
                                 "records of compressed shards have no random access (read "
                                 "them with IterableDataset.from_shards)")
            if listed and compressed:
                warnings.warn(f"MapDataset.from_shards: {len(compressed)} compressed shard(s) "
                              f"below {uri} left out (the first: {uri}{compressed[0]}): "
                              "records of compressed shards have no random access (read "
                              "them with IterableDataset.from_shards)", stacklevel=3)
        else:
            listed = []
            for k in shards:
                if k.endswith((".gz", ".tgz", ".zlib")):
                    raise ValueError(f"MapDataset.from_shards: {uri}{k} is compressed; records "
                                     "of compressed shards have no random access")
                listed.append(dict(s.head(k), key=k))
        if not listed:
            raise ValueError(f"no {format} shards found at {uri}"
                             + (f" under {shards!r}" if isinstance(shards, str) else ""))
        self.uri, self.format = uri, format
        self.transform = _callable_or_none("transform", transform)
        self.shards = [(o["key"], o["size"], o["etag"]) for o in listed]
        self._ranges = _wharf._RangeReader(uri, **store)
        self._shard_of = array("I")
        self._begin = array("Q")
        self._end = array("Q")
        self._keys = []  # tar: each sample's key
        self.index_path = None  # the record index's file in the index cache, if any
        cache = _wharf.SampleIndex.cache_dir(uri, index_cache=index_cache, **store)
        index = _wharf.SampleIndex.from_keys(self.uri, [k for k, _, _ in self.shards], **store)
        # Each shard's URL as the engine spells it (a plain path becomes file://, a doubled
        # slash one): the record reader reports records by these, and samples carry them.
        self._urls = [index.url(n) for n in range(len(index))]
        if cache is None:
            self._build(index)
            return
        described = {"v": 1, "spec": index.spec, "uri": uri, "format": format,
                     "shards": [list(t) for t in self.shards]}
        digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()
        path = os.path.join(cache, f"r-{digest[:16]}-{digest[16:48]}.wrec")
        if not self._load(path, described):
            self._build(index)
            self._save(cache, path, described, digest[:16])
        self.index_path = path

    _MAGIC = b"WHARFREC"

    def _load(self, path: str, described: dict) -> bool:
        """The record index from `path` when it is there and checks out."""
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except FileNotFoundError:
            return False
        except OSError as e:
            print(f"wharf: MapDataset.from_shards: cannot read the record index {path}: {e}; "
                  "rebuilding it", file=sys.stderr)
            return False
        try:
            if blob[:8] != self._MAGIC or hashlib.blake2b(
                    blob[:-16], digest_size=16).digest() != blob[-16:]:
                raise ValueError("damaged (digest)")
            (hlen,) = struct.unpack_from("<Q", blob, 8)
            header = json.loads(blob[16:16 + hlen])
            if header["described"] != described:
                raise ValueError("describes other shards")
            n, pos = header["records"], 16 + hlen
            cols = []
            for code, count in (("I", n), ("Q", n), ("Q", n), ("Q", n + 1)):
                a = array(code)
                a.frombytes(blob[pos:pos + a.itemsize * count])
                if len(a) != count:
                    raise ValueError("truncated")
                cols.append(a)
                pos += a.itemsize * count
            shard_of, begin, end, key_offsets = cols
            keys = blob[pos:len(blob) - 16]
            if sys.byteorder != "little":
                for a in cols:
                    a.byteswap()
            if key_offsets[-1] != len(keys) or max(shard_of, default=0) >= len(self.shards):
                raise ValueError("inconsistent columns")
        except (ValueError, KeyError, TypeError, struct.error) as e:
            print(f"wharf: MapDataset.from_shards: the record index {path} is unusable ({e}); "
                  "rebuilding it", file=sys.stderr)
            return False
        self._shard_of, self._begin, self._end = shard_of, begin, end
        if self.format == "tar":
            self._keys = [keys[key_offsets[i]:key_offsets[i + 1]].decode()
                          for i in range(n)]
        try:
            os.utime(path)  # last use, for the cache's cleanup of files unused for a week
        except OSError:
            pass
        return True

    def _save(self, cache: str, path: str, described: dict, stem: str) -> None:
        """Publishes the record index; best effort (an unwritable cache only costs rebuilds)."""
        key_offsets, keys = array("Q", [0]), bytearray()
        for k in self._keys:
            keys += k.encode()
            key_offsets.append(len(keys))
        if not self._keys:
            key_offsets = array("Q", [0] * (len(self._begin) + 1))
        header = json.dumps({"described": described, "records": len(self._begin)}).encode()
        cols = [array("I", self._shard_of), array("Q", self._begin), array("Q", self._end),
                key_offsets]
        if sys.byteorder != "little":
            for a in cols:
                a.byteswap()
        body = b"".join([self._MAGIC, struct.pack("<Q", len(header)), header]
                        + [a.tobytes() for a in cols] + [bytes(keys)])
        tmp = None
        try:
            os.makedirs(cache, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=cache, prefix=f"r-{stem}-tmp")  # mode 0600
            with os.fdopen(fd, "wb") as f:
                f.write(body)
                f.write(hashlib.blake2b(body, digest_size=16).digest())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            print(f"wharf: MapDataset.from_shards: cannot keep the record index in {cache}: "
                  f"{e}", file=sys.stderr)
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def _build(self, index):
        stream = _wharf.RecordStream(index, self.format, shuffle=False)
        number = {url: n for n, url in enumerate(self._urls)}
        last = None  # the previous record's shard
        for rec in stream:
            if self.format == "tar":
                url, off = rec["__url__"], rec["__offset__"]
                self._keys.append(rec["__key__"])
            else:
                url, off, _ = rec
            n = number[url]
            if last == n:
                self._end[-1] = off  # a record ends where the next one of its shard starts
            elif last is not None:
                self._end[-1] = self.shards[last][1]
            self._shard_of.append(n)
            self._begin.append(off)
            self._end.append(0)
            last = n
        if last is not None:
            self._end[-1] = self.shards[last][1]

    def __len__(self) -> int:
        return len(self._begin)

    @property
    def fingerprint(self) -> str:
        """Names the records: the format, every shard's key, size and ETag, and the count. A
        sampler's state carries it, so a resume over other shards is refused."""
        h = hashlib.md5(self.format.encode())
        for key, size, etag in self.shards:
            h.update(f"\0{key}\0{size}\0{etag}".encode())
        h.update(f"\0{len(self)}".encode())
        return h.hexdigest()

    @property
    def index(self) -> "_RecordIndex":
        """What wharf.torch.DistributedSampler orders: the records (count and fingerprint)."""
        return _RecordIndex(len(self), self.fingerprint)

    def __getitem__(self, i: int) -> Any:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: Sequence[int]) -> list:
        from wharf.torch import Sample
        n = len(self)
        idx = []
        for i in indices:
            j = int(i) + n if int(i) < 0 else int(i)
            if not 0 <= j < n:
                raise IndexError(f"record {i} of a dataset of {n} records")
            idx.append(j)
        ranges = []
        for j in idx:
            key, _, etag = self.shards[self._shard_of[j]]
            ranges.append((key, self._begin[j], self._end[j] - self._begin[j], etag or None))
        out = []
        for j, data in zip(idx, self._ranges.read(ranges)):
            shard = self.shards[self._shard_of[j]][0]
            if self.format == "tfrecord":
                s = Sample(f"{shard}@{self._begin[j]}", self._tfrecord(shard, self._begin[j],
                                                                       data), index=j)
            else:
                s = Sample(self._keys[j], self._tar(shard, self._begin[j], self._keys[j], data),
                           index=j)
            s.url, s.offset = self._urls[self._shard_of[j]], self._begin[j]
            out.append(s if self.transform is None else self.transform(s))
        return out

    def _tfrecord(self, shard, offset, data):
        if len(data) < 16:
            raise ValueError(f"{self.uri}{shard} at byte {offset}: a TFRecord frame is at least "
                             f"16 bytes, {len(data)} here (the shard changed?)")
        length = int.from_bytes(data[:8], "little")
        if 12 + length + 4 != len(data):
            raise ValueError(f"{self.uri}{shard} at byte {offset}: the record's length "
                             f"({length}) disagrees with its index entry ({len(data)} bytes); "
                             "corrupt shard")
        if not _wharf.tfrecord_crc_ok(data):  # as the streamed reader checks every record
            raise ValueError(f"{self.uri}{shard} at byte {offset}: CRC mismatch ({length}-byte "
                             "record): corrupt shard")
        return data[12:12 + length]

    def _tar(self, shard, offset, key, data):
        fields = {}
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as t:
                for m in t:
                    if not m.isfile():
                        continue
                    name = m.name
                    if not (name.startswith(key) and name[len(key):len(key) + 1] == "."):
                        continue  # not this sample's member (skipped by the reader too)
                    fields[name[len(key) + 1:].lower()] = t.extractfile(m).read()
        except tarfile.TarError as e:
            raise ValueError(f"{self.uri}{shard} at byte {offset}: sample {key!r}: {e} "
                             "(corrupt or changed shard)") from None
        if not fields:
            raise ValueError(f"{self.uri}{shard} at byte {offset}: sample {key!r} has no "
                             "members here (the shard changed?)")
        return fields

    def __getstate__(self):
        return self.__dict__.copy()  # the index (arrays) and the range reader pickle
