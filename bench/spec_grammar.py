#!/usr/bin/env python3
"""JSON-schema requests with and without speculative token trees (issue 35):
`loom run --json-schema tests/grammar/person.schema.json` on the
JSON-copy prompts of tests/spec/test_tree_greedy.py, plain, with
ngram.so's chains and with its trees (--spec-tree 8 and 16), ROUNDS
rounds interleaved (default 3). Prints per prompt and mode the generated
tokens, the median generation time (min-max), tokens/s at the median,
tokens per target pass and the drafts accepted.
Usage (repo root): bench/spec_grammar.py LOOM MODEL [BACKEND ARGS...]
"""
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "spec"))
import test_tree_greedy as t  # noqa: E402

MODES = [("plain", []), ("chain", ["--spec=ngram.so"]),
         ("tree8", ["--spec=ngram.so", "--spec-tree", "8"]),
         ("tree16", ["--spec=ngram.so", "--spec-tree", "16"])]


def main():
    loom, model, backend = sys.argv[1], sys.argv[2], sys.argv[3:] or ["--backend", "cpu.so"]
    rounds = int(os.environ.get("ROUNDS", "3"))
    res = {}
    for _ in range(rounds):
        for i, p in enumerate(t.GRAMMAR_PROMPTS):
            for name, extra in MODES:
                cmd = [loom, "run", "--model", model, "-p", p, "-n", "80", "--temp", "0",
                       "-t", "1", "--no-progress", "--json-schema", t.SCHEMA] + backend + extra
                e = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
                g = re.search(r"generated (\d+) tokens in ([\d.]+) s", e)
                tp = re.search(r"([\d.]+) tokens per target pass", e)
                d = re.search(r"\((\d+) of (\d+) drafts\)", e)
                res.setdefault((i, name), []).append(
                    (int(g.group(1)), float(g.group(2)), float(tp.group(1)) if tp else 1.0,
                     d.group(0) if d else ""))
    print("| prompt | mode | tokens | gen s median (min-max) | t/s | tokens/pass | drafts |")
    print("|---|---|---|---|---|---|---|")
    for i in range(len(t.GRAMMAR_PROMPTS)):
        for name, _ in MODES:
            v = res[(i, name)]
            ts = [x[1] for x in v]
            med = statistics.median(ts)
            print("| %d | %s | %d | %.3f (%.3f-%.3f) | %.1f | %.2f | %s |"
                  % (i, name, v[0][0], med, min(ts), max(ts), v[0][0] / med, v[0][2], v[0][3]))


if __name__ == "__main__":
    main()
