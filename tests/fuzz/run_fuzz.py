#!/usr/bin/env python3
"""Runs one libFuzzer harness for a fixed time over its saved corpus.

  run_fuzz.py FUZZER CORPUS_DIR SECONDS [NEEDED_FILE...]

Every saved input runs first, then libFuzzer mutates for SECONDS. New
inputs go to a temporary folder (the saved corpus is not changed); a
crash, leak, timeout or sanitizer report fails the test, and the input is
kept as build/tests/fuzz/crash-NAME-* to add to the corpus once fixed.
Skips (77) when a needed file (the test vocabularies) is missing.
"""
import os
import re
import subprocess
import sys
import tempfile


def main():
    fuzzer, corpus, seconds = sys.argv[1], sys.argv[2], sys.argv[3]
    for need in sys.argv[4:]:
        if not os.path.exists(need):
            print(f"skip: {need} not found")
            return 77
    name = os.path.basename(fuzzer)
    art = os.path.join(os.path.dirname(os.path.abspath(fuzzer)), f"crash-{name}-")
    n_saved = len(os.listdir(corpus))
    with tempfile.TemporaryDirectory() as new:
        cmd = [fuzzer, f"-max_total_time={seconds}", "-timeout=20", "-rss_limit_mb=2048",
               "-max_len=8192", "-print_final_stats=1", f"-artifact_prefix={art}", new, corpus]
        p = subprocess.run(cmd, capture_output=True, text=True)
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", p.stderr)
    runs = int(runs.group(1)) if runs else 0
    if p.returncode != 0:
        sys.stdout.write(p.stderr[-20000:])
        print(f"FAIL {name}: exit {p.returncode}; the input is under {art}*")
        return 1
    if runs < n_saved:
        sys.stdout.write(p.stderr[-5000:])
        print(f"FAIL {name}: {runs} inputs ran, fewer than the {n_saved} saved")
        return 1
    print(f"{name}: {runs} inputs in {seconds} s ({n_saved} saved), no crash")
    return 0


if __name__ == "__main__":
    sys.exit(main())
