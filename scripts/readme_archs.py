#!/usr/bin/env python3
"""Rewrites README.md's coverage tables with `loom info --archs`.

Usage: scripts/readme_archs.py LOOM_BINARY [README]

The block between the markers below is the command's output verbatim;
tests/cli (test_cli.py) fails while the two differ, so run this after
adding an architecture descriptor or a tokenizer family.
"""
import subprocess
import sys

BEGIN = "<!-- begin: loom info --archs -->\n"
END = "<!-- end: loom info --archs -->\n"


def block(loom):
    out = subprocess.run([loom, "info", "--archs"], check=True,
                         capture_output=True, text=True).stdout
    return BEGIN + out + END


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__)
        return 2
    path = sys.argv[2] if len(sys.argv) == 3 else "README.md"
    with open(path) as f:
        text = f.read()
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        print("%s: markers not found" % path)
        return 1
    text = text[:i] + block(sys.argv[1]) + text[j + len(END):]
    with open(path, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
