"""The metrics endpoint (WHARF_METRICS_ADDR): one process serves /metrics with its DataLoader
workers' metrics added in; the text passes `promtool check metrics`; a real Prometheus server
scrapes it and answers a query through its HTTP API; the CLI's --metrics FILE."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from conftest import ROOT, run_wharf


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(text):
    """{series: value} of Prometheus text (histogram series included)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            out[series] = float(value)
    return out


def total(samples, name, **labels):
    """Sum over the series of `name` whose labels include `labels`."""
    s = 0.0
    for series, v in samples.items():
        base = series.split("{", 1)[0]
        if base != name:
            continue
        if all(f'{k}="{val}"' in series for k, val in labels.items()):
            s += v
    return s


@pytest.fixture
def dataset(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    for i in range(40):
        (d / f"{i:03d}.bin").write_bytes(bytes([i]) * (1000 + i))
    return d


@pytest.fixture
def trainer(dataset, tmp_path):
    """The worker process with 2 DataLoader workers, serving metrics on a free port."""
    port = free_port()
    env = dict(os.environ, WHARF_METRICS_ADDR=f"127.0.0.1:{port}", TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/python/metrics_worker.py"),
                             f"file://{dataset}/", "2"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"the training process ended: {proc.stderr.read()}")
    info = json.loads(line)
    yield port, info, proc
    proc.stdin.close()
    proc.wait(timeout=30)


def scrape(port):
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def test_one_process_serves_its_dataloader_workers_metrics(trainer):
    port, info, _ = trainer
    assert info["samples"] == 40
    assert info["exporter"] == {"serving": True, "port": port}
    samples = parse(scrape(port))
    # The 40 objects were read in the 2 workers; their requests reach the parent's endpoint.
    gets = total(samples, "wharf_store_requests_total", op="get", status="ok")
    assert gets >= 41, samples
    # One series per name and label set: the workers' (from their JSON reports, labels sorted
    # by name) were once a second series beside this process's own, labels in another order.
    series = [s.split(" ")[0] for s in scrape(port).splitlines() if s and s[0] != "#"]
    canonical = [(s.split("{")[0], tuple(sorted(s.partition("{")[2].rstrip("}").split(","))))
                 for s in series]
    assert len(set(canonical)) == len(canonical), series
    assert total(samples, "wharf_store_read_bytes_total") >= sum(1000 + i for i in range(40))
    assert total(samples, "wharf_store_requests_total", op="list", status="ok") >= 1
    # No object key or path is ever a label.
    assert "000.bin" not in scrape(port)


def test_port_0_is_one_endpoint_for_the_workers_too(dataset, tmp_path):
    # Port 0 picks a port; the DataLoader workers once re-read "0", each served on a port of
    # its own (their requests never reached the parent's endpoint) and left its spool folder.
    env = dict(os.environ, WHARF_METRICS_ADDR="127.0.0.1:0", TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/python/metrics_worker.py"),
                             f"file://{dataset}/", "2"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        exporter = json.loads(line)["exporter"]
        assert exporter["serving"] and exporter["port"] > 0
        samples = parse(scrape(exporter["port"]))
        assert total(samples, "wharf_store_requests_total", op="get", status="ok") >= 41
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert sorted(p.name for p in tmp_path.glob("wharf-metrics-*")) == []


def test_promtool_accepts_the_exposition(trainer):
    port, _, _ = trainer
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing (Debian prometheus; ./run setup installs it)"
    proc = subprocess.run([promtool, "check", "metrics"], input=scrape(port), text=True,
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_metrics_text_is_what_promtool_accepts(dataset):
    import wharf
    store = wharf.Store(f"file://{dataset}/")
    assert bytes(store.get("001.bin")) == bytes([1]) * 1001
    text = wharf.metrics_text()
    samples = parse(text)
    assert total(samples, "wharf_store_requests_total", op="get", status="ok") >= 1
    assert "# TYPE wharf_store_request_seconds histogram" in text
    assert 'le="+Inf"' in text
    proc = subprocess.run([shutil.which("promtool") or "promtool", "check", "metrics"],
                          input=text, text=True, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_real_prometheus_scrapes_and_answers_a_query(trainer, tmp_path):
    port, _, _ = trainer
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing (Debian prometheus; ./run setup installs it)"
    web = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: wharf\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{port}']\n")
    prom = subprocess.Popen([binary, f"--config.file={config}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{web}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        query = urllib.parse.quote('sum(wharf_store_requests_total{op="get",status="ok"})')
        deadline = time.time() + 60
        got = None
        while time.time() < deadline:
            try:
                reply = json.loads(urllib.request.urlopen(
                    f"http://127.0.0.1:{web}/api/v1/query?query={query}", timeout=5).read())
                result = reply["data"]["result"]
                if result:
                    got = float(result[0]["value"][1])
                    if got >= 40:
                        break
            except OSError:
                pass
            time.sleep(0.5)
        assert got is not None and got >= 40, f"Prometheus answered {got}"
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=20)
        except subprocess.TimeoutExpired:
            prom.kill()


def test_the_cli_writes_its_metrics_to_a_file(dataset, tmp_path):
    out = tmp_path / "m.json"
    proc = run_wharf("--metrics", out, "fetch", "-r", f"file://{dataset}/", check=True)
    assert proc.stdout  # stdout stays the verb's
    doc = json.loads(out.read_text())
    by = {}
    for m in doc["metrics"]:
        key = (m["name"], tuple(sorted(m["labels"].items())))
        by[key] = m
    gets = by[("wharf_store_requests_total",
               (("op", "get"), ("scheme", "file"), ("status", "ok")))]["value"]
    assert gets >= 40
    assert doc["pid"] > 0
    # A failed run writes its metrics too, and still fails.
    proc = run_wharf("--metrics", out, "fetch", f"file://{tmp_path}/missing.bin")
    assert proc.returncode == 1
    assert json.loads(out.read_text())["metrics"]


def test_the_spool_goes_with_its_server_and_a_stale_one_is_no_server(dataset, tmp_path):
    # The serving process removes its spool folder as it exits. A folder left behind (a killed
    # server) beside another program on the port made the next process a silent reporter to
    # nobody; it now says the port is taken, as without the folder.
    port = free_port()
    spool = tmp_path / f"wharf-metrics-{os.getuid()}-{port}"
    env = dict(os.environ, WHARF_METRICS_ADDR=f"127.0.0.1:{port}", TMPDIR=str(tmp_path))
    run_wharf("ls", f"file://{dataset}/", env=env, check=True)
    assert not spool.exists()
    spool.mkdir(mode=0o700)
    (spool / "server.pid").write_text("999999999\n")  # no such process
    other = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                              "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        proc = run_wharf("ls", f"file://{dataset}/", env=env, check=True)
        assert f"serving metrics on 127.0.0.1:{port}" in proc.stderr, proc.stderr
        assert not list(spool.glob("*.json"))
    finally:
        other.terminate()
        other.wait(timeout=30)


def test_a_malformed_address_is_reported_not_fatal(dataset):
    env = dict(os.environ, WHARF_METRICS_ADDR="nonsense:port")
    proc = subprocess.run([sys.executable, "-c",
                           f"import wharf; print(len(wharf.Store('file://{dataset}/').get('000.bin')))"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1000"
    assert "WHARF_METRICS_ADDR" in proc.stderr


def test_tier_reads_are_counted_in_the_runtime_metrics(aws, bucket, s3_client, tmp_path):
    import wharf
    from conftest import make_tier
    for i in range(5):
        s3_client.put_object(Bucket=bucket, Key=f"t/{i}", Body=bytes([i]) * 2000)
    tier = make_tier(tmp_path / "tier")

    def counter(name):
        return sum(v for k, v in wharf.metrics()["counters"].items()
                   if k.split("{", 1)[0] == name)

    before = {n: counter(n) for n in ("wharf_tier_hits_total", "wharf_tier_misses_total",
                                      "wharf_tier_fills_total", "wharf_tier_fill_bytes_total")}
    store = wharf.Store(f"s3://{bucket}/t/", cache=str(tier))
    for _ in range(2):
        for i in range(5):
            assert bytes(store.get(str(i))) == bytes([i]) * 2000
    got = {n: counter(n) - before[n] for n in before}
    assert got["wharf_tier_misses_total"] == 5 and got["wharf_tier_fills_total"] == 5, got
    assert got["wharf_tier_hits_total"] == 5, got
    assert got["wharf_tier_fill_bytes_total"] == 10000, got
