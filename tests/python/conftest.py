"""Fixtures shared by the Python API tests (the servers' fixtures are in tests/conftest.py)."""
import pytest


@pytest.fixture(params=["file", "s3"])
def root(request, tmp_path):
    """A URI prefix on file:// or on a fresh RGW bucket."""
    if request.param == "file":
        return f"file://{tmp_path}/"
    request.getfixturevalue("s3_env")
    return f"s3://{request.getfixturevalue('bucket')}/"
