#!/usr/bin/env python3
"""Writes libloom's linker version script: the functions include/loom.h
declares are global, everything else in the library is local.

Usage: libloom_map.py include/loom.h OUT.map
"""
import re
import sys


def api_functions(header):
    """Names of the functions declared at file scope of a C header."""
    text = open(header).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"^\s*#[^\n]*(\\\n[^\n]*)*", " ", text, flags=re.M)
    text = re.sub(r"extern\s*\"C\"\s*{", " ", text)
    names, depth = [], 0
    for tok in re.finditer(r"[{}]|\b[A-Za-z_]\w*\s*\(", text):
        t = tok.group(0)
        if t == "{":
            depth += 1
        elif t == "}":
            depth = max(depth - 1, 0)
        elif depth == 0:
            name = t.rstrip("( \t\n")
            # loom_ is the one public prefix; "void (*fn)(" is no function
            if name.startswith("loom_") and name not in names:
                names.append(name)
    return names


def main():
    header, out = sys.argv[1:3]
    names = api_functions(header)
    if not names:
        sys.exit(header + ": no function declarations found")
    with open(out, "w") as f:
        f.write("/* made by core/libloom_map.py from include/loom.h */\nLOOM_0 {\n  global:\n")
        for n in names:
            f.write("    %s;\n" % n)
        f.write("  local:\n    *;\n};\n")


if __name__ == "__main__":
    main()
