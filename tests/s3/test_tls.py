"""TLS is verified by default, and AWS_CA_BUNDLE adds a trusted CA, as in the AWS SDKs.
A TLS-terminating forwarder with a self-signed certificate sits in front of the real RGW."""
import asyncio
import contextlib
import ssl
import subprocess
import threading

import pytest

from conftest import run_wharf


@contextlib.contextmanager
def tls_forwarder(upstream_host, upstream_port, cert, key):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    state = {}

    async def pipe(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def handle(client_r, client_w):
        try:
            up_r, up_w = await asyncio.open_connection(upstream_host, upstream_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pipe(client_r, up_w), pipe(up_r, client_w))

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
        state["port"] = server.sockets[0].getsockname()[1]
        state["server"] = server
        started.set()
        try:
            await server.serve_forever()
        except asyncio.CancelledError:
            pass

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield state["port"]
    finally:
        loop.call_soon_threadsafe(state["server"].close)


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def test_tls_verified_by_default_and_ca_bundle_honoured(self_signed, bucket, s3_env, s3_client):
    s3_client.put_object(Bucket=bucket, Key="secure", Body=b"over tls")
    cert, key = self_signed
    host, port = s3_env["WHARF_S3_ENDPOINT"].split("://", 1)[1].split(":")
    with tls_forwarder(host, int(port), cert, key) as tls_port:
        env = dict(s3_env, AWS_ENDPOINT_URL=f"https://localhost:{tls_port}")
        env.pop("AWS_CA_BUNDLE", None)
        proc = run_wharf("cat", f"s3://{bucket}/secure", env=env)
        assert proc.returncode == 1
        assert len(proc.stderr.strip().splitlines()) == 1
        assert "certificate" in proc.stderr.lower(), proc.stderr
        env["AWS_CA_BUNDLE"] = str(cert)
        proc = run_wharf("cat", f"s3://{bucket}/secure", env=env, check=True)
        assert proc.stdout == b"over tls"
