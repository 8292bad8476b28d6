"""The dependency graph docs/design/overview.md draws is the code's: each folder's `uses:` list
is exactly the project folders its C++ files include, and no folder includes one below it."""
import os
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINE = re.compile(r"^([a-z_]+)/\s.*uses:\s*(.*?)\s*$")


def documented():
    text = (ROOT / "docs" / "design" / "overview.md").read_text()
    block = text.split("```")[1]
    order, uses = [], {}
    for line in block.splitlines():
        m = LINE.match(line)
        if m:
            order.append(m.group(1))
            uses[m.group(1)] = set() if m.group(2) == "-" else set(m.group(2).split())
    return order, uses


def actual(folders):
    found = {f: set() for f in folders}
    for folder in folders:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in (".cc", ".h") or "build" in path.parts:
                continue
            for inc in re.findall(r'#include "([a-z_]+)/', path.read_text(errors="replace")):
                if inc in found and inc != folder:
                    found[folder].add(inc)
    return found


def test_overview_lists_every_folder_with_code():
    order, _ = documented()
    with_code = set()
    for dirpath, dirnames, filenames in os.walk(ROOT):
        # Not into hidden folders (.venv, .git, .wharf: the test servers' data and the CephFS
        # mounts live there) or build trees.
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and not d.startswith("build")]
        for f in filenames:
            if f.endswith(".cc"):
                with_code.add((pathlib.Path(dirpath).relative_to(ROOT) / f).parts[0])
    assert with_code <= set(order), f"folders missing from overview.md: {with_code - set(order)}"


def test_includes_match_the_documented_graph_and_flow_one_way():
    order, uses = documented()
    found = actual(order)
    rank = {f: i for i, f in enumerate(order)}
    for folder in order:
        upward = {g for g in found[folder] if rank[g] > rank[folder]}
        assert not upward, f"{folder}/ includes folders below it: {sorted(upward)}"
        assert found[folder] == uses[folder], \
            f"{folder}/: overview.md says it uses {sorted(uses[folder])}, its includes use " \
            f"{sorted(found[folder])}"
