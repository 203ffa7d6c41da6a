#!/usr/bin/env python3
"""Interleaved `loom run` timings of speculative strategies on the prompts
in bench/prompts/: each round runs every (prompt, variant) once, in order,
so load from other work falls on all alike; prints the median decode t/s
(range) and the spec line's figures per pair.

usage: spec_interleaved.py MODEL ROUNDS VARIANT... where a VARIANT is
NAME=LOOM[:ARGS] (ARGS space-separated, e.g. "ngram=build/tools/loom:--spec=ngram.so")
Environment: PROMPTS (default copy,chat,chat_replay), N (128), THREADS (1).
"""
import os
import re
import statistics
import subprocess
import sys


def run(loom, args, model, prompt, n, threads):
    cmd = [loom, "run", "--model", model, "-f", prompt, "-n", str(n), "--temp", "0",
           "-t", str(threads), "--no-progress"] + args
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    tps = float(re.search(r"generated \d+ tokens in [\d.]+ s \(([\d.]+) t/s\)", p.stderr).group(1))
    spec = re.search(r"acceptance ([\d.]+)%.*?([\d.]+) tokens per target pass", p.stderr)
    return tps, (spec.group(1) + "%", spec.group(2)) if spec else ("-", "1.00"), p.stdout


def main():
    model, rounds = sys.argv[1], int(sys.argv[2])
    variants = []
    for v in sys.argv[3:]:
        name, rest = v.split("=", 1)
        loom, _, args = rest.partition(":")
        variants.append((name, loom, args.split()))
    here = os.path.dirname(os.path.abspath(__file__))
    prompts = os.environ.get("PROMPTS", "copy,chat,chat_replay").split(",")
    n, threads = int(os.environ.get("N", "128")), int(os.environ.get("THREADS", "1"))
    res = {}
    for _ in range(rounds):
        for pr in prompts:
            for name, loom, args in variants:
                path = os.path.join(here, "prompts", pr + ".txt")
                res.setdefault((pr, name), []).append(run(loom, args, model, path, n, threads))
    for pr in prompts:
        base = statistics.median(r[0] for r in res[(pr, variants[0][0])])
        outs = {r[2] for name, _, _ in variants for r in res[(pr, name)]}
        for name, _, _ in variants:
            t = [r[0] for r in res[(pr, name)]]
            m = statistics.median(t)
            acc, tpp = res[(pr, name)][0][1]
            print(f"| {pr} | {name} | {m:.1f} ({min(t):.1f}-{max(t):.1f}) | {m / base:.2f}x | {acc} | {tpp} |")
        print(f"| {pr} | outputs identical across variants: {len(outs) == 1} | | | | |")


if __name__ == "__main__":
    main()
