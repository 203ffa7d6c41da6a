#!/usr/bin/env python3
"""KV cache types end to end on the real model ($LOOM_MODEL; skip, exit 77,
when absent). Usage: test_kvq.py LOOM_EXE ppl|greedy|serve

ppl     `loom perplexity --exact` on a Debian licence text (2 chunks of 256
        tokens: exact mode is deterministic, so this is one measurement, not
        a sample): a q8_0 cache within PPL_REL of the f32 cache (issue 15's
        bar). docs/QUANTIZATION.md has the figures over more text; shorter
        chunks put q8_0 0.6 % above f32 on this model.
greedy  greedy `loom run` is repeatable bit for bit with each cache type
        (a second run with 1 thread instead of 2); the default is f16 in fast mode
        and f32 with --exact; the printed plan's bytes per token are the
        model's layers x K,V x the type's row size; bad types are refused
        with a message. (Runs: f16 and q8_0 twice, q4_0 once, exact twice.)
serve   `loom serve` with the same --kv-mem holds 2x the tokens of f32 in
        f16, >= 3.5x in q8_0, >= 7x in q4_0 (the printed plan), and the
        context it admits follows: a token-id prompt longer than the f32
        cache's context is refused there (400) and served with q8_0.
"""
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ports import free_port  # noqa: E402

LOOM = sys.argv[1]
MODEL = os.environ.get("LOOM_MODEL", "")
TEXT = "/usr/share/common-licenses/GPL-3"
PPL_REL = 0.005
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def run(*args, ok=True):
    p = subprocess.run([LOOM, *args], capture_output=True, text=True, timeout=600)
    if ok and p.returncode != 0:
        sys.exit(f"FAIL: loom {' '.join(args)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    return p


def model_geometry():
    from gguf import GGUFReader  # the KV geometry of the model
    r = GGUFReader(MODEL)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()

    def val(key):
        f = r.fields[f"{arch}.{key}"]
        return int(f.parts[f.data[0]][0])

    n_head = val("attention.head_count")
    return val("block_count"), val("attention.head_count_kv") * (val("embedding_length") // n_head)


def row_bytes(kv_type, n):
    return {"f32": 4 * n, "f16": 2 * n, "q8_0": n // 32 * 34, "q4_0": n // 32 * 18}[kv_type]


# ---- ppl ----

def perplexity(kv_type):
    p = run("perplexity", "--model", MODEL, "-f", TEXT, "-c", "256", "--chunks", "2",
            "-t", "2", "--exact", "--kv-type", kv_type)
    m = re.search(r"perplexity: ([0-9.]+)", p.stdout + p.stderr)
    if not m:
        sys.exit(f"FAIL: no perplexity in the output of --kv-type {kv_type}:\n{p.stdout}")
    return float(m.group(1))


def test_ppl():
    base = perplexity("f32")
    for t in ("q8_0",):
        ppl = perplexity(t)
        rel = ppl / base - 1
        check(abs(rel) < PPL_REL, f"perplexity with a {t} cache {ppl:.4f} vs f32 {base:.4f}: "
              f"{100 * rel:+.3f} % (bound {100 * PPL_REL} %)")


# ---- greedy ----

PROMPT = "The three rules of a good kitchen are"


def greedy(tmp, *extra):
    out = os.path.join(tmp, "tokens.txt")
    p = run("run", "--model", MODEL, "-p", PROMPT, "-n", "16", "--temp", "0", "--no-progress",
            "--dump-tokens", out, *extra)
    with open(out) as f:
        return p.stdout, f.read().split(), p.stderr


def plan_of(stderr):
    m = re.search(r"loom: KV cache (\w+), (\d+) bytes/token: (\d+) blocks x (\d+) = (\d+) tokens",
                  stderr)
    return (m.group(1), int(m.group(2)), int(m.group(5))) if m else None


def test_greedy():
    n_layer, kv_dim = model_geometry()
    with tempfile.TemporaryDirectory() as tmp:
        for t in ("f16", "q8_0", "q4_0"):
            # f16 is the fast mode's default: its first run names no type
            a = greedy(tmp, "-t", "2", *(("--kv-type", t) if t != "f16" else ()))
            if t != "q4_0":
                c = greedy(tmp, "--kv-type", t, "-t", "1")
                check(a[0] == c[0] and a[1] == c[1],
                      f"{t}: a second run, with 1 thread instead of 2, repeats bit for bit")
            check(len(a[1]) > 0, f"{t}: tokens generated ({len(a[1])})")
            plan = plan_of(a[2])
            want = n_layer * 2 * row_bytes(t, kv_dim)
            check(plan is not None and plan[0] == t and plan[1] == want,
                  f"{t}: plan {plan} says {want} bytes/token")
        # exact mode defaults to f32; a q8_0 cache agrees on the first tokens
        e32 = greedy(tmp, "--exact")
        plan = plan_of(e32[2])
        check(plan is not None and plan[0] == "f32", f"--exact defaults to f32 ({plan})")
        e8 = greedy(tmp, "--exact", "--kv-type", "q8_0")[1]
        check(e32[1][:4] == e8[:4], f"exact f32 and q8_0 caches agree on the first tokens "
              f"({e32[1][:4]} / {e8[:4]})")
    for bad, why in (("q4_1", "not a KV cache type"), ("bf16", "not a KV cache type")):
        p = run("run", "--model", MODEL, "-p", "x", "-n", "1", "--kv-type", bad, ok=False)
        check(p.returncode != 0 and why in p.stderr and len(p.stderr.splitlines()) == 1,
              f"--kv-type {bad} refused in one line: {p.stderr.strip()!r}")


# ---- serve ----

class Server:
    def __init__(self, *extra):
        self.port = free_port()
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([LOOM, "serve", "--model", MODEL, "--port", str(self.port),
                                      "-t", "2", *extra],
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"FAIL: loom serve exited {self.proc.returncode}: {self.stderr()}")
            try:
                if self.request("GET", "/ready")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        sys.exit("FAIL: loom serve did not become ready")

    def request(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        c.request(method, path, body=json.dumps(body) if body is not None else None,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    def stderr(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def test_serve():
    n_layer, kv_dim = model_geometry()
    block = n_layer * 2 * 16 * row_bytes("f32", kv_dim)
    kv_mem = 8 * block  # 128 tokens as f32
    tokens, ctx = {}, {}
    long_prompt = [1000 + i % 50 for i in range(300)]
    for t in ("f32", "f16", "q8_0", "q4_0"):
        srv = Server("--kv-mem", str(kv_mem), "--kv-type", t, "--parallel", "4")
        try:
            m = re.search(r"KV cache: (\w+), (\d+) bytes/token, (\d+) blocks x (\d+) tokens = "
                          r"(\d+) tokens", srv.stderr())
            check(m is not None and m.group(1) == t, f"{t}: the plan names the type "
                  f"({m.group(0) if m else srv.stderr()[-300:]})")
            if not m:
                continue
            tokens[t] = int(m.group(5))
            st, body = srv.request("GET", "/v1/models")
            ctx[t] = json.loads(body)["data"][0]["max_model_len"] if st == 200 else None
            if t in ("f32", "q8_0"):
                st, body = srv.request("POST", "/v1/completions",
                                       {"prompt": long_prompt, "max_tokens": 4, "temperature": 0})
                want = 400 if t == "f32" else 200
                check(st == want, f"{t}: a 300-token prompt answers {st} (want {want}; "
                      f"context {ctx[t]}): {body[:200]!r}")
        finally:
            srv.stop()
    if len(tokens) == 4:
        base = tokens["f32"]
        for t, least in (("f16", 2.0), ("q8_0", 3.5), ("q4_0", 7.0)):
            check(tokens[t] >= least * base, f"{t} holds {tokens[t]} tokens, "
                  f"{tokens[t] / base:.2f}x f32's {base} in the same --kv-mem (at least {least}x)")
        check(ctx["q8_0"] >= 3.5 * ctx["f32"], f"context admitted: f32 {ctx['f32']}, "
              f"f16 {ctx['f16']}, q8_0 {ctx['q8_0']}, q4_0 {ctx['q4_0']}")


def main():
    if not MODEL or not os.path.exists(MODEL):
        print(f"skip: model not found ({MODEL or '$LOOM_MODEL unset'})")
        return 77
    {"ppl": test_ppl, "greedy": test_greedy, "serve": test_serve}[sys.argv[2]]()
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
