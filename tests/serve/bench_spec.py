"""Throughput of a copy-heavy workload through `loom serve`, with and
without ngram speculation (not a test; numbers for docs/SPECULATIVE.md).

usage: bench_spec.py LOOM MODEL [CLIENTS] [ROUNDS] [THREADS]
Environment: SPEC_ARGS, more server flags (e.g. "--spec-tree 12").
Starts one server with --spec=ngram.so; each of CLIENTS threads sends
ROUNDS greedy chat requests ("repeat this paragraph"), first all plain,
then all with "speculative": "ngram", and prints generated tokens per
second of wall time for each pass (three passes each, interleaved).
"""
import json
import os
import sys
import threading
import time

sys.argv = [sys.argv[0], *sys.argv[1:]]
import test_serve as ts  # noqa: E402

import test_serve_spec as tss  # noqa: E402


def one_pass(srv, clients, rounds, spec):
    toks = [0]
    lock = threading.Lock()

    def client(c):
        for r in range(rounds):
            extra = {"speculative": "ngram"} if spec else {}
            out = srv.chat(**dict(tss.copy_req(c + r, **extra), max_tokens=128))
            with lock:
                toks[0] += out["usage"]["completion_tokens"]

    t0 = time.time()
    th = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return toks[0], time.time() - t0


def main():
    ts.MODEL = sys.argv[2]
    clients = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    threads = sys.argv[5] if len(sys.argv) > 5 else "2"
    srv = ts.Server("--ctx-size", "1024", "--parallel", str(clients), "--spec=ngram.so",
                    "-t", threads, *os.environ.get("SPEC_ARGS", "").split())
    try:
        one_pass(srv, clients, 1, False)  # warm-up (prefix cache, pages)
        res = {False: [], True: []}
        for _ in range(3):
            for spec in (False, True):
                n, dt = one_pass(srv, clients, rounds, spec)
                res[spec].append(n / dt)
                print(f"{'ngram' if spec else 'plain'}: {n} tokens in {dt:.2f} s = {n / dt:.1f} t/s",
                      flush=True)
        for spec in (False, True):
            v = sorted(res[spec])
            print(f"{'ngram' if spec else 'plain'} median {v[1]:.1f} t/s (range {v[0]:.1f}-{v[2]:.1f})")
        m = srv.metrics()
        print(json.dumps({k: v for k, v in m.items() if k.startswith("loom_spec_")}, indent=1))
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
