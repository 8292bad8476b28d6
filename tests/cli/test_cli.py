"""End-to-end tests of the `wharf` command line on local directories.

The binary is $WHARF_BIN (default <repo>/build/wharf). Every test works in its own tmp dir,
so the tests run in any order and in parallel.
"""

import json
import os
import re
import signal
import stat
import threading
import pathlib
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
WHARF = os.environ.get("WHARF_BIN", str(REPO / "build" / "wharf"))

# Names that trip up URL encoding, shells, and naive sorting. Byte order puts "a-b" (0x2d)
# and "a.txt" (0x2e) before "a/..." (0x2f), and "a0" after: a plain directory walk gets
# that wrong.
AWKWARD = [
    "a b/c d.txt",
    "a.txt",
    "a-b",
    "a/x",
    "a0",
    "café/é.bin",
    "日本/データ.txt",
    "plus+sign",
    "pct%20x",
    "q=1&r=2",
    "tilde~home",
    "deep/1/2/3/4/5/6/7/leaf",
    "Upper",
    "_under",
    "!bang",
    "z",
]


def run(*args, cwd=None, check=None):
    """Runs wharf; returns the CompletedProcess with bytes stdout/stderr."""
    proc = subprocess.run([WHARF, *map(str, args)], cwd=cwd, capture_output=True, timeout=120)
    if check is not None:
        assert proc.returncode == check, (proc.returncode, proc.stdout[-2000:], proc.stderr)
    return proc


def stderr_lines(proc):
    return proc.stderr.decode("utf-8", "replace").splitlines()


def make_tree(root: pathlib.Path, files: dict):
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def tree_of(root: pathlib.Path) -> dict:
    """Every regular file below root, by relative path, with its bytes."""
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = pathlib.Path(dirpath) / name
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


def awkward_files():
    files = {name: f"content of {name}\n".encode() for name in AWKWARD}
    files["empty"] = b""
    files["nested/dir/big.bin"] = os.urandom(3 * 1024 * 1024)
    return files


def json_lines(proc):
    return [json.loads(line) for line in proc.stdout.decode("utf-8").splitlines()]


# ---- usage, help, version ----


def declared_verbs():
    """The verbs cli/verbs.h declares (one `void AddXxx(CLI::App& app, ...)` each)."""
    header = (REPO / "cli" / "verbs.h").read_text()
    return [name.lower() for name in re.findall(r"^void Add(\w+)\(CLI::App& app", header, re.M)]


def test_help_lists_every_verb_with_its_own_help():
    verbs = declared_verbs()
    assert len(verbs) >= 8, verbs  # ls stat cat cp sync rm fetch demo, at least
    out = run("--help", check=0).stdout.decode()
    listed = out.split("Subcommands:\n", 1)[1].split("\n\n", 1)[0]
    described = {}
    for line in listed.splitlines():
        verb, _, text = line.strip().partition(" ")
        described[verb] = text.strip()
    # Every verb of verbs.h and nothing else, each with a one-line description.
    assert sorted(described) == sorted(verbs), (described, verbs)
    assert all(described.values()), described
    for verb in verbs:
        proc = run(verb, "--help", check=0)
        assert proc.stdout.decode().startswith(described[verb]), verb
        assert f"Usage: wharf {verb}" in proc.stdout.decode(), verb
        # The global flags, which work after the verb too, are named in its help.
        assert "--cache TIER_DIR" in proc.stdout.decode(), verb


def test_no_verb_prints_help_and_exits_2():
    proc = run(check=2)
    assert b"Usage" in proc.stderr
    assert proc.stdout == b""


def test_version():
    assert run("--version", check=0).stdout.startswith(b"wharf ")


def test_unknown_flag_is_a_usage_error(tmp_path):
    proc = run("ls", "--bogus", tmp_path, check=2)
    lines = stderr_lines(proc)
    assert len(lines) == 2
    assert lines[0].startswith("wharf: ") and "--bogus" in lines[0]
    assert lines[1] == "Run 'wharf ls --help' for usage."


@pytest.mark.parametrize("verb", [["ls"], ["cp"], ["tier", "status"], ["ckpt", "ls"]])
def test_an_unknown_flag_is_named_even_when_an_argument_is_missing(verb):
    # CLI11 checks required arguments first; the error must name the flag, not the URI.
    lines = stderr_lines(run(*verb, "--bogus=1", check=2))
    assert lines[0] == "wharf: unknown flag '--bogus'", lines


def test_missing_argument_and_unknown_verb_are_usage_errors():
    assert "Run 'wharf cp --help'" in run("cp", "only-one", check=2).stderr.decode()
    run("frobnicate", check=2)


@pytest.mark.parametrize("args,group", [(["frobnicate"], "wharf"),
                                        (["tier", "frobnicate"], "wharf tier"),
                                        (["ckpt", "--json", "frobnicate"], "wharf ckpt")])
def test_an_unknown_verb_is_named_with_the_verbs_there_are(args, group):
    lines = stderr_lines(run(*args, check=2))
    assert lines[0].startswith(f"wharf: unknown verb 'frobnicate' ({group} has: "), lines
    assert len(lines) == 2 and lines[1].startswith(f"Run '{group} --help'"), lines


def test_a_verb_group_without_its_verb_names_its_verbs():
    lines = stderr_lines(run("tier", check=2))
    assert lines[0].startswith("wharf: a verb is required (wharf tier has: init, import,"), lines


@pytest.mark.parametrize("bad", ["abc", "5-3", "-0", "1-2-3", "x-", "-", "+1-2", " 1-2"])
def test_bad_range_is_a_usage_error(tmp_path, bad):
    (tmp_path / "f").write_bytes(b"0123456789")
    proc = run("cat", "--range", bad, tmp_path / "f", check=2)
    assert proc.stdout == b""
    assert stderr_lines(proc)[-1] == "Run 'wharf cat --help' for usage."


# ---- ls ----


def test_ls_recursive_json_lists_awkward_names_in_byte_order(tmp_path):
    make_tree(tmp_path / "t", awkward_files())
    proc = run("ls", "-r", "--json", tmp_path / "t", check=0)
    entries = json_lines(proc)
    root_key = str(tmp_path / "t").lstrip("/") + "/"
    keys = [e["key"][len(root_key):] for e in entries]
    assert all(e["key"].startswith(root_key) for e in entries)
    expected = sorted(awkward_files().keys(), key=lambda k: k.encode("utf-8"))
    assert keys == expected
    for e in entries:
        assert set(e) == {"uri", "key", "size", "etag", "mtime"}
        assert e["uri"] == "file:///" + e["key"]
        assert e["mtime"].endswith("Z") and len(e["mtime"]) == 20
    sizes = {k: e["size"] for k, e in zip(keys, entries)}
    assert sizes["empty"] == 0
    assert sizes["nested/dir/big.bin"] == 3 * 1024 * 1024
    assert entries[keys.index("empty")]["etag"] == "d41d8cd98f00b204e9800998ecf8427e"


def test_ls_lines_tell_a_newline_from_a_backslash(tmp_path):
    # A key with a newline is quoted as $'...' with its characters escaped; a key with a
    # backslash and an 'n' prints as it is: the two lines differ.
    make_tree(tmp_path / "t", {"a\nb": b"1", "a\\nb": b"2", "plain": b"3"})
    lines = run("ls", "-r", tmp_path / "t", check=0).stdout.decode().splitlines()
    uris = [line.split("  ")[-1].strip() for line in lines]
    base = f"file://{tmp_path}/t/"
    assert uris == [f"$'{base}a\\nb'", base + "a\\nb", base + "plain"], uris


def test_ls_without_r_shows_prefixes(tmp_path):
    make_tree(tmp_path / "t", awkward_files())
    root = str(tmp_path / "t")
    entries = json_lines(run("ls", "--json", root, check=0))
    names = []
    for e in entries:
        if "prefix" in e:
            assert set(e) == {"uri", "prefix"}
            assert e["prefix"].endswith("/") and e["uri"].endswith("/")
            names.append(e["uri"][len("file://" + root) + 1:])
        else:
            names.append(e["uri"][len("file://" + root) + 1:])
    top = {k.split("/")[0] + ("/" if "/" in k else "") for k in awkward_files()}
    assert names == sorted(top, key=lambda k: k.encode())

    # Human form: "PRE" rows for prefixes, size/mtime/URI rows for objects, same order.
    human = run("ls", root + "/", check=0).stdout.decode().splitlines()
    assert len(human) == len(names)
    for line, name in zip(human, names):
        assert line.endswith("file://" + root + "/" + name)
        if name.endswith("/"):
            assert line.startswith("         PRE  ")
        else:
            size, mtime, _ = line.split(None, 2)
            assert size.isdigit() and mtime.endswith("Z")


def test_ls_of_one_object_shows_just_it(tmp_path):
    make_tree(tmp_path, {"f.txt": b"abc", "f.txt.bak": b"x"})
    entries = json_lines(run("ls", "--json", tmp_path / "f.txt", check=0))
    assert [e["key"].rsplit("/", 1)[1] for e in entries] == ["f.txt"]


def test_ls_nothing_matches_is_an_error(tmp_path):
    proc = run("ls", tmp_path / "nothing", check=1)
    lines = stderr_lines(proc)
    assert len(lines) == 1
    assert lines[0].startswith("wharf: ls file://") and lines[0].endswith("no objects match")
    # An existing empty directory is an empty listing, not an error (ls(1), aws s3 ls).
    (tmp_path / "empty").mkdir()
    for args in ([], ["-r"], ["-r", "--parallel", "2"]):
        proc = run("ls", *args, tmp_path / "empty", check=0)
        assert proc.stdout == b"" and proc.stderr == b"", proc


# ---- stat ----


def test_stat(tmp_path):
    (tmp_path / "f").write_bytes(b"hello")
    out = run("stat", tmp_path / "f", check=0).stdout.decode()
    assert "size:  5" in out
    assert "etag:  5d41402abc4b2a76b9719d911017c592" in out
    meta = json.loads(run("stat", "--json", tmp_path / "f", check=0).stdout)
    assert meta["size"] == 5 and meta["etag"] == "5d41402abc4b2a76b9719d911017c592"
    assert meta["uri"] == f"file://{tmp_path}/f"
    proc = run("stat", tmp_path / "missing", check=1)
    assert len(stderr_lines(proc)) == 1


# ---- cat ----


def test_cat_whole_and_ranges(tmp_path):
    f = tmp_path / "f.txt"
    f.write_bytes(b"hello world")
    assert run("cat", f, check=0).stdout == b"hello world"
    assert run("cat", "--range", "0-4", f, check=0).stdout == b"hello"
    assert run("cat", "--range", "5-", f, check=0).stdout == b" world"
    assert run("cat", "--range", "-3", f, check=0).stdout == b"rld"
    assert run("cat", "--range", "6-100", f, check=0).stdout == b"world"
    assert run("cat", "--range", "-100", f, check=0).stdout == b"hello world"
    assert run("cat", f"file://{f}", check=0).stdout == b"hello world"


def test_cat_large_file_streams_exactly(tmp_path):
    data = os.urandom(5 * 1024 * 1024 + 7)
    (tmp_path / "big").write_bytes(data)
    assert run("cat", tmp_path / "big", check=0).stdout == data


def test_cat_missing_object_prints_one_line(tmp_path):
    proc = run("cat", "file:///no/such/object", check=1)
    assert proc.stdout == b""
    lines = stderr_lines(proc)
    assert len(lines) == 1
    assert lines[0].startswith("wharf: ") and "file:///no/such/object" in lines[0]
    assert "INTERNAL" not in lines[0] and "NOT_FOUND" not in lines[0]


def test_cat_range_past_the_end_fails(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    proc = run("cat", "--range", "10-20", tmp_path / "f", check=1)
    assert len(stderr_lines(proc)) == 1


def test_cat_into_a_closed_pipe_exits_quietly(tmp_path):
    (tmp_path / "big").write_bytes(os.urandom(8 * 1024 * 1024))
    proc = subprocess.Popen([WHARF, "cat", str(tmp_path / "big")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert len(proc.stdout.read(10)) == 10
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert err == b""


# ---- cp ----


def test_cp_recursive_round_trips_byte_identically(tmp_path):
    files = awkward_files()
    make_tree(tmp_path / "src", files)
    proc = run("cp", "-r", "--quiet", tmp_path / "src", tmp_path / "copy", check=0)
    assert proc.stdout == b"" and proc.stderr == b""
    assert tree_of(tmp_path / "copy") == files
    # And back, through URIs and with a trailing slash, into a fresh directory.
    proc = run("cp", "-r", "--jobs", "3", f"file://{tmp_path}/copy/", f"{tmp_path}/back/",
               check=0)
    assert proc.stdout.decode().startswith(f"copied {len(files)} objects (")
    assert tree_of(tmp_path / "back") == files
    # No temporary files or other extras anywhere.
    for d in ("copy", "back"):
        assert sorted(p.name for p in (tmp_path / d).rglob("*") if ".wharf-tmp" in p.name) == []


def test_a_copy_to_a_device_a_fifo_or_dev_stdout_writes_into_it(tmp_path):
    # As cp: the bytes go into /dev/null, a FIFO or /dev/stdout (a link to a pipe or to a
    # redirected file), which are never replaced by a file renamed over them.
    src = tmp_path / "f.txt"
    src.write_bytes(b"some bytes\n")
    run("cp", "-q", src, "/dev/null", check=0)
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)
    out = tmp_path / "out.txt"
    with open(out, "wb") as f:  # a link to a regular file: refused, nothing replaced
        proc = subprocess.run([WHARF, "cp", "-q", str(src), "/dev/stdout"], stdout=f,
                              stderr=subprocess.PIPE, timeout=60)
    assert proc.returncode == 1 and b"wharf cat" in proc.stderr and out.read_bytes() == b""
    assert os.path.islink("/dev/stdout")
    piped = subprocess.run([WHARF, "cp", "-q", str(src), "/dev/stdout"], capture_output=True,
                           timeout=60)
    assert piped.returncode == 0 and piped.stdout == b"some bytes\n"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    run("cp", "-q", src, fifo, check=0)
    reader.join(timeout=60)
    assert got == [b"some bytes\n"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    # A FIFO that nobody reads fails after a few seconds instead of blocking for good.
    unread = run("cp", "-q", src, fifo, check=1)
    assert b"a FIFO that nobody reads" in unread.stderr
    # A user's link outside /dev is replaced as any file is, never followed into a device.
    link = tmp_path / "link"
    link.symlink_to("/dev/null")
    run("cp", "-q", src, link, check=0)
    assert not link.is_symlink() and link.read_bytes() == b"some bytes\n"
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".wharf-tmp")] == []


def test_a_cause_that_fails_every_object_prints_a_bounded_number_of_lines(tmp_path):
    # 70 objects, each refused (the destination is a file): the first 50 are named one per
    # line, then one line says the rest are counted only, and the summary counts all 70.
    make_tree(tmp_path / "src", {f"f{i:02d}": b"x" for i in range(70)})
    (tmp_path / "dst").write_bytes(b"a file")
    proc = run("cp", "-r", tmp_path / "src", f"{tmp_path}/dst/", check=1)
    lines = stderr_lines(proc)
    named = [line for line in lines if "is an object, so it cannot also be a prefix" in line]
    assert len(named) == 50, lines
    assert any("more than 50 objects failed" in line for line in lines), lines
    assert lines[-1].endswith("70 of 70 objects failed"), lines
    assert len(lines) == 52, lines


def test_a_signalled_copy_leaves_no_temporary_file_and_no_partial_one(tmp_path):
    # SIGTERM (as Ctrl-C) at several moments of a local copy of many files: the signal thread
    # removes every temporary file in progress, including those being created as the signal
    # arrives, and every file that is at its name is whole.
    files = {f"s/f{i:04d}": f"file {i}\n".encode() for i in range(3000)}
    files.update({f"big{i}": os.urandom(8 << 20) for i in range(3)})
    make_tree(tmp_path / "src", files)
    interrupted = 0
    for delay in (0.02, 0.05, 0.1, 0.2):
        dst = tmp_path / f"dst-{delay}"
        proc = subprocess.Popen([WHARF, "cp", "-r", "-q", str(tmp_path / "src"), str(dst)],
                                stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        if rc == -signal.SIGTERM:
            # On a loaded machine the signal can arrive before main() installs its handler
            # (the loader, static initialisers): the default action ends the process, which
            # had not started the copy.
            assert not dst.exists(), sorted(dst.rglob("*"))[:5]
            continue
        assert rc in (0, 128 + signal.SIGTERM), rc
        interrupted += rc != 0
        if not dst.exists():
            continue
        left = [p for p in dst.rglob("*") if p.name.startswith(".wharf-tmp")]
        assert left == [], left[:5]
        for p in dst.rglob("*"):
            if p.is_file():
                assert p.read_bytes() == files[str(p.relative_to(dst))], p
    assert interrupted > 0  # the signals came before the copies ended


def test_a_rerun_removes_what_killed_copies_left(tmp_path):
    # Writers killed with -9 mid-file leave their temporary files (private, never listed);
    # the next run that lists the folder removes them. A live writer's file stays.
    dst = tmp_path / "dst"
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "sub" / "f").write_bytes(b"data")
    killed = []
    for target in (dst / "from-stdin", dst / "sub" / "deep"):
        proc = subprocess.Popen([WHARF, "cp", "-q", "-", str(target)], stdin=subprocess.PIPE)
        proc.stdin.write(b"x" * 100_000)
        proc.stdin.flush()
        for _ in range(200):  # until the writer's temporary file exists
            if list(target.parent.glob(".wharf-tmp-*")):
                break
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        killed.extend(target.parent.glob(".wharf-tmp-*"))
    assert len(killed) == 2, killed
    live = subprocess.Popen([WHARF, "cp", "-q", "-", str(dst / "live")], stdin=subprocess.PIPE)
    try:
        live.stdin.write(b"y" * 100_000)
        live.stdin.flush()
        time.sleep(0.5)
        ours = set(dst.glob(".wharf-tmp-*")) - set(killed)
        assert len(ours) == 1, ours
        # At once: no age spares a file, the lock alone tells a live writer's.
        run("cp", "-r", "-q", tmp_path / "src", dst, check=0)
        left = set(dst.rglob(".wharf-tmp-*"))
        assert left == ours, left  # the killed runs' files are gone, the live one stays
    finally:
        live.stdin.close()
        assert live.wait(timeout=60) == 0
    assert (dst / "live").read_bytes() == b"y" * 100_000
    assert list(dst.rglob(".wharf-tmp-*")) == [] and (dst / "sub" / "f").read_bytes() == b"data"


def test_dryrun_with_standard_input_or_output_moves_nothing(tmp_path):
    (tmp_path / "f").write_bytes(b"data")
    up = subprocess.run([WHARF, "cp", "--dryrun", "-", str(tmp_path / "new")], input=b"abc",
                        capture_output=True, timeout=60)
    assert up.returncode == 0 and up.stdout.decode().startswith("(dryrun) upload - -> file://")
    assert not (tmp_path / "new").exists()
    down = run("cp", "--dryrun", tmp_path / "f", "-", check=0)
    assert down.stdout.decode() == f"(dryrun) download file://{tmp_path}/f -> -\n"
    run("cp", "--dryrun", tmp_path / "missing", "-", check=1)


def test_cp_single_file(tmp_path):
    (tmp_path / "f.bin").write_bytes(b"payload")
    (tmp_path / "dir").mkdir()
    run("cp", "-q", tmp_path / "f.bin", tmp_path / "dir", check=0)  # existing directory
    assert (tmp_path / "dir" / "f.bin").read_bytes() == b"payload"
    run("cp", "-q", tmp_path / "f.bin", f"{tmp_path}/new/", check=0)  # trailing slash
    assert (tmp_path / "new" / "f.bin").read_bytes() == b"payload"
    run("cp", "-q", tmp_path / "f.bin", tmp_path / "renamed.bin", check=0)  # a new key
    assert (tmp_path / "renamed.bin").read_bytes() == b"payload"
    out = run("cp", tmp_path / "f.bin", tmp_path / "again.bin", check=0).stdout.decode()
    assert out.startswith("copied 1 object (")


def test_cp_prefix_without_r_is_an_error(tmp_path):
    make_tree(tmp_path / "src", {"a/b": b"x"})
    proc = run("cp", tmp_path / "src", tmp_path / "dst", check=2)  # a usage error
    lines = stderr_lines(proc)
    assert len(lines) == 2 and lines[0].endswith("is a prefix; use -r")
    assert lines[1] == "Run 'wharf cp --help' for usage."
    assert not (tmp_path / "dst").exists()
    proc = run("cp", tmp_path / "src", "-", check=2)
    assert "src: is a prefix, not an object (- takes one object)" in proc.stderr.decode()
    # rm says the same, with the same exit status, and deletes nothing.
    proc = run("rm", tmp_path / "src", check=2)
    assert stderr_lines(proc)[0].endswith("src: is a prefix; use -r")
    assert (tmp_path / "src" / "a" / "b").exists()


def test_cp_missing_source_is_an_error(tmp_path):
    proc = run("cp", tmp_path / "nope", tmp_path / "dst", check=1)
    assert len(stderr_lines(proc)) == 1
    run("cp", "-r", tmp_path / "nope", tmp_path / "dst", check=1)


def test_fetch_of_a_missing_object_is_one_line(tmp_path):
    proc = run("fetch", tmp_path / "nope", check=1)
    lines = stderr_lines(proc)
    assert len(lines) == 1 and "nope" in lines[0], lines
    assert proc.stdout == b""  # no table of zero objects
    # A prefix without -r says so, as cp does; an empty prefix with -r is one line, no table.
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "a").write_bytes(b"a")
    proc = run("fetch", tmp_path / "d" / "sub", check=2)
    assert "is a prefix; use -r" in proc.stderr.decode()
    (tmp_path / "d" / "empty").mkdir()
    proc = run("fetch", "-r", f"{tmp_path}/d/empty/", check=1)
    assert proc.stdout == b"" and "no objects match" in proc.stderr.decode()


def test_cp_recursive_into_itself_is_refused(tmp_path):
    make_tree(tmp_path / "src", {"a": b"x"})
    proc = run("cp", "-r", tmp_path / "src", tmp_path / "src" / "sub", check=1)
    assert "inside the source" in proc.stderr.decode()
    assert tree_of(tmp_path / "src") == {"a": b"x"}


def test_cp_recursive_keeps_going_after_a_failure(tmp_path):
    make_tree(tmp_path / "src", {"a": b"1", "b/c": b"2", "d": b"3"})
    # In the destination "b" is a file, so "b/c" cannot be written; the others still are.
    make_tree(tmp_path / "dst", {"b": b"in the way"})
    proc = run("cp", "-r", "-q", tmp_path / "src", tmp_path / "dst", check=1)
    lines = stderr_lines(proc)
    assert len(lines) == 2, lines
    assert "b/c" in lines[0]
    assert lines[1].endswith("1 of 3 objects failed")
    assert tree_of(tmp_path / "dst") == {"a": b"1", "b": b"in the way", "d": b"3"}


# ---- rm ----


def test_rm(tmp_path):
    make_tree(tmp_path, {"f": b"x", "keep": b"y"})
    proc = run("rm", tmp_path / "f", check=0)
    assert proc.stdout == b""
    assert not (tmp_path / "f").exists() and (tmp_path / "keep").exists()
    proc = run("rm", tmp_path / "f", check=1)
    lines = stderr_lines(proc)
    assert len(lines) == 1 and lines[0].endswith("no such object")


def test_rm_recursive(tmp_path):
    files = {f"d/{i:04d}/x": b"." for i in range(1500)}  # more than one batch of 1000
    files["d.txt"] = b"outside the prefix"
    make_tree(tmp_path, files)
    run("rm", tmp_path / "d", check=2)  # a prefix needs -r (a usage error, as for cp)
    proc = run("rm", "-r", tmp_path / "d", check=0)
    assert proc.stdout == b"deleted 1500 objects\n"
    assert tree_of(tmp_path) == {"d.txt": b"outside the prefix"}
    assert not (tmp_path / "d").exists()
    run("rm", "-r", tmp_path / "d", check=1)  # nothing left
    assert run("rm", "-r", "-q", tmp_path / "d.txt", check=0).stdout == b""
    assert tree_of(tmp_path) == {}


def test_deletes_never_remove_the_directories_above_what_was_named(tmp_path):
    # A file:// store is rooted at "/", and a delete prunes the empty directories it leaves:
    # that pruning removed every empty directory above the named path, up to the working
    # directory and beyond.
    (tmp_path / "nest" / "top" / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "nest" / "top" / "a" / "b" / "c" / "f").write_bytes(b"1")
    run("rm", "-r", "-q", "top/a/b/c/", cwd=tmp_path / "nest", check=0)
    assert (tmp_path / "nest" / "top" / "a" / "b").is_dir()  # c itself, as named, is gone
    assert not (tmp_path / "nest" / "top" / "a" / "b" / "c").exists()
    (tmp_path / "one" / "x").mkdir(parents=True)
    (tmp_path / "one" / "x" / "f").write_bytes(b"1")
    run("rm", tmp_path / "one" / "x" / "f", check=0)
    assert (tmp_path / "one" / "x").is_dir()
    # sync --delete keeps its destination folder, whatever it deletes in it.
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "new").write_bytes(b"n")
    (tmp_path / "dst" / "x" / "y").mkdir(parents=True)
    (tmp_path / "dst" / "x" / "y" / "old").write_bytes(b"o")
    run("sync", "-q", "--delete", tmp_path / "src", tmp_path / "dst", check=0)
    assert tree_of(tmp_path / "dst") == {"new": b"n"}


def test_sync_delete_replaces_a_file_by_a_folder_and_back_in_one_run(tmp_path):
    # A key cannot be a file and a folder at once on a file system: the extra in the way
    # goes before the copy (it failed once, and only a second run finished).
    make_tree(tmp_path / "src", {"a/x": b"1", "b": b"2", "keep/k": b"k"})
    make_tree(tmp_path / "dst", {"a": b"old file", "b/y": b"3", "b/z/w": b"4", "keep/k": b"k"})
    out = run("sync", "--delete", tmp_path / "src", tmp_path / "dst", check=0)
    assert tree_of(tmp_path / "dst") == {"a/x": b"1", "b": b"2", "keep/k": b"k"}
    assert b"deleted 3 not in the source" in out.stdout + out.stderr, out
    again = run("sync", "--delete", tmp_path / "src", tmp_path / "dst", check=0)
    assert b"deleted" not in again.stdout + again.stderr, again
    # An extra the filters keep is not removed: the copy that needs its place fails, naming it.
    make_tree(tmp_path / "src2", {"c": b"5"})
    make_tree(tmp_path / "dst2", {"c/kept": b"6"})
    bad = run("sync", "--delete", "--exclude", "c/kept", tmp_path / "src2", tmp_path / "dst2",
              check=1)
    assert tree_of(tmp_path / "dst2") == {"c/kept": b"6"}
    assert "dst2/c" in bad.stderr.decode(), bad.stderr
    # Without --delete nothing is removed, and the conflict is reported.
    make_tree(tmp_path / "dst3", {"a": b"old"})
    run("sync", tmp_path / "src", tmp_path / "dst3", check=1)
    assert tree_of(tmp_path / "dst3")["a"] == b"old"


def test_sync_delete_deletes_nothing_when_a_copy_failed(tmp_path):
    # As rsync after I/O errors: a failure may come with a source that was not what it seemed
    # (a damaged listing once made a sync delete a file the source has), so the extras wait.
    make_tree(tmp_path / "src", {"c": b"5", "new": b"n"})
    make_tree(tmp_path / "dst", {"c/kept": b"6", "old": b"o"})
    bad = run("sync", "--delete", "--exclude", "c/kept", tmp_path / "src", tmp_path / "dst",
              check=1)
    assert "nothing was deleted for --delete" in bad.stderr.decode(), bad.stderr
    assert tree_of(tmp_path / "dst") == {"c/kept": b"6", "old": b"o", "new": b"n"}
    (tmp_path / "dst" / "c" / "kept").unlink()
    (tmp_path / "dst" / "c").rmdir()
    run("sync", "-q", "--delete", "--exclude", "c/kept", tmp_path / "src", tmp_path / "dst",
        check=0)
    assert tree_of(tmp_path / "dst") == {"c": b"5", "new": b"n"}


def test_sync_delete_with_the_source_inside_the_destination_is_refused(tmp_path):
    # It deleted the source: everything below the destination that the source did not list,
    # the source's own files included.
    make_tree(tmp_path / "rec", {"deep/d.txt": b"d", "x.txt": b"x"})
    proc = run("sync", "--delete", tmp_path / "rec" / "deep", tmp_path / "rec", check=1)
    assert "the source is inside the destination" in proc.stderr.decode(), proc.stderr
    assert tree_of(tmp_path / "rec") == {"deep/d.txt": b"d", "x.txt": b"x"}
    # Without --delete it copies, as before.
    run("sync", "-q", tmp_path / "rec" / "deep", tmp_path / "rec", check=0)
    assert tree_of(tmp_path / "rec")["d.txt"] == b"d"


def test_a_tiers_own_folder_is_never_listed_copied_or_synced_away(tmp_path):
    # `sync --delete` into a tier deleted its settings and import records (the folder then
    # was no tier), and `cp -r TIER` copied them: a plain listing showed .wharf/ as data.
    make_tree(tmp_path / "src", {"a.txt": b"a", "d/b.txt": b"b"})
    tier = tmp_path / "tier"
    run("tier", "import", "-q", tmp_path / "src", tier, check=0)
    run("tier", "init", "-q", tier, "--max-size", "1G", check=0)
    root_key = str(tier).lstrip("/") + "/"
    keys = [e["key"][len(root_key):] for e in json_lines(run("ls", "-r", "--json", tier, check=0))]
    assert sorted(keys) == ["a.txt", "d/b.txt"], keys
    run("sync", "-q", "--delete", tmp_path / "src", tier, check=0)
    status = json.loads(run("tier", "status", "--json", tier, check=0).stdout)
    assert status["max_size"] == 1 << 30, status
    run("cp", "-r", "-q", tier, tmp_path / "copy", check=0)
    assert tree_of(tmp_path / "copy") == {"a.txt": b"a", "d/b.txt": b"b"}
    # Named on its own, the folder still lists (it is the tier's, not hidden from its owner).
    assert b"tier.json" in run("ls", "-r", tier / ".wharf", check=0).stdout


def test_a_failed_delete_of_sync_delete_is_reported_once_and_the_rest_deleted(tmp_path):
    make_tree(tmp_path / "src", {"keep": b"k"})
    make_tree(tmp_path / "dst", {"keep": b"k", "a/x1": b"1", "a/x2": b"2", "a/x3": b"3"})
    stuck = tmp_path / "dst" / "a" / "x2"
    if subprocess.run(["chattr", "+i", stuck], capture_output=True).returncode != 0:
        pytest.fail("chattr +i is needed to make a delete fail (root on ext4)")
    try:
        proc = run("sync", "-q", "--delete", tmp_path / "src", tmp_path / "dst", check=1)
    finally:
        subprocess.run(["chattr", "-i", stuck], check=True)
    lines = [line for line in stderr_lines(proc) if "x2" in line]
    assert len(lines) == 1, stderr_lines(proc)
    assert tree_of(tmp_path / "dst") == {"keep": b"k", "a/x2": b"2"}


def test_a_fifo_in_a_source_is_skipped_with_a_warning_and_exit_2(tmp_path):
    # As `aws s3 cp/sync` do: the rest is copied, and the exit status says not everything was.
    make_tree(tmp_path / "src", {"f": b"1"})
    os.mkfifo(tmp_path / "src" / "pipe")
    for verb, dst in ((["cp", "-r"], "dst"), (["sync"], "synced")):
        proc = run(*verb, "-q", tmp_path / "src", tmp_path / dst, check=2)
        assert tree_of(tmp_path / dst) == {"f": b"1"}
        lines = stderr_lines(proc)
        assert any("pipe: not a file or a folder" in line for line in lines), lines
        assert "1 entry of a local folder left out" in lines[-1], lines
        assert "everything else was copied" in lines[-1] and "--help" not in lines[-1], lines
    # Without the FIFO the same copy is whole: exit 0.
    os.remove(tmp_path / "src" / "pipe")
    run("sync", "-q", tmp_path / "src", tmp_path / "synced", check=0)


def test_symbolic_links_are_followed_except_into_a_loop_and_dangling_ones_are_named(tmp_path):
    src = tmp_path / "src"
    make_tree(src, {"d/f": b"1", "other/g": b"2"})
    (src / "d" / "up").symlink_to("..")  # a loop: src/d/up/d/up/...
    (src / "d" / "self").symlink_to(".")
    (src / "d" / "to-other").symlink_to("../other")  # followed: not above d
    (src / "d" / "file-link").symlink_to("f")
    (src / "dangling").symlink_to("missing")
    proc = run("cp", "-r", "-q", src, tmp_path / "dst", check=2)  # three left out
    assert tree_of(tmp_path / "dst") == {
        "d/f": b"1", "d/file-link": b"1", "d/to-other/g": b"2", "other/g": b"2"}
    assert "3 entries of a local folder left out" in stderr_lines(proc)[-1], proc.stderr
    err = proc.stderr.decode()
    assert f"skipping {src}/d/up: a symbolic link to a directory it is in" in err, err
    assert f"skipping {src}/d/self: a symbolic link to a directory it is in" in err, err
    assert f"skipping {src}/dangling: a symbolic link to nothing" in err, err
    listed = run("ls", "-r", src, check=0).stdout.decode()
    assert "d/to-other/g" in listed and "d/up" not in listed


def test_command_lines_a_verb_cannot_take_exit_2(tmp_path):
    for args in (["cp", "-r", "-", tmp_path / "x"], ["cp", "-", "-"], ["ls", "foo://bar/"],
                 ["cp", "--sse-kms-key-id", "k", tmp_path / "a", tmp_path / "b"]):
        proc = run(*args, check=2)
        assert stderr_lines(proc)[-1].endswith("--help' for usage."), args
    assert "unsupported URI scheme 'foo://'" in run("ls", "foo://bar/").stderr.decode()
    # A --metrics file that cannot be written is said before the run, not after it.
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"1")
    bad = run("--metrics", tmp_path / "no" / "m.json", "cp", "-r", tmp_path / "src",
              tmp_path / "dst", check=2)
    assert "--metrics" in bad.stderr.decode() and not (tmp_path / "dst").exists()
    # Before the verb, --profile is the AWS profile's flag: the verb became its value.
    mixed = run("--profile", "fetch", tmp_path / "src" / "f", check=2)
    assert "'fetch' was taken as the AWS profile" in mixed.stderr.decode(), mixed.stderr
    # After another verb too: the URI became its value.
    uri = f"file://{tmp_path}/src/f"
    taken = run("cat", "--profile", uri, check=2).stderr.decode()
    assert f"'{uri}' was taken as the AWS profile" in taken and "WHARF_PROFILE=1" in taken


def test_rm_recursive_refuses_the_file_system_root():
    proc = run("rm", "-r", "/", check=1)
    assert "refusing" in proc.stderr.decode()


# ---- demo ----


def test_demo(tmp_path):
    proc = run("demo", "--objects", "200", check=0, cwd=tmp_path)
    out = proc.stdout.decode()
    table = [line for line in out.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert header == ["phase", "objects", "bytes", "seconds", "MB/s"]
    rows = {line.split("|")[1].strip(): line for line in table[2:]}
    assert {"generate", "list", "read"} <= set(rows)
    assert rows["generate"].split("|")[2].strip() == "200"
    assert rows["read"].split("|")[2].strip() == "200"
    assert "verification: OK" in out
    data = tree_of(tmp_path / ".wharf" / "demo")
    assert len(data) == 200
    assert all(len(v) == 100 * 1024 and v[:4] == b"WIMG" for v in data.values())
    assert sum(k.startswith("train/class-07/") for k in data) == 20
    # The tier phases: the data set imported into .wharf/demo-tier, then read from there.
    assert rows["import to tier"].split("|")[2].strip() == "200"
    assert rows["read from tier"].split("|")[2].strip() == "200"
    assert tree_of(tmp_path / ".wharf" / "demo-tier" / "train") == {
        k[len("train/"):]: v for k, v in data.items()}
    status = json.loads(run("tier", "status", "--json", tmp_path / ".wharf" / "demo-tier",
                            check=0).stdout)
    assert status["entries"] == 200 and status["hits"] == 200 and status["fills"] == 0

    # A second run finds the data set complete and skips writing it, and the tier current.
    out = run("demo", "--objects", "200", check=0, cwd=tmp_path).stdout.decode()
    assert "skipped (already present)" in out and "verification: OK" in out
    assert "skipped (200 current)" in out


def test_demo_reads_through_the_engine_within_a_small_budget(tmp_path):
    # The read phase is a SampleStream over the fetch engine: samples waiting for their
    # checksum hold budget, and the engine waits for them instead of failing reads (a 256 KiB
    # budget holds two of these objects; read-ahead and verification want more).
    proc = run("demo", "--objects", "60", "--size", "100000", "--memory-budget", "256k",
               "-j", "16", "--dir", tmp_path / "ds", check=0)
    out = proc.stdout.decode()
    assert "verification: OK, all 60 objects" in out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("|")}
    assert rows["read"].split("|")[2].strip() == "60"
    assert rows["read"].split("|")[3].strip() == str(60 * 100000)


def test_a_file_replaced_by_rename_with_its_size_time_and_attributes_gets_its_own_etag(tmp_path):
    # The ETag cache was keyed by size and mtime only: a file replaced by another of the same
    # size and mtime, attributes copied (cp -a to a temporary, then mv), kept the old ETag, so
    # a cache keyed by it (a model's version) served the old file's results.
    import hashlib
    (tmp_path / "d").mkdir()
    f = tmp_path / "d" / "model.bin"
    f.write_bytes(b"aaaa")
    os.utime(f, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))

    def etag():
        return json_lines(run("ls", "--json", f, check=0))[0]["etag"]

    assert etag() == hashlib.md5(b"aaaa").hexdigest()
    new = tmp_path / "new.bin"
    new.write_bytes(b"bbbb")
    os.setxattr(new, "user.wharf.etag", os.getxattr(f, "user.wharf.etag"))
    os.utime(new, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    os.replace(new, f)
    assert etag() == hashlib.md5(b"bbbb").hexdigest()


def test_demo_detects_bytes_that_do_not_match_the_etag(tmp_path):
    run("demo", "--objects", "20", "--size", "4096", "--dir", tmp_path / "ds", check=0)
    victim = tmp_path / "ds" / "train" / "class-03" / "img-000013.raw"
    try:
        os.getxattr(victim, "user.wharf.etag")
    except OSError:
        pytest.fail("the test directory's file system keeps no user xattrs")
    # Same size and mtime: the local store's cached ETag still claims the old content.
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    with open(victim, "r+b") as f:
        f.write(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    proc = run("demo", "--objects", "20", "--size", "4096", "--dir", tmp_path / "ds", check=1)
    assert "verification: FAILED" in proc.stdout.decode()
    lines = stderr_lines(proc)
    assert len(lines) == 1
    assert "1 of 20 objects failed" in lines[0] and "img-000013.raw" in lines[0]


def test_filters_that_spell_out_the_source_are_read_relative_to_it(tmp_path):
    # `--exclude /abs/src/logs/*` (as aws s3 reads it) excludes the source's logs/, and a
    # file:// spelling of it too; before, such a pattern matched no relative key and the logs
    # were copied. One outside the source could match nothing: refused, naming it.
    src = tmp_path / "src"
    make_tree(src, {"a": b"1", "logs/x": b"2", "logs/y": b"3", "keep/z": b"4"})
    run("cp", "-r", "--exclude", f"{src}/logs/*", src, tmp_path / "d1", check=0)
    assert tree_of(tmp_path / "d1") == {"a": b"1", "keep/z": b"4"}
    run("sync", "--exclude", f"file://{src}/logs/*", "--include", f"{src}/logs/y", src,
        tmp_path / "d2", check=0)
    assert tree_of(tmp_path / "d2") == {"a": b"1", "keep/z": b"4", "logs/y": b"3"}
    bad = run("cp", "-r", "--exclude", f"{tmp_path}/other/*", src, tmp_path / "d3", check=2)
    assert "--exclude" in bad.stderr.decode() and f"{tmp_path}/other/*" in bad.stderr.decode()
    assert not (tmp_path / "d3").exists()
    # rm -r: the same rules.
    run("rm", "-r", "--exclude", f"{src}/keep/*", src, check=0)
    assert tree_of(src) == {"keep/z": b"4"}
