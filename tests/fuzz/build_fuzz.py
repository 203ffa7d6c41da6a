#!/usr/bin/env python3
"""Builds with clang what meson's C compiler (gcc) cannot: libFuzzer
harnesses instrumented for coverage, ASan and UBSan.

  build_fuzz.py lib CLANG OUT.a   -- CFLAGS... -- SOURCES...
  build_fuzz.py exe CLANG OUT     -- CFLAGS... -- SOURCES_AND_ARCHIVES... -- LIBS...

Objects go to OUT.d/ and are rebuilt only when their source or a header
they include changed. Sources compile two at a time (the test machine is
shared); a failed compile prints clang's message and exits non-zero.
"""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

SAN = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
       "-fno-omit-frame-pointer", "-g", "-O1"]
# Sources whose comparisons are not traced (edges still are): the grammar
# matcher compares its own derived states, not input bytes, and tracing
# them took a third of fuzz_grammar's time (docs/TESTING.md).
NO_TRACE_CMP = {"grammar.c"}


def split(args):
    """The groups between '--' separators."""
    groups, cur = [], []
    for a in args:
        if a == "--":
            groups.append(cur)
            cur = []
        else:
            cur.append(a)
    groups.append(cur)
    return groups


def up_to_date(obj, cflags):
    """obj is newer than its source and headers (clang's -MMD list) and was
    built with the same flags."""
    dep, flags = obj + ".d", obj + ".flags"
    try:
        with open(flags) as f:
            if f.read() != repr(cflags):
                return False
        with open(dep) as f:
            files = f.read().replace("\\\n", " ").split(":", 1)[1].split()
        # an ignorelist changes the objects as a header does
        files += [f.split("=", 1)[1] for f in cflags if f.startswith("-fsanitize-coverage-ignorelist=")]
        t = os.path.getmtime(obj)
        return all(os.path.getmtime(x) <= t for x in files)
    except (OSError, IndexError):
        return False


def compile_all(clang, out, cflags, sources):
    objdir = out + ".d"
    os.makedirs(objdir, exist_ok=True)

    def one(src):
        obj = os.path.join(objdir, os.path.basename(src) + ".o")
        if up_to_date(obj, cflags):
            return obj
        extra = ["-fno-sanitize-coverage=trace-cmp"] if os.path.basename(src) in NO_TRACE_CMP else []
        cmd = [clang, "-c", *SAN, "-fsanitize=fuzzer-no-link", *extra, *cflags, src, "-o", obj,
               "-MMD", "-MF", obj + ".d"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            sys.stderr.write(" ".join(cmd) + "\n" + p.stderr)
            raise SystemExit(1)
        with open(obj + ".flags", "w") as f:
            f.write(repr(cflags))
        return obj
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(one, sources))


def main():
    mode, clang, out = sys.argv[1:4]
    groups = split(sys.argv[4:])
    cflags = groups[1]
    inputs = groups[2]
    if mode == "lib":
        objs = compile_all(clang, out, cflags, inputs)
        if os.path.exists(out):
            os.remove(out)
        subprocess.run(["ar", "rcs", out, *objs], check=True)
        return 0
    libs = groups[3] if len(groups) > 3 else []
    sources = [i for i in inputs if i.endswith(".c")]
    archives = [i for i in inputs if not i.endswith(".c")]
    objs = compile_all(clang, out, cflags, sources)
    cmd = [clang, *SAN, "-fsanitize=fuzzer", *objs, *archives, *libs, "-o", out]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.stderr.write(" ".join(cmd) + "\n" + p.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
