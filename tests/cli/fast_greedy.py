#!/usr/bin/env python3
"""Fast mode (the default: 8-bit activations, integer dots in cpu.so) is
deterministic: greedy `loom run` gives the same tokens and bytes run after
run and for -t 1 and -t 2, since each activation row is quantized by the
same code whichever thread runs it and weight rows, never k, are split
over threads.
Usage: fast_greedy.py LOOM_EXE (LOOM_MODEL names the model).
"""
import os
import subprocess
import sys
import tempfile

PROMPTS = [
    "The capital of France is",
    "def fib(n):\n    if n < 2:\n        return n\n",
]
SETTINGS = [["-t", "2"], ["-t", "2"], ["-t", "1"], ["-t", "2", "-b", "8"]]


def run(loom, model, prompt, extra, tmp):
    out = os.path.join(tmp, "tokens")
    cmd = [loom, "run", "--model", model, "-p", prompt, "-n", "32", "--temp", "0",
           "--no-progress", "--dump-tokens", out] + extra
    env = dict(os.environ)
    env.pop("LOOM_CPU_EXACT", None)
    env.pop("LOOM_BACKEND_EXACT", None)
    p = subprocess.run(cmd, capture_output=True, timeout=300, env=env)
    if p.returncode != 0:
        sys.exit("FAIL: %s\n%s" % (" ".join(extra), p.stderr.decode(errors="replace")))
    with open(out) as f:
        return p.stdout, f.read().split()


def main():
    loom = sys.argv[1]
    model = os.environ.get("LOOM_MODEL", "")
    if not os.path.isfile(model):
        print("model %s not found; set LOOM_MODEL" % model)
        return 77
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for prompt in PROMPTS:
            first = run(loom, model, prompt, SETTINGS[0], tmp)
            for extra in SETTINGS[1:]:
                got = run(loom, model, prompt, extra, tmp)
                if got != first:
                    bad += 1
                    print("MISMATCH %r %s\n  want %s\n  got  %s"
                          % (prompt[:30], extra, first[1], got[1]))
            print("%r: %d tokens, %s" % (prompt[:30], len(first[1]), first[0][:60]))
    print("%d mismatches" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
