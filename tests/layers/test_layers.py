#!/usr/bin/env python3
"""The layers hold: no file outside core/ includes a core-internal header.

core/ is the host; tools/ and server/ are clients of its public API
(include/loom.h); backends/ and plugins/ see only the plugin ABIs
(include/loom/*.h). A quoted #include in any of those folders must name a
file of include/, of its own folder (or a sibling of the same component),
or a generated header of the build; never one under core/. Tests are
exempt: they check the core's internals on purpose.
Usage: test_layers.py SOURCE_ROOT
"""
import os
import re
import sys

CLIENTS = ["tools", "server", "backends", "plugins"]
SOURCE = (".c", ".h", ".cc", ".cu", ".hip", ".cpp")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def core_headers(root):
    """Every header under core/, by the names it could be included as."""
    names = set()
    core = os.path.join(root, "core")
    for d, _, files in os.walk(core):
        for f in files:
            if f.endswith(".h"):
                rel = os.path.relpath(os.path.join(d, f), core)
                names.add(rel)
                names.add(f)
    return names


def public_headers(root):
    inc = os.path.join(root, "include")
    return {os.path.relpath(os.path.join(d, f), inc)
            for d, _, files in os.walk(inc) for f in files}


def main():
    root = sys.argv[1]
    internal = core_headers(root) - public_headers(root)
    bad = []
    checked = 0
    for top in CLIENTS:
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith(SOURCE):
                    continue
                path = os.path.join(d, f)
                text = open(path, encoding="utf-8", errors="replace").read()
                checked += 1
                for name in INCLUDE.findall(text):
                    local = os.path.exists(os.path.join(d, name))
                    if name in internal and not local:
                        bad.append("%s includes core-internal \"%s\""
                                   % (os.path.relpath(path, root), name))
    for b in bad:
        print("FAIL:", b)
    print("%d files outside core/ checked, %d include a core-internal header"
          % (checked, len(bad)))
    return 1 if bad or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
