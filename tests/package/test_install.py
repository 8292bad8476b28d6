"""`pip install <repo>` into a fresh virtualenv outside the repository, then wharf used from
there: `import wharf` from site-packages (not python/), the store API, the `wharf` CLI.

The install is the one users run: pip's build isolation fetches the build requirements of
pyproject.toml (scikit-build-core, pybind11) from the index, so a requirement missing there
fails here. It is made cheap with ccache only (when installed): the wheel is built with the
flags of `./run build`, in build-wheel/ beside build/ (so paths relative to the checkout are
the same), and the compiler CMake picks there, so every object but the bindings' (which see
pybind11 in pip's temporary build environment) is a cache hit. The build directory is wiped
first: CMake configures and builds from scratch every time.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD_DIR = ROOT / "build-wheel"
VERBS = ["ls", "stat", "cat", "cp", "sync", "rm", "fetch", "demo"]


def _clean_env(**extra):
    """The environment without what would point Python at the checkout or another venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env.update(extra)
    return env


def _snapshot(folder):
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A virtualenv outside the repository with `pip install <repo>` done in it."""
    work = tmp_path_factory.mktemp("install")
    assert ROOT not in work.resolve().parents
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, cwd=work)

    env = _clean_env(PIP_NO_INPUT="1")
    if shutil.which("ccache"):
        env.update(CCACHE_BASEDIR=str(ROOT), CCACHE_NOHASHDIR="1",
                   CMAKE_ARGS="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
                   # CMake's own choice in ./run build; scikit-build-core would otherwise
                   # pass Python's (g++), which ccache keys apart.
                   CXX="c++")
    shutil.rmtree(BUILD_DIR, ignore_errors=True)
    package_dir = ROOT / "python" / "wharf"
    before = _snapshot(package_dir)
    werror = "ON" if os.environ.get("CI") else "OFF"
    started = time.monotonic()
    # --no-cache-dir: pip (23.2) would keep the wheel built from a directory whose path has a
    # '-' in it (it reads wt-pkg as name-version) and install that stale wheel next time.
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-cache-dir",
         "--disable-pip-version-check", "-C", f"build-dir={BUILD_DIR}",
         "-C", "cmake.build-type=RelWithDebInfo", "-C", f"cmake.define.WHARF_WERROR={werror}",
         str(ROOT)],
        cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    took = time.monotonic() - started
    assert proc.returncode == 0, f"pip install failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    print(f"pip install <repo>: {took:.0f} s")
    # The wheel build writes nothing into the package directory of the checkout.
    assert _snapshot(package_dir) == before
    return venv


def _py(venv, code, cwd):
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=cwd,
                          env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _wharf(venv, *args, cwd, input=None):
    """The `wharf` command found on PATH with the venv's bin/ first (an activated venv)."""
    env = _clean_env(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    exe = shutil.which("wharf", path=env["PATH"])
    assert exe == str(venv / "bin" / "wharf")
    return subprocess.run([exe, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          input=input, timeout=300)


def test_import_wharf_is_the_installed_copy(venv, tmp_path):
    out = _py(venv, """
import json, sys, sysconfig
import wharf, wharf._wharf
print(json.dumps({"package": wharf.__file__, "extension": wharf._wharf.__file__,
                  "site": [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]],
                  "torch": "torch" in sys.modules}))
""", cwd=tmp_path)
    got = json.loads(out)
    site = {pathlib.Path(p).resolve() for p in got["site"]}
    for f in (got["package"], got["extension"]):
        path = pathlib.Path(f).resolve()
        assert path.parent.parent in site, f"{f} is not in the venv's site-packages {site}"
        assert ROOT not in path.parents
    assert got["torch"] is False


def test_store_api_round_trip(venv, tmp_path):
    data = tmp_path / "data"
    out = _py(venv, f"""
import wharf
store = wharf.Store("file://{data}/")
store.put("a/one.bin", b"hello wharf")
store.put("b.bin", bytes(range(256)))
print([o["key"] for o in store.list()])
print(bytes(store.get("a/one.bin")).decode(), store.head("b.bin")["size"])
print(bytes(store.get_many(["b.bin"])[0]) == bytes(range(256)))
""", cwd=tmp_path)
    assert out.splitlines() == ["['a/one.bin', 'b.bin']", "hello wharf 256", "True"]
    assert (data / "a" / "one.bin").read_bytes() == b"hello wharf"


def test_metadata(venv, tmp_path):
    out = _py(venv, """
import json
from importlib import metadata
m = metadata.metadata("wharf")
print(json.dumps({"version": metadata.version("wharf"), "python": m["Requires-Python"],
                  "requires": metadata.requires("wharf") or [],
                  "files": [str(f) for f in metadata.files("wharf")]}))
""", cwd=tmp_path)
    got = json.loads(out)
    version = _wharf(venv, "--version", cwd=tmp_path)
    assert version.returncode == 0
    assert version.stdout.decode().strip() == f"wharf {got['version']}"
    assert got["python"]
    # Nothing is required to import wharf; torch only with the [torch] extra.
    assert [r for r in got["requires"] if "extra ==" not in r] == []
    assert any(r.startswith("torch") and 'extra == "torch"' in r for r in got["requires"])
    # The wheel holds the package, the CLI and its own metadata, nothing else.
    tops = {f.split("/")[0] for f in got["files"]}
    assert tops <= {"wharf", f"wharf-{got['version']}.dist-info", ".."}, tops
    # Paths below wharf/ (subpackages such as wharf/torch/ included).
    installed = {str(pathlib.PurePosixPath(f).relative_to("wharf")) for f in got["files"]
                 if f.startswith("wharf/") and "__pycache__" not in f}
    package = ROOT / "python" / "wharf"
    sources = {p.relative_to(package).as_posix() for p in package.rglob("*.py")
               if "__pycache__" not in p.parts}
    assert {n for n in installed if n.endswith(".py")} == sources
    assert any(n.startswith("_wharf.") and n.endswith(".so") for n in installed)
    assert any(f.endswith("bin/wharf") for f in got["files"])


def test_wheel_build_has_no_tests_or_benchmarks(venv):
    built = [p.name for p in BUILD_DIR.rglob("*") if p.is_file() and os.access(p, os.X_OK)]
    assert "wharf" in built
    unwanted = [n for n in built if n.endswith("_test") or "benchmark" in n or "proxy" in n]
    assert unwanted == []


def test_cli_help_and_verbs(venv, tmp_path):
    help_ = _wharf(venv, "--help", cwd=tmp_path)
    assert help_.returncode == 0, help_.stderr
    text = help_.stdout.decode()
    for verb in VERBS:
        assert f"\n  {verb}" in text, f"{verb} missing from --help:\n{text}"

    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 100_000 + b"end")
    dst = f"file://{tmp_path}/dst/"
    cp = _wharf(venv, "cp", src, dst + "copied.bin", cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    # An object written through the installed Python package, listed by the installed CLI.
    _py(venv, f"import wharf; wharf.Store({dst!r}).put('from-python.txt', b'py')",
        cwd=tmp_path)
    ls = _wharf(venv, "ls", dst, cwd=tmp_path)
    assert ls.returncode == 0, ls.stderr
    listed = ls.stdout.decode()
    assert "copied.bin" in listed and "from-python.txt" in listed
    cat = _wharf(venv, "cat", dst + "copied.bin", cwd=tmp_path)
    assert cat.returncode == 0 and cat.stdout == src.read_bytes()
    # Standard input through the CLI, exit codes as the binary's.
    put = _wharf(venv, "cp", "-", dst + "stdin.txt", cwd=tmp_path, input=b"piped")
    assert put.returncode == 0 and (tmp_path / "dst" / "stdin.txt").read_bytes() == b"piped"
    missing = _wharf(venv, "stat", dst + "nope", cwd=tmp_path)
    assert missing.returncode == 1 and b"nope" in missing.stderr
    assert _wharf(venv, "no-such-verb", cwd=tmp_path).returncode == 2
