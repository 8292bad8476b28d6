"""Logging: -v/--verbose and WHARF_LOG=debug print one line per store request (operation,
URI, status, bytes, attempts, request id, time) on stderr, stdout stays the verb's, and no
secret ever appears, with good credentials or bad."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, run_wharf

LINE = re.compile(r"^wharf: debug: (\w+) (\S+): (ok|not_found|precondition|cancelled|error)\b.*"
                  r", [0-9.]+ ms$")


def secrets(env):
    return [env["AWS_SECRET_ACCESS_KEY"]]


@pytest.fixture
def objects(s3_client, bucket):
    for i in range(3):
        s3_client.put_object(Bucket=bucket, Key=f"d/{i}.bin", Body=bytes([i]) * 1000)
    return bucket


def debug_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith("wharf: debug: ")]


@pytest.mark.parametrize("how", ["-v", "--verbose", "WHARF_LOG=debug"])
def test_one_line_per_request_with_the_request_id(s3_env, objects, how):
    env = dict(s3_env)
    args = ["cat", f"s3://{objects}/d/1.bin"]
    if how.startswith("WHARF_LOG"):
        env["WHARF_LOG"] = "debug"
    else:
        args = [how] + args
    proc = run_wharf(*args, env=env, check=True)
    assert proc.stdout == bytes([1]) * 1000  # stdout is the object, nothing else
    lines = debug_lines(proc.stderr)
    gets = [l for l in lines if l.startswith(f"wharf: debug: get s3://{objects}/d/1.bin: ok")]
    assert gets, proc.stderr
    for line in lines:
        assert LINE.match(line), line
    assert "1000 bytes" in gets[0] and "attempts 1" in gets[0]
    assert "request id " in gets[0]  # RGW sends x-amz-request-id
    for secret in secrets(env):
        assert secret not in proc.stderr


def test_a_listing_and_a_failure_are_logged_without_secrets(s3_env, objects):
    env = dict(s3_env, WHARF_LOG="debug")
    proc = run_wharf("ls", f"s3://{objects}/d/", env=env, check=True)
    assert any(l.startswith(f"wharf: debug: list s3://{objects}/d/: ok") for l in
               debug_lines(proc.stderr)), proc.stderr
    missing = run_wharf("cat", f"s3://{objects}/nope", env=env)
    assert missing.returncode == 1
    assert any(": not_found (" in l for l in debug_lines(missing.stderr)), missing.stderr
    bad = dict(env, AWS_SECRET_ACCESS_KEY="wrongsecretwrongsecretwrongsecret0000001")
    denied = run_wharf("cat", f"s3://{objects}/d/0.bin", env=bad)
    assert denied.returncode == 1
    assert any(": error (" in l for l in debug_lines(denied.stderr)), denied.stderr
    for secret in secrets(env) + secrets(bad):
        assert secret not in denied.stderr and secret not in missing.stderr


def test_quiet_by_default_and_a_bad_level_is_one_warning(s3_env, objects):
    proc = run_wharf("cat", f"s3://{objects}/d/0.bin", env=dict(s3_env), check=True)
    assert debug_lines(proc.stderr) == []
    proc = run_wharf("cat", f"s3://{objects}/d/0.bin", env=dict(s3_env, WHARF_LOG="loud"),
                     check=True)
    assert proc.stderr.count("WHARF_LOG") == 1


def test_python_configure_log_level(s3_env, objects):
    code = ("import wharf; wharf.configure(log_level='debug'); "
            f"s = wharf.Store('s3://{objects}/d/'); print(len(s.get('2.bin')))")
    proc = subprocess.run([sys.executable, "-c", code], env=dict(s3_env), capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1000"
    assert any(l.startswith(f"wharf: debug: get s3://{objects}/d/2.bin: ok") for l in
               debug_lines(proc.stderr)), proc.stderr
    with pytest.raises(ValueError):
        import wharf
        wharf.configure(log_level="loud")
