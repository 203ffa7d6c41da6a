#!/usr/bin/env python3
"""`loom run` seeds from the clock unless --seed is given, prints the seed
(`seed: N` on stderr), and --seed with a printed seed reproduces the run.

Usage: test_seed.py LOOM_BINARY   (model: $LOOM_MODEL)
"""
import os
import re
import subprocess
import sys

LOOM = sys.argv[1] if len(sys.argv) > 1 else "loom"
MODEL = os.environ.get("LOOM_MODEL", "")


def run(*extra):
    r = subprocess.run([LOOM, "run", "--model", MODEL, "-p", "Once upon a time", "-n", "12",
                        "--temp", "1.5", "-t", "2", "--no-progress", *extra],
                       capture_output=True, text=True, timeout=120)
    if r.returncode:
        raise RuntimeError(r.stderr)
    m = re.search(r"^seed: (\d+)$", r.stderr, re.M)
    return (int(m.group(1)) if m else None), r.stdout


def main():
    if not MODEL or not os.path.exists(MODEL):
        print(f"skip: model not found ({MODEL or '$LOOM_MODEL unset'})")
        return 77
    runs = [run() for _ in range(3)]
    seeds = [s for s, _ in runs]
    bad = []
    if None in seeds or len(set(seeds)) != 3:
        bad.append(f"clock seeds printed and distinct: {seeds}")
    if len({out for _, out in runs}) < 2:
        bad.append(f"three clock-seeded runs gave the same text: {runs[0][1]!r}")
    for s, out in runs[:2]:
        s2, out2 = run("--seed", str(s))
        if s2 != s or out2 != out:
            bad.append(f"--seed {s} did not reproduce: {out!r} vs {out2!r} (printed {s2})")
    s0, a = run("--seed", "0")
    _, b = run("--seed", "0")
    if s0 != 0 or a != b:
        bad.append(f"--seed 0 printed {s0} or differed: {a!r} vs {b!r}")
    for line in bad:
        print("FAIL:", line)
    print(f"seeds {seeds}; {'ok' if not bad else 'failed'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
