#!/usr/bin/env python3
"""A short soak of loom serve (the long one: bench/soak_serve.py).

Usage: test_serve_soak.py LOOM_BINARY   (model: $LOOM_MODEL)

REQUESTS requests of every kind bench/soak_serve.py sends (streamed and
whole, chat and completions, with and without logprobs, n=2, clients that
leave, bad JSON, prompts too long, /tokenize), WARMUP of them first. Then:
every request answered as its kind expects, nothing left running, the
server exits 0, and
  - in a normal build: RSS grew by at most MAX_GROWTH_MIB after the
    warm-up (the server runs with a fixed glibc mmap threshold, so freed
    big bodies leave RSS): a guard against per-request garbage of ~15 KB
    or more (a job, a prompt); smaller leaks are LeakSanitizer's;
  - in an AddressSanitizer build (scripts/asan.sh): LeakSanitizer reports
    no leak when the server exits (RSS is not checked: ASan's quarantine
    holds freed memory), over ASAN_REQUESTS requests.
"""
import os
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
sys.path.insert(0, os.path.join(HERE, ".."))
import soak_serve  # noqa: E402
from ports import free_port  # noqa: E402

LOOM = sys.argv[1] if len(sys.argv) > 1 else "loom"
MODEL = os.environ.get("LOOM_MODEL", "")
REQUESTS = 182  # 14 rounds of the 13 kinds
WARMUP = 78
MAX_GROWTH_MIB = 1.5  # over 104 requests: ~15 KB a request
ASAN_REQUESTS = 52    # 4 rounds: a sanitized engine steps tens of times slower
ASAN_WARMUP = 26


def sanitized():
    out = subprocess.run(["ldd", LOOM], capture_output=True, text=True).stdout
    return "libasan" in out


def main():
    if not MODEL or not os.path.exists(MODEL):
        print(f"skip: model not found ({MODEL or '$LOOM_MODEL unset'})")
        return 77
    asan = sanitized()
    port = free_port()
    proc, log = soak_serve.start_server(LOOM, MODEL, port, [])
    try:
        r = soak_serve.soak(port, proc.pid, ASAN_REQUESTS if asan else REQUESTS,
                            ASAN_WARMUP if asan else WARMUP, concurrency=4, max_tokens=4)
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(120)
    log.seek(0)
    stderr = log.read().decode(errors="replace")
    leaks = soak_serve.leak_count(stderr)
    growth = (r["rss_kib"][-1] - r["rss_kib"][0]) / 1024
    print(f"{r['requests']} requests in {r['seconds']:.1f} s; RSS (MiB) after the warm-up and "
          "each quarter: " + " ".join(f"{k / 1024:.1f}" for k in r["rss_kib"]) +
          f"; exit {rc}; leaks {leaks}{' (ASan build)' if asan else ''}", flush=True)
    fails = []
    if r["errors"]:
        fails.append(f"unexpected answers: {r['errors'][:5]}")
    if not r["idle_at_end"]:
        fails.append("requests still running at the end")
    if rc != 0:
        fails.append(f"server exit {rc}: {stderr[-1500:]}")
    if leaks:
        fails.append(f"LeakSanitizer: {leaks} leaks: {stderr[-3000:]}")
    if not asan and growth > MAX_GROWTH_MIB:
        fails.append(f"RSS grew {growth:.1f} MiB after the warm-up (at most {MAX_GROWTH_MIB})")
    for f in fails:
        print("FAIL:", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
