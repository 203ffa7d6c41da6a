#!/usr/bin/env python3
"""Fast mode (the default: 8-bit activations, integer dots in cpu.so) is
deterministic: greedy `loom run` gives the same tokens and bytes run after
run and for -t 1 and -t 2, since each activation row is quantized by the
same code whichever thread runs it and weight rows, never k, are split
over threads. Prefill in chunks (-b 8) gives the same tokens as one batch
under batch invariance (LOOM_CPU_INVARIANT=1, what serve asks for); without
it, a prompt of 16 or more rows takes another kernel (qgemm) than rows of
8 (GEMV), whose logits differ by about 0.1-0.4 on SmolLM2 (8-bit
activations), so only near-ties could tell them apart and the tokens are
not promised equal (docs/ARCHITECTURE.md, "Determinism").
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
# (extra flags, batch invariant): each group's later settings against its first
GROUPS = [
    [(["-t", "2"], False), (["-t", "2"], False), (["-t", "1"], False)],
    [(["-t", "2"], True), (["-t", "2", "-b", "8"], True), (["-t", "1", "-b", "8"], True)],
]


def run(loom, model, prompt, setting, tmp):
    extra, invariant = setting
    out = os.path.join(tmp, "tokens")
    cmd = [loom, "run", "--model", model, "-p", prompt, "-n", "32", "--temp", "0",
           "--no-progress", "--dump-tokens", out] + extra
    env = dict(os.environ)
    env.pop("LOOM_CPU_EXACT", None)
    env.pop("LOOM_BACKEND_EXACT", None)
    env.pop("LOOM_CPU_INVARIANT", None)
    if invariant:
        env["LOOM_CPU_INVARIANT"] = "1"
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
            for group in GROUPS:
                first = run(loom, model, prompt, group[0], tmp)
                for setting in group[1:]:
                    got = run(loom, model, prompt, setting, tmp)
                    if got != first:
                        bad += 1
                        print("MISMATCH %r %s\n  want %s\n  got  %s"
                              % (prompt[:30], setting, first[1], got[1]))
                print("%r (invariant: %s): %d tokens, %s"
                      % (prompt[:30], group[0][1], len(first[1]), first[0][:60]))
    print("%d mismatches" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
