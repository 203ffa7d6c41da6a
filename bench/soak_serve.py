#!/usr/bin/env python3
"""Soak `loom serve`: thousands of requests of every shape, then the
server's memory. Python standard library only.

    python3 bench/soak_serve.py --loom build/tools/loom \
        --model ~/.cache/loom/SmolLM2-135M-Instruct.Q4_1.gguf --requests 4000

starts a server (or --port N: one already running; RSS then needs --pid),
sends --requests requests from --concurrency threads, and prints the
server's RSS after the warm-up (--warmup requests) and at the end. The mix,
in turn: streamed and whole answers, chat and completions, with and
without logprobs (top_logprobs 2), n=1 and n=2, clients that leave a
stream after its first chunk, clients that close a whole-answer request
right after sending it, bad JSON, a prompt too long for the context, and
/tokenize. With the server it started, it stops it (SIGTERM) and counts
LeakSanitizer's reports on its stderr (an AddressSanitizer build:
scripts/asan.sh, or meson setup -Db_sanitize=address).

Exit status 0 when every request got the answer its kind expects, the
server exited 0 and reported no leak, and RSS grew by at most --max-growth
MiB between the warm-up and the end.
"""
import argparse
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

KINDS = ("stream", "whole", "chat_stream", "chat_whole", "logprobs_stream", "logprobs_whole",
         "chat_logprobs_stream", "n2_whole", "leave_stream", "leave_whole", "bad_json",
         "too_long", "tokenize")


def body_for(kind, i, max_tokens):
    prompt = f"Request {i}: tell me about the number {i % 97}"
    chat = kind.startswith("chat")
    b = {"max_tokens": max_tokens, "temperature": 0.7, "seed": i}
    if chat:
        b["messages"] = [{"role": "user", "content": prompt}]
    else:
        b["prompt"] = prompt
    if "stream" in kind:
        b["stream"] = True
        b["stream_options"] = {"include_usage": True}
    if "logprobs" in kind:
        b["logprobs"] = True if chat else 2
        if chat:
            b["top_logprobs"] = 2
    if kind == "n2_whole":
        b["n"] = 2
    if kind == "too_long":
        b["prompt"] = "word " * 100000
    return b


def path_for(kind):
    if kind == "tokenize":
        return "/tokenize"
    return "/v1/chat/completions" if kind.startswith("chat") else "/v1/completions"


def send_raw(port, path, data):
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def one(port, kind, i, max_tokens):
    """Sends request i of kind; True when it was answered as expected."""
    if kind == "tokenize":
        data = json.dumps({"content": f"soak {i} <|im_start|> text"}).encode()
    elif kind == "bad_json":
        data = b'{"prompt": "x", "max_tokens": '
    else:
        data = json.dumps(body_for(kind, i, max_tokens)).encode()
    path = path_for(kind)
    if kind == "leave_whole":
        send_raw(port, "/v1/completions", data).close()
        return True
    if kind == "leave_stream":
        s = send_raw(port, "/v1/completions",
                     json.dumps(dict(body_for("stream", i, max_tokens * 4))).encode())
        got = s.recv(4096)
        s.close()
        return got.startswith(b"HTTP/1.1 200")
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.read()
    c.close()
    if kind in ("bad_json", "too_long"):
        return r.status == 400
    if r.status != 200:
        return False
    return b"[DONE]" in out if "stream" in kind else out.startswith(b"{")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def run_load(port, start, count, concurrency, max_tokens, errors):
    """Requests start .. start + count - 1, kinds in turn, concurrency at once."""
    lock = threading.Lock()
    state = {"next": start}

    def worker():
        while True:
            with lock:
                i = state["next"]
                if i >= start + count:
                    return
                state["next"] += 1
            kind = KINDS[i % len(KINDS)]
            try:
                ok = one(port, kind, i, max_tokens)
            except OSError as e:
                ok = False
                kind += f" ({e!r})"
            if not ok:
                with lock:
                    errors.append(f"{i} {kind}")

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def wait_idle(port, timeout=60):
    """Until no request runs or waits (the left clients' requests cancelled)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        vals = dict(line.split() for line in text.splitlines()
                    if line.startswith(("loom_requests_running ", "loom_requests_waiting ")))
        if all(float(v) == 0 for v in vals.values()):
            return True
        time.sleep(0.1)
    return False


def leak_count(stderr):
    """LeakSanitizer's reports: each 'Direct leak' / 'Indirect leak' block."""
    return len(re.findall(r"^(Direct|Indirect) leak of", stderr, re.M))


def start_server(loom, model, port, extra):
    log = tempfile.TemporaryFile()
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
    env.pop("MALLOC_PERTURB_", None)  # meson test's: it touches every block, blurring RSS
    # a fixed mmap threshold: the big bodies' buffers go back to the system
    # when freed (glibc's sliding threshold would keep them in the heap),
    # so RSS measures what stays
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    proc = subprocess.Popen([loom, "serve", "--model", model, "--port", str(port), "-t", "2",
                             "--ctx-size", "512", "--parallel", "8", "--kv-mem", "16M", *extra],
                            stdout=subprocess.DEVNULL, stderr=log, env=env)
    t0 = time.time()
    while time.time() - t0 < 120:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError("loom serve exited: " + log.read().decode(errors="replace"))
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc, log
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("loom serve never became ready")


def soak(port, pid, requests, warmup, concurrency, max_tokens):
    """Warm-up, then the rest; returns a dict of figures."""
    errors = []
    t0 = time.time()
    run_load(port, 0, warmup, concurrency, max_tokens, errors)
    wait_idle(port)
    rss = [rss_kib(pid) if pid else -1]
    step = max((requests - warmup) // 4, 1)
    idle = True
    for start in range(warmup, requests, step):
        run_load(port, start, min(step, requests - start), concurrency, max_tokens, errors)
        idle = wait_idle(port) and idle
        rss.append(rss_kib(pid) if pid else -1)
    return {"requests": requests, "warmup": warmup, "seconds": time.time() - t0,
            "rss_after_warmup_kib": rss[0], "rss_end_kib": rss[-1], "rss_kib": rss,
            "errors": errors, "idle_at_end": idle}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loom", default="build/tools/loom")
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/loom/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--port", type=int, default=0, help="a server already running")
    ap.add_argument("--pid", type=int, default=0, help="its pid, for RSS")
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--warmup", type=int, default=0, help="default: a quarter")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--max-growth", type=float, default=8.0, help="MiB")
    a = ap.parse_args()
    warmup = a.warmup or a.requests // 4
    proc = log = None
    port, pid = a.port, a.pid
    if not port:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                        "tests"))
        from ports import free_port
        port = free_port()
        proc, log = start_server(a.loom, a.model, port, [])
        pid = proc.pid
    r = soak(port, pid, a.requests, warmup, a.concurrency, a.max_tokens)
    rc = 0
    leaks = None
    if proc:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        log.seek(0)
        stderr = log.read().decode(errors="replace")
        leaks = leak_count(stderr)
        if leaks:
            print(stderr[-4000:], file=sys.stderr)
    growth = (r["rss_end_kib"] - r["rss_after_warmup_kib"]) / 1024
    print(f"requests {r['requests']} (warm-up {r['warmup']}, concurrency {a.concurrency}) "
          f"in {r['seconds']:.0f} s; unexpected answers {len(r['errors'])}; "
          f"RSS after warm-up {r['rss_after_warmup_kib'] / 1024:.1f} MiB, "
          f"at the end {r['rss_end_kib'] / 1024:.1f} MiB ({growth:+.1f} MiB); "
          f"server exit {rc}; leaks {leaks if leaks is not None else 'n/a'}")
    print("RSS (MiB) after the warm-up and each quarter: " +
          " ".join(f"{k / 1024:.1f}" for k in r["rss_kib"]))
    for e in r["errors"][:10]:
        print("unexpected:", e)
    ok = (not r["errors"] and r["idle_at_end"] and rc == 0 and not leaks and
          (not pid or growth <= a.max_growth))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
