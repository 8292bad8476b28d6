#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets into corpus/<target>/ (run once; the seeds are
committed). Small valid inputs of each format, in the variants the parsers handle."""
import gzip
import io
import pathlib
import struct
import tarfile
import zlib

ROOT = pathlib.Path(__file__).resolve().parent / "corpus"


def write(target, name, data):
    d = ROOT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def tar_bytes(fmt, members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(records):
    out = b""
    for r in records:
        length = struct.pack("<Q", len(r))
        out += length + struct.pack("<I", masked(crc32c(length)))
        out += r + struct.pack("<I", masked(crc32c(r)))
    return out


samples = [("s001.jpg", b"\xff\xd8jpeg"), ("s001.cls", b"3"), ("s002.jpg", b"\xff\xd8"),
           ("s002.seg.png", b"\x89PNG"), ("dir/", None), ("README", b"skipped")]
write("fuzz_tar", "ustar.tar", tar_bytes(tarfile.USTAR_FORMAT, samples))
write("fuzz_tar", "gnu-longname.tar",
      tar_bytes(tarfile.GNU_FORMAT, [("d/" + "x" * 120 + ".txt", b"long"), ("a.b", b"")]))
write("fuzz_tar", "pax.tar",
      tar_bytes(tarfile.PAX_FORMAT, [("é/ünï.txt", b"pax path"), ("y" * 150 + ".bin", b"1")]))
write("fuzz_tar", "empty.tar", tar_bytes(tarfile.USTAR_FORMAT, []))
# webdataset's corners: extension case, dot members, metadata members; and a .tar.gz (each
# input is also read as a gzip stream).
wds_names = [("d/s1.JPG", b"u"), ("d/s1.jpg", b"dup"), ("d/.hidden.TXT", b"h"),
             ("__meta__/x.json", b"{}"), ("./s2.__key__", b"k")]
write("fuzz_tar", "webdataset-names.tar", tar_bytes(tarfile.USTAR_FORMAT, wds_names))
write("fuzz_tar", "ustar.tar.gz", gzip.compress(tar_bytes(tarfile.USTAR_FORMAT, samples), mtime=0))

write("fuzz_tfrecord", "three.tfrecord", tfrecord([b"first", b"", b"x" * 300]))
write("fuzz_tfrecord", "one.tfrecord", tfrecord([b"\x0a\x03abc"]))
write("fuzz_tfrecord", "truncated.tfrecord", tfrecord([b"whole", b"cut short"])[:-6])
# Each input is also read as GZIP and as ZLIB (tf.data's compression_type).
write("fuzz_tfrecord", "three.tfrecord.gz", gzip.compress(tfrecord([b"first", b"", b"x" * 300]), mtime=0))
write("fuzz_tfrecord", "three.tfrecord.zlib", zlib.compress(tfrecord([b"first", b"", b"x" * 300])))

# fuzz_lines: the first byte picks the options (bit 0 CSV, 1 header, 2 skip empty rows,
# 3-4 delimiter , ; \t |, 5 quote ').
write("fuzz_lines", "jsonl", b"\x00" + b'{"a": 1}\n{"a": 2, "s": "x\\ny"}\n\n{"last": true}')
write("fuzz_lines", "csv-header", b"\x03" + b'id,text\r\n1,"quoted, with comma"\r\n2,"two\nlines"\n3,""""\n')
write("fuzz_lines", "tsv-skip-empty", b"\x0d" + b"a\tb\n\n1\t2\n")
write("fuzz_lines", "csv-single-quote", b"\x21" + b"'x,y',z\n'unterminated\n")

# fuzz_s3_xml: the first byte picks the operations (bits: list, list all, get, delete many,
# copy, list buckets, multipart); then the responses, "\n--\n" apart, each a status letter
# (A 200, B 204, ..., G 404, K 500, L 503) and a body.
LIST = ("A<?xml version=\"1.0\"?><ListBucketResult><EncodingType>url</EncodingType>"
        "<Contents><Key>p%2Fa%20b</Key><Size>3</Size><ETag>&quot;abc&quot;</ETag>"
        "<LastModified>2026-11-24T10:00:00.000Z</LastModified></Contents>"
        "<CommonPrefixes><Prefix>p/d/</Prefix></CommonPrefixes><IsTruncated>true</IsTruncated>"
        "<NextContinuationToken> </NextContinuationToken></ListBucketResult>")
LAST = ("A<ListBucketResult><Contents><Key>p/z</Key><Size>x</Size></Contents>"
        "<IsTruncated>false</IsTruncated></ListBucketResult>")
ERROR = "G<Error><Code>NoSuchKey</Code><Message>gone</Message><RequestId>r-1</RequestId></Error>"
SLOW = "L<Error><Code>SlowDown</Code><Message>later</Message></Error>"
DELETED = ("A<DeleteResult><Deleted><Key>a</Key></Deleted><Error><Key>b</Key>"
           "<Code>AccessDenied</Code><Message>no</Message></Error><Error><Key>c</Key>"
           "<Code>NoSuchKey</Code></Error></DeleteResult>")
COPIED = "A<CopyObjectResult><ETag>&quot;e1&quot;</ETag></CopyObjectResult>\n--\nA"
COPY_FAILED = "A<Error><Code>InternalError</Code><Message>copy failed</Message></Error>"
BUCKETS = ("A<ListAllMyBucketsResult><Buckets><Bucket><Name>b1</Name>"
           "<CreationDate>2026-01-01T00:00:00.000Z</CreationDate></Bucket><Bucket><Name>b2"
           "</Name></Bucket></Buckets><ContinuationToken>c</ContinuationToken>"
           "</ListAllMyBucketsResult>\n--\nA<ListAllMyBucketsResult/>")
MULTIPART = "\n--\n".join([
    "K",  # the create fails once: the retried one sweeps leftover uploads
    "A<InitiateMultipartUploadResult><UploadId>u1</UploadId></InitiateMultipartUploadResult>",
    "A<ListMultipartUploadsResult><EncodingType>url</EncodingType><Upload><Key>big</Key>"
    "<UploadId>u0</UploadId><Initiated>2026-11-24T10:00:00.000Z</Initiated></Upload>"
    "<IsTruncated>true</IsTruncated><NextKeyMarker>big</NextKeyMarker>"
    "<NextUploadIdMarker>u0</NextUploadIdMarker></ListMultipartUploadsResult>",
    "B", "A<ListMultipartUploadsResult/>", "A", "A",
    "A<CompleteMultipartUploadResult><ETag>&quot;x-2&quot;</ETag></CompleteMultipartUploadResult>",
])


def s3(name, ops, *responses):
    write("fuzz_s3_xml", name, bytes([ops]) + "\n--\n".join(responses).encode())


s3("list", 0x01, LIST)
s3("list-all", 0x02, LIST, LAST)
s3("get-error", 0x04, ERROR)
s3("get-retried", 0x04, SLOW, "Apayload")
s3("delete-many", 0x08, DELETED)
s3("copy", 0x10, COPIED)
s3("copy-error-in-200", 0x10, COPY_FAILED)
s3("list-buckets", 0x20, BUCKETS)
s3("multipart", 0x40, MULTIPART)
s3("all", 0x3F, LIST, LIST, LAST, ERROR, DELETED, COPIED, BUCKETS)


def safetensors(tensors, metadata=None):
    """A safetensors file of (name, dtype, shape, element bytes) laid out back to back."""
    import json
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, width in tensors:
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + n * width]}
        data += bytes(range(256)) * (n * width // 256) + bytes(n * width % 256)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


write("fuzz_safetensors", "mixed.safetensors",
      safetensors([("w", "F32", [4, 3], 4), ("b", "BF16", [3], 2), ("e", "I64", [0], 8),
                   ("s", "U8", [], 1)], {"format": "pt"}))
write("fuzz_safetensors", "empty-header.safetensors", safetensors([]))
write("fuzz_safetensors", "index.json",
      b'{"metadata":{"total_size":24},"weight_map":{"a":"model-00001-of-00002.safetensors",'
      b'"b":"sub/model-00002-of-00002.safetensors"}}')
