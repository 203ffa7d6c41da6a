#!/usr/bin/env python3
"""Load generator for `loom serve` (OpenAI-compatible chat completions).

Standard library only: threads + http.client. For each concurrency level C,
C clients each send M streaming requests (temperature 0, fixed max_tokens)
taken in turn from a fixed workload of prompts of varied lengths, and the
tool measures per request the time to first token (TTFT), the gaps between
streamed deltas (inter-token latency, ITL) and the total time. One markdown
table row per level: generated tokens/s over the level's wall time, request
rate, p50/p99 TTFT and ITL, p50 request latency.

--sequential sends the workload of the largest level one request at a time:
the baseline that batching on the server has to beat.

See bench/README.md.
"""
import argparse
import http.client
import json
import sys
import threading
import time

PARAGRAPH = (
    "The history of computing is a history of abstraction layers. Each new "
    "layer hides the details of the one beneath it, so that programmers can "
    "think about larger problems without holding every transistor in mind. "
    "Compilers hide instruction sets, operating systems hide devices, and "
    "libraries hide algorithms behind small, well-named functions. ")

# Prompts of varied lengths: a few words up to a few hundred tokens.
WORKLOAD = [
    "Hi!",
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "List three uses for a paper clip.",
    "Explain in simple terms how a rainbow forms.",
    "Summarize the following text in two sentences.\n\n" + PARAGRAPH,
    "Give me a short recipe for pancakes, with ingredients and steps.",
    "Read this and answer: what do compilers hide?\n\n" + PARAGRAPH * 3,
    "Translate to French: The weather is nice today and I am going out.",
    "Continue this story: The lighthouse keeper heard a knock at midnight.",
    "Summarize the main idea of this passage.\n\n" + PARAGRAPH * 6,
    "What are the planets of the solar system, in order from the sun?",
]


def percentile(values, p):
    """Nearest-rank percentile; None for an empty list."""
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(-(-p * len(v) // 100)) - 1))
    return v[k]


class Result:
    __slots__ = ("ok", "error", "start", "first", "end", "deltas",
                 "tokens", "prompt_tokens", "gaps")

    def __init__(self):
        self.ok = False
        self.error = ""
        self.start = self.first = self.end = 0.0
        self.deltas = 0
        self.tokens = 0
        self.prompt_tokens = None
        self.gaps = []


def one_request(args, model, prompt):
    """Send one streaming chat request; time its deltas."""
    r = Result()
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "stream": True, "max_tokens": args.max_tokens, "temperature": 0,
            "stream_options": {"include_usage": True}}
    data = json.dumps(body).encode()
    conn = http.client.HTTPConnection(args.host, args.port,
                                      timeout=args.timeout)
    usage = None
    last = 0.0
    try:
        r.start = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body=data,
                     headers={"Content-Type": "application/json",
                              "Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status != 200:
            r.error = f"HTTP {resp.status}: {resp.read()[:200]!r}"
            return r
        done = False
        while not done:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            now = time.perf_counter()
            ev = json.loads(payload)
            if "error" in ev:
                r.error = f"stream error: {json.dumps(ev['error'])[:200]}"
                return r
            if ev.get("usage"):
                usage = ev["usage"]
            for c in ev.get("choices") or []:
                text = (c.get("delta") or {}).get("content")
                if not text:
                    continue
                r.deltas += 1
                if not r.first:
                    r.first = now
                else:
                    r.gaps.append(now - last)
                last = now
        r.end = time.perf_counter()
        if not done:
            r.error = "stream ended before [DONE]"
            return r
    except (OSError, http.client.HTTPException, ValueError) as e:
        r.error = f"{type(e).__name__}: {e}"
        return r
    finally:
        conn.close()
    r.tokens = r.deltas
    if usage and isinstance(usage.get("completion_tokens"), int):
        r.tokens = usage["completion_tokens"]
        r.prompt_tokens = usage.get("prompt_tokens")
    r.ok = True
    return r


def run_level(args, model, clients, per_client, offset=0):
    """clients threads, each sending per_client requests; request k of
    the level uses WORKLOAD[(offset + k) % len(WORKLOAD)]."""
    results = [None] * (clients * per_client)

    def client(i):
        for j in range(per_client):
            k = i * per_client + j
            prompt = WORKLOAD[(offset + k) % len(WORKLOAD)]
            results[k] = one_request(args, model, prompt)

    threads = [threading.Thread(target=client, args=(i,))
               for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0


def summarize(label, clients, results, wall):
    ok = [r for r in results if r.ok]
    ttft = [r.first - r.start for r in ok if r.first]
    gaps = [g for r in ok for g in r.gaps]
    lat = [r.end - r.start for r in ok]
    tokens = sum(r.tokens for r in ok)
    ms = lambda v: "-" if v is None else f"{v * 1000:.1f}"  # noqa: E731
    s = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    return {
        "mode": label, "clients": clients, "requests": len(results),
        "errors": len(results) - len(ok), "tokens": tokens,
        "wall_s": wall, "tok_s": tokens / wall if wall > 0 else 0.0,
        "req_s": len(ok) / wall if wall > 0 else 0.0,
        "ttft_p50_ms": ms(percentile(ttft, 50)),
        "ttft_p99_ms": ms(percentile(ttft, 99)),
        "itl_p50_ms": ms(percentile(gaps, 50)),
        "itl_p99_ms": ms(percentile(gaps, 99)),
        "lat_p50_s": s(percentile(lat, 50)),
        # per request, for tools that pool several runs (JSON only)
        "ttft_s_each": ttft,
        "tokens_each": [r.tokens for r in ok],
    }


HEADER = ("| mode | clients | requests | errors | gen tokens | wall s "
          "| tok/s | req/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms "
          "| ITL p99 ms | latency p50 s |")


def row(x):
    return (f"| {x['mode']} | {x['clients']} | {x['requests']} "
            f"| {x['errors']} | {x['tokens']} | {x['wall_s']:.2f} "
            f"| {x['tok_s']:.1f} | {x['req_s']:.2f} | {x['ttft_p50_ms']} "
            f"| {x['ttft_p99_ms']} | {x['itl_p50_ms']} | {x['itl_p99_ms']} "
            f"| {x['lat_p50_s']} |")


def report(rows, summary, results):
    rows.append(summary)
    print(row(summary), flush=True)
    errors = [r.error for r in results if not r.ok]
    if errors:
        print(f"  {len(errors)} errors, first: {errors[0]}", file=sys.stderr)


def server_model(args):
    """The first model id from /v1/models (also checks the server is up)."""
    conn = http.client.HTTPConnection(args.host, args.port, timeout=10)
    try:
        conn.request("GET", "/v1/models")
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise OSError(f"GET /v1/models: HTTP {resp.status}")
        data = json.loads(body).get("data") or [{}]
        return data[0].get("id", "loom")
    finally:
        conn.close()


def parse_levels(text):
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"bad concurrency list: {text!r}")
    return levels


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8093)
    ap.add_argument("--concurrency", type=parse_levels, default=[1, 4, 16],
                    help="comma-separated client counts (default 1,4,16)")
    ap.add_argument("--requests", type=int, default=4, metavar="M",
                    help="requests per client at each level (default 4)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=1,
                    help="unmeasured requests sent first (default 1)")
    ap.add_argument("--timeout", type=float, default=600,
                    help="socket timeout per request, seconds")
    ap.add_argument("--sequential", action="store_true",
                    help="send the largest level's workload one request "
                         "at a time instead of the concurrency sweep")
    ap.add_argument("--json", metavar="FILE",
                    help="also write the rows as JSON to FILE")
    args = ap.parse_args()
    if args.requests < 1 or args.max_tokens < 1:
        ap.error("--requests and --max-tokens must be positive")

    try:
        model = server_model(args)
    except (OSError, ValueError) as e:
        print(f"loadgen: no server at {args.host}:{args.port}: {e}",
              file=sys.stderr)
        return 1
    for i in range(args.warmup):
        one_request(args, model, WORKLOAD[i % len(WORKLOAD)])

    print(f"model {model}, max_tokens {args.max_tokens}, temperature 0, "
          f"{args.requests} requests per client, "
          f"{len(WORKLOAD)} prompts in the workload\n")
    print(HEADER)
    print("|" + "---|" * (HEADER.count("|") - 1))
    rows = []
    if args.sequential:
        n = max(args.concurrency) * args.requests
        results, wall = run_level(args, model, 1, n)
        report(rows, summarize("sequential", 1, results, wall), results)
    else:
        for c in args.concurrency:
            results, wall = run_level(args, model, c, args.requests)
            report(rows, summarize("concurrent", c, results, wall), results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if any(x["errors"] for x in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
