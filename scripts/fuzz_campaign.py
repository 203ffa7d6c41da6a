#!/usr/bin/env python3
"""A long fuzzing campaign over the libFuzzer harnesses (docs/TESTING.md,
"Fuzzing"): far more executions than the suite's 3 seconds each.

  scripts/fuzz_campaign.py [--build build] [--out build/fuzz-campaign]
                           [--execs 10000000] [--seconds 86400]
                           [--slice 600] [--nice 19] [--timeout 20] [NAME...]

NAME: gguf, tokenizer, request, grammar, options, template (default: all six). Each
harness runs until it has --execs executions in total (over every run of
the campaign with the same --out, so a campaign can be resumed) or the
time budget ends. The budget (--seconds, for the whole campaign) is spent
in slices of --slice seconds, round-robin over the harnesses still short
of their target, one process at a time at nice --nice, so it never takes
more than one core from the rest of the machine.

Each harness keeps a growing corpus in OUT/NAME (seeded from
tests/fuzz/corpus/NAME); a crash, leak, timeout (--timeout, 20 s) or sanitizer report
stops that harness and keeps the input as OUT/crash-NAME-*. OUT/totals.tsv
holds the executions so far; the table at the end says, per harness, the
executions, the rate, the corpus and whether anything was found.
Exit status: 1 when something was found, else 0.
"""
import argparse
import os
import re
import subprocess
import sys
import time

HARNESSES = {
    "gguf": "tests/gguf/fuzz_gguf",
    "tokenizer": "tests/fuzz/fuzz_tokenizer",
    "request": "tests/fuzz/fuzz_request",
    "grammar": "tests/fuzz/fuzz_grammar",
    "options": "tests/fuzz/fuzz_options",
    "template": "tests/fuzz/fuzz_template",
}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fuzzer_path(build, name):
    """The harness binary (build_fuzz.py puts them all in tests/fuzz)."""
    for rel in (HARNESSES[name], os.path.join("tests/fuzz", "fuzz_" + name)):
        path = os.path.join(build, rel)
        if os.path.exists(path):
            return path
    sys.exit(f"fuzz_campaign: no {name} harness under {build} (configure with -Dfuzz=enabled)")


def load_totals(path):
    totals = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                name, execs, secs, found = line.rstrip("\n").split("\t")
                totals[name] = [int(execs), float(secs), found]
    return totals


def save_totals(path, totals):
    with open(path + ".new", "w") as f:
        for name, (execs, secs, found) in sorted(totals.items()):
            f.write(f"{name}\t{execs}\t{secs:.1f}\t{found}\n")
    os.replace(path + ".new", path)


def run_slice(args, name, runs, seconds):
    """One libFuzzer run: (executions, seconds, what it found or '')."""
    corpus = os.path.join(args.out, name)
    os.makedirs(corpus, exist_ok=True)
    art = os.path.join(args.out, f"crash-{name}-")
    cmd = ["nice", "-n", str(args.nice), fuzzer_path(args.build, name),
           f"-runs={runs}", f"-max_total_time={int(seconds)}", f"-timeout={args.timeout}",
           "-rss_limit_mb=2048", "-max_len=8192", "-print_final_stats=1",
           f"-artifact_prefix={art}", corpus, os.path.join(ROOT, "tests/fuzz/corpus", name)]
    env = dict(os.environ, LOOM_SHARED_DIR=os.environ.get(
        "LOOM_SHARED_DIR", os.path.join(ROOT, "..", "shared")))
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    took = time.time() - t0
    m = re.search(r"stat::number_of_executed_units:\s*(\d+)", p.stderr)
    execs = int(m.group(1)) if m else 0
    found = ""
    if p.returncode != 0:
        kind = re.search(r"ERROR: (?:libFuzzer|AddressSanitizer|LeakSanitizer): ([^\n]*)",
                         p.stderr)
        found = (kind.group(1) if kind else f"exit {p.returncode}")[:120]
        with open(os.path.join(args.out, f"log-{name}-{int(t0)}.txt"), "w") as f:
            f.write(p.stderr)
    return execs, took, found


def report(totals, names, out):
    print(f"\nfuzz campaign ({out}):")
    print(f"{'harness':10} {'executions':>12} {'seconds':>9} {'exec/s':>8} {'corpus':>7}  found")
    for name in names:
        execs, secs, found = totals.get(name, [0, 0.0, ""])
        corpus = os.path.join(out, name)
        n = len(os.listdir(corpus)) if os.path.isdir(corpus) else 0
        rate = execs / secs if secs else 0
        print(f"{name:10} {execs:12d} {secs:9.0f} {rate:8.0f} {n:7d}  {found or 'nothing'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--execs", type=int, default=10_000_000, help="target per harness")
    ap.add_argument("--seconds", type=float, default=86400, help="budget for the campaign")
    ap.add_argument("--slice", type=float, default=600, help="seconds of one run")
    ap.add_argument("--nice", type=int, default=19)
    # libFuzzer's timeout is wall-clock: at nice 19 beside busy builds an
    # input of 100 ms has taken 20 s (docs/TESTING.md); a longer one keeps
    # starvation from passing for a hang
    ap.add_argument("--timeout", type=int, default=20, help="seconds an input may take")
    ap.add_argument("names", nargs="*", metavar="NAME")
    args = ap.parse_args()
    names = args.names or list(HARNESSES)
    for n in names:
        if n not in HARNESSES:
            sys.exit(f"fuzz_campaign: no harness {n} (have {', '.join(HARNESSES)})")
    args.out = args.out or os.path.join(args.build, "fuzz-campaign")
    os.makedirs(args.out, exist_ok=True)
    tpath = os.path.join(args.out, "totals.tsv")
    totals = load_totals(tpath)
    end = time.time() + args.seconds
    while time.time() < end - 1:
        todo = [n for n in names if totals.get(n, [0, 0, ""])[0] < args.execs
                and not totals.get(n, [0, 0, ""])[2]]
        if not todo:
            break
        for name in todo:
            left = end - time.time()
            if left < 1:
                break
            t = totals.setdefault(name, [0, 0.0, ""])
            execs, took, found = run_slice(args, name, args.execs - t[0], min(args.slice, left))
            t[0] += execs
            t[1] += took
            t[2] = found
            save_totals(tpath, totals)
            print(f"{name}: +{execs} executions in {took:.0f} s (total {t[0]})"
                  + (f"; FOUND: {found}" if found else ""), flush=True)
    report(totals, names, args.out)
    return 1 if any(totals.get(n, [0, 0, ""])[2] for n in names) else 0


if __name__ == "__main__":
    sys.exit(main())
