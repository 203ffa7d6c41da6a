#!/usr/bin/env python3
"""What logprobs and embeddings cost a running `loom serve`.

    bench/api_cost.py PORT [ROUNDS]

Against a server on 127.0.0.1:PORT (any model), interleaved, ROUNDS
(default 4) times each:
  - greedy completions of 64 tokens plain, with logprobs 5 and with
    logprobs 20: tokens per second of the request (the log-softmax and the
    top-N search per token are the difference);
  - /v1/embeddings of 4 copies of a ~70-token input, against scoring the
    same rows with echo + logprobs and max_tokens 0: the output layer runs
    on every row for the second, not for the first.
Prints the medians and every run. Timings on a shared machine move with
its load: compare the ratios of one run, not figures across runs.
"""
import http.client
import json
import sys
import time


def post(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = json.loads(r.read())
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}: {data}")
    return data


def timed(fn):
    t0 = time.time()
    n = fn()
    return n / (time.time() - t0)


def show(name, runs):
    runs = sorted(runs)
    print(f"{name}: median {runs[len(runs) // 2]:.1f} tok/s, runs {['%.1f' % x for x in runs]}")
    return runs[len(runs) // 2]


def main():
    port = int(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    base = {"prompt": "Once upon a time, in a land far away,", "max_tokens": 64, "temperature": 0}
    modes = (("plain", {}), ("logprobs 5", {"logprobs": 5}), ("logprobs 20", {"logprobs": 20}))
    gen = {name: [] for name, _ in modes}
    text = ("In the morning, the sun rises in the east and the birds begin to sing. The farmer "
            "walks to the field with his dog, and the children go to school. ") * 2
    ids = post(port, "/tokenize", {"content": text})["tokens"]
    emb, score = [], []
    for _ in range(rounds):
        for name, extra in modes:
            gen[name].append(timed(lambda: post(port, "/v1/completions", dict(base, **extra))
                                   ["usage"]["completion_tokens"]))
        emb.append(timed(lambda: post(port, "/v1/embeddings", {"input": [ids] * 4})
                         ["usage"]["prompt_tokens"]))
        score.append(timed(lambda: post(port, "/v1/completions", {
            "prompt": [ids] * 4, "max_tokens": 0, "echo": True, "logprobs": 0})
            ["usage"]["prompt_tokens"]))
    plain = show("completions, plain", gen["plain"])
    for name in ("logprobs 5", "logprobs 20"):
        print(f"  ratio to plain: {show('completions, ' + name, gen[name]) / plain:.2f}")
    e = show(f"embeddings, 4 x {len(ids)} tokens", emb)
    s = show(f"echo scoring, 4 x {len(ids)} tokens", score)
    print(f"  embeddings / scoring: {e / s:.2f}")


if __name__ == "__main__":
    main()
