"""wharf.torch.load of one torch.save checkpoint against `wharf fetch` of the same object,
each in a fresh process, through an endpoint of the caller's (a latency proxy in front of
the S3 server). Writes the checkpoint (60 float32 tensors, ~535 MB) to BUCKET/ck.pt with boto3
through the environment's AWS_ENDPOINT_URL first.

  build/tools/latency_proxy/wharf-latency-proxy --listen 127.0.0.1:17099 \\
      --upstream 127.0.0.1:17080 --delay-ms 25 &
  .venv/bin/python bench/torch_load_probe.py --endpoint http://127.0.0.1:17099 --wharf build/wharf
"""
import argparse
import io
import os
import subprocess
import sys
import time

import boto3
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", required=True, help="the S3 endpoint to read through")
    ap.add_argument("--wharf", default="build/wharf")
    ap.add_argument("--bucket", default="torch-load-probe")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    s3 = boto3.client("s3")
    try:
        s3.create_bucket(Bucket=args.bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    torch.manual_seed(0)
    state = {f"w{i}": torch.randn(int(1e6 * (1 + i % 7) / 1.75)) for i in range(60)}
    buf = io.BytesIO()
    torch.save(state, buf)
    s3.put_object(Bucket=args.bucket, Key="ck.pt", Body=buf.getvalue())
    uri = f"s3://{args.bucket}/ck.pt"
    print(f"{uri}: {len(buf.getvalue()) / 1e6:.1f} MB")
    code = ("import time, wharf.torch\n"
            "t = time.perf_counter()\n"
            f"wharf.torch.load({uri!r}, endpoint={args.endpoint!r})\n"
            "print(time.perf_counter() - t)\n")
    env = dict(os.environ, AWS_ENDPOINT_URL=args.endpoint)
    for r in range(args.rounds):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True)
        t = time.perf_counter()
        subprocess.run([args.wharf, "fetch", uri], env=env, capture_output=True, check=True)
        fetch = time.perf_counter() - t
        load = float(out.stdout.strip())
        print(f"round {r}: wharf.torch.load {load:.3f} s, wharf fetch {fetch:.3f} s, "
              f"load/fetch rate {fetch / load:.2f}")


if __name__ == "__main__":
    main()
