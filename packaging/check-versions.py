#!/usr/bin/env python3
"""One version moves together (CHANGELOG.md, "Version policy").

Compares the WIT package version (every wit/*.wit), the Rust crates' version
(the workspace's, which every crate inherits, and the version requirements on
its path dependencies), package.json's and package-lock.json's version,
pyproject.toml's version, the versioned interface names the hosts hard-code
(`idempotency:ledger/<interface>@X.Y.Z`) and CHANGELOG.md's sections. Prints
what it compared; exits 1 naming every file that disagrees.

Usage: check-versions.py [--root DIR]   (default: the repository root)
"""

import argparse
import json
import re
import sys
import tomllib
from pathlib import Path

CRATES = ["guest/core", "bindings/rust", "bindings/rust/cli", "bindings/python"]
# Host sources that name the component's interfaces with their version.
INTERFACE_SOURCES = ["Makefile", "bindings/js/src/*.js", "bindings/rust/src/**/*.rs", "bindings/python/src/**/*.rs",
                     "bindings/python/src/**/*.py"]
INTERFACE = re.compile(r"idempotency:ledger(?:/[a-z-]+)?@(\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    root = parser.parse_args().root

    found: list[tuple[str, str]] = []  # (where, version)
    problems: list[str] = []

    def read(rel: str) -> str:
        path = root / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
            return ""
        return path.read_text(encoding="utf-8")

    # The WIT package.
    wit_files = sorted((root / "wit").glob("*.wit"))
    if not wit_files:
        problems.append("wit/*.wit: no WIT files")
    for path in wit_files:
        m = re.search(r"^package\s+idempotency:ledger@([^;\s]+);", path.read_text(encoding="utf-8"), re.M)
        if m:
            found.append((f"{path.relative_to(root)} (package idempotency:ledger@)", m.group(1)))
        else:
            problems.append(f"{path.relative_to(root)}: no `package idempotency:ledger@X.Y.Z;` line")

    # The Rust crates.
    workspace = tomllib.loads(read("Cargo.toml") or "")
    ws_version = workspace.get("workspace", {}).get("package", {}).get("version")
    if ws_version is None:
        problems.append("Cargo.toml: no [workspace.package] version")
    else:
        found.append(("Cargo.toml [workspace.package] version", ws_version))
    for name, dep in workspace.get("workspace", {}).get("dependencies", {}).items():
        if isinstance(dep, dict) and "path" in dep:
            if "version" not in dep:
                problems.append(f"Cargo.toml: [workspace.dependencies] {name} has a path but no version")
            else:
                found.append((f"Cargo.toml [workspace.dependencies] {name} version", dep["version"].lstrip("=^")))
    for crate in CRATES:
        package = tomllib.loads(read(f"{crate}/Cargo.toml") or "").get("package", {})
        version = package.get("version")
        if version == {"workspace": True}:
            if ws_version is not None:
                found.append((f"{crate}/Cargo.toml version (workspace)", ws_version))
        elif isinstance(version, str):
            found.append((f"{crate}/Cargo.toml version", version))
        else:
            problems.append(f"{crate}/Cargo.toml: no version")

    # npm.
    for rel in ["bindings/js/package.json", "bindings/js/package-lock.json"]:
        text = read(rel)
        if text:
            data = json.loads(text)
            found.append((f"{rel} version", data.get("version", "(none)")))
            if rel.endswith("lock.json"):
                found.append((f"{rel} packages[\"\"].version", data.get("packages", {}).get("", {}).get("version", "(none)")))

    # Python.
    pyproject = tomllib.loads(read("bindings/python/pyproject.toml") or "")
    py_version = pyproject.get("project", {}).get("version")
    if py_version is None:
        problems.append("bindings/python/pyproject.toml: no [project] version (it must be static, not dynamic)")
    else:
        found.append(("bindings/python/pyproject.toml version", py_version))

    # Interface names hard-coded by the hosts.
    for pattern in INTERFACE_SOURCES:
        for path in sorted(root.glob(pattern)):
            for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for m in INTERFACE.finditer(line):
                    found.append((f"{path.relative_to(root)}:{lineno} ({m.group(0)})", m.group(1)))

    versions = {v for _, v in found}
    expected = ws_version if ws_version is not None else (sorted(versions)[0] if versions else None)

    # CHANGELOG.md has a section for the version.
    changelog = read("CHANGELOG.md")
    if expected is not None and changelog and not re.search(rf"^## {re.escape(expected)}\b", changelog, re.M):
        problems.append(f"CHANGELOG.md: no `## {expected}` section")

    width = max((len(w) for w, _ in found), default=0)
    for where, version in found:
        mark = "" if version == expected else "   <-- differs"
        print(f"  {where:<{width}}  {version}{mark}")
    if len(versions) > 1:
        problems.append("versions differ: " + ", ".join(sorted(versions)) + f" (the crates say {expected}); "
                        "every place listed above must carry the same version")
    if problems:
        print("error: the versions do not move together (CHANGELOG.md, Version policy):", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    print(f"versions: {expected} everywhere ({len(found)} places: WIT, crates, npm, Python, host interface names)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
