"""`loom serve` end to end: OpenAI shapes, determinism under load,
preemption, prefix cache, disconnects, bad input, stop strings, shutdown.

argv[1] is the loom binary; the model is $LOOM_MODEL (skip, exit 77, when
absent). Standard library only. Expected texts come from the server's own
answer to the same request alone (determinism is the property under test)
or from `loom tokenize` (token counts); stop-string results are cut from an
unstopped answer in Python.
"""
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ports import free_port  # noqa: E402

LOOM = sys.argv[1]
MODEL = os.environ.get("LOOM_MODEL", "")
failures = []
passed = 0
BLOCK_BYTES = None  # bytes of one 16-token KV block, from the model


def check(name, cond, detail=""):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(f"{name}: {detail}")
        print(f"FAIL {name}: {str(detail)[:600]}", flush=True)


class Server:
    def __init__(self, *extra):
        self.port = free_port()
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            # an f32 KV cache: --kv-mem below counts f32 blocks (BLOCK_BYTES)
            [LOOM, "serve", "--model", MODEL, "--port", str(self.port), "-t", "2",
             "--kv-type", "f32", *extra],
            stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"loom serve exited {self.proc.returncode}: {self.stderr()}")
            try:
                if self.get("/ready")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("loom serve never became ready")

    def stderr(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def conn(self, timeout=300):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def get(self, path):
        c = self.conn(10)
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, dict(r.getheaders()), body

    def post(self, path, obj, raw=None, headers=None):
        c = self.conn()
        body = raw if raw is not None else json.dumps(obj).encode()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request("POST", path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict(r.getheaders()), data

    def complete(self, **req):
        st, _, body = self.post("/v1/completions", req)
        if st != 200:
            raise RuntimeError(f"HTTP {st}: {body[:300]}")
        return json.loads(body)

    def chat(self, **req):
        st, _, body = self.post("/v1/chat/completions", req)
        if st != 200:
            raise RuntimeError(f"HTTP {st}: {body[:300]}")
        return json.loads(body)

    def metrics(self):
        st, _, body = self.get("/metrics")
        out = {}
        for line in body.decode().splitlines():
            m = re.match(r"^([a-z_]+)(\{[^}]*\})?\s+(\S+)$", line)
            if m:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        return out

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def sse_events(body):
    """Splits an SSE body into its data payloads; None if malformed."""
    text = body.decode("utf-8")
    if not text.endswith("\n\n"):
        return None
    events = []
    for block in text[:-2].split("\n\n"):
        if not block.startswith("data: ") or "\n" in block:
            return None
        events.append(block[6:])
    return events


def stream(srv, path, req):
    st, hdr, body = srv.post(path, dict(req, stream=True))
    return st, hdr, body


def stream_text(srv, path, req):
    """(text, finish_reasons, deltas, events) of a streamed request."""
    st, hdr, body = stream(srv, path, req)
    if st != 200:
        raise RuntimeError(f"HTTP {st}: {body[:300]}")
    events = sse_events(body)
    if events is None or events[-1] != "[DONE]":
        raise RuntimeError(f"malformed SSE: {body[:300]}")
    texts, deltas, finish = {}, [], {}
    for e in events[:-1]:
        o = json.loads(e)
        for ch in o["choices"]:
            piece = ch["text"] if "text" in ch else ch["delta"].get("content", "")
            piece = piece or ""
            texts[ch["index"]] = texts.get(ch["index"], "") + piece
            if piece:
                deltas.append(piece)
            if ch.get("finish_reason"):
                finish[ch["index"]] = ch["finish_reason"]
    return texts.get(0, ""), finish, deltas, events


def tokenize_count(text):
    p = subprocess.run([LOOM, "tokenize", "--model", MODEL, text], capture_output=True,
                       text=True, timeout=120)
    return len(p.stdout.split())


# ---------------------------------------------------------------- tests


def shapes_and_usage(srv):
    prompt = "The capital of France is"
    r = srv.complete(prompt=prompt, max_tokens=8, temperature=0)
    check("completion object", r.get("object") == "text_completion" and r["id"] and
          isinstance(r.get("created"), int) and isinstance(r.get("model"), str), r)
    ch = r["choices"][0]
    check("completion choice", ch["index"] == 0 and isinstance(ch["text"], str) and
          ch["finish_reason"] in ("stop", "length"), ch)
    u = r["usage"]
    check("usage prompt_tokens", u["prompt_tokens"] == tokenize_count(prompt), (u, tokenize_count(prompt)))
    check("usage completion_tokens", ch["finish_reason"] != "length" or u["completion_tokens"] == 8, u)
    check("usage total", u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u)

    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = srv.chat(messages=msgs, max_tokens=8, temperature=0)
    ch = r["choices"][0]
    check("chat object", r.get("object") == "chat.completion" and
          ch["message"]["role"] == "assistant" and isinstance(ch["message"]["content"], str), r)
    # SmolLM2's template inserts its default system turn (chatml)
    rendered = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?"
                "<|im_end|>\n<|im_start|>assistant\n")
    check("chat template token count", r["usage"]["prompt_tokens"] == tokenize_count(rendered),
          (r["usage"], tokenize_count(rendered)))

    st, _, body = srv.get("/v1/models")
    m = json.loads(body)
    check("models", st == 200 and m["object"] == "list" and m["data"][0]["id"], m)
    st, _, body = srv.get("/health")
    check("health", st == 200 and json.loads(body) == {"status": "ok"}, body)
    st, hdr, body = srv.get("/")
    check("index page", st == 200 and hdr.get("Content-Type", "").startswith("text/html") and
          b"<html" in body.lower(), (st, hdr))


def n_choices(srv):
    r = srv.complete(prompt="Once upon a time", max_tokens=6, temperature=0, n=2)
    chs = sorted(r["choices"], key=lambda c: c["index"])
    check("n=2 choices", [c["index"] for c in chs] == [0, 1], r)
    check("n=2 greedy equal", chs[0]["text"] == chs[1]["text"], chs)
    check("n=2 usage", r["usage"]["completion_tokens"] ==
          sum(6 if c["finish_reason"] == "length" else 0 for c in chs) or
          any(c["finish_reason"] == "stop" for c in chs), r["usage"])
    text, finish, _, _ = stream_text(srv, "/v1/completions",
                                     dict(prompt="Once upon a time", max_tokens=6, temperature=0, n=2))
    check("n=2 streamed", set(finish) == {0, 1}, finish)


def sse_format(srv):
    req = dict(prompt="List three colors:", max_tokens=12, temperature=0)
    whole = srv.complete(**req)["choices"][0]["text"]
    st, hdr, body = stream(srv, "/v1/completions", req)
    check("sse status", st == 200 and hdr.get("Content-Type", "").startswith("text/event-stream"), hdr)
    events = sse_events(body)
    check("sse framing", events is not None and events[-1] == "[DONE]", body[:300])
    if not events:
        return
    objs = [json.loads(e) for e in events[:-1]]
    check("sse chunk objects", all(o["object"] == "text_completion" and o["choices"] for o in objs), objs[:2])
    check("sse one finish", [o["choices"][0]["finish_reason"] for o in objs].count(None) == len(objs) - 1, objs[-1])
    text, _, _, _ = stream_text(srv, "/v1/completions", req)
    check("stream text equals whole", text == whole, (text, whole))

    creq = dict(messages=[{"role": "user", "content": "Say hello."}], max_tokens=10, temperature=0,
                stream_options={"include_usage": True})
    whole = srv.chat(**creq)
    text, finish, _, events = stream_text(srv, "/v1/chat/completions", creq)
    objs = [json.loads(e) for e in events[:-1]]
    check("chat chunks", all(o["object"] == "chat.completion.chunk" for o in objs) and
          objs[0]["choices"][0]["delta"].get("role") == "assistant", objs[:1])
    check("chat stream equals whole", text == whole["choices"][0]["message"]["content"],
          (text, whole["choices"][0]["message"]["content"]))
    check("chat stream usage", objs[-1]["choices"] == [] and objs[-1]["usage"] == whole["usage"],
          (objs[-1], whole["usage"]))


def stop_strings(srv):
    # a continuation: after an instruction the first token is a near-tie
    # between EOS and a newline that fast mode's arithmetic may tip to EOS
    req = dict(prompt="Once upon a time, a cat named Tom", max_tokens=40, temperature=0)
    full, _, deltas, _ = stream_text(srv, "/v1/completions", req)
    # a stop string that starts inside one token's text and ends in a later one
    pos, cut = 0, None
    for i, d in enumerate(deltas[:-2]):
        if len(d) >= 2 and len(deltas[i + 1]) >= 1:
            start = pos + len(d) - 1
            cut = full[start:start + 1 + len(deltas[i + 1]) + 1]
            if len(cut) >= 3 and full.find(cut) == start:
                break
            cut = None
        pos += len(d)
    check("found a cross-token stop", cut is not None, deltas)
    if cut is None:
        return
    want = full[:full.find(cut)]
    for stop in (cut, [cut, "\u00a7never\u00a7"]):
        r = srv.complete(stop=stop, **req)
        ch = r["choices"][0]
        check("stop: text cut", ch["text"] == want and ch["finish_reason"] == "stop",
              (stop, ch, want))
        text, finish, sdeltas, _ = stream_text(srv, "/v1/completions", dict(req, stop=stop))
        check("stop: stream cut", text == want and finish.get(0) == "stop", (text, want, finish))
        check("stop: no partial stop streamed", "".join(sdeltas) == want, sdeltas)
    # chat streaming too
    creq = dict(messages=[{"role": "user", "content": "Count from one to ten in words."}],
                max_tokens=30, temperature=0)
    full = srv.chat(**creq)["choices"][0]["message"]["content"]
    if len(full) > 8:
        stop = full[len(full) // 2:len(full) // 2 + 3]
        want = full[:full.find(stop)]
        text, finish, _, _ = stream_text(srv, "/v1/chat/completions", dict(creq, stop=stop))
        check("chat stop streamed", text == want and finish.get(0) == "stop", (text, want, stop))


def determinism(srv):
    req = dict(prompt="The three primary colors are", max_tokens=16, temperature=0)
    alone = srv.complete(**req)["choices"][0]["text"]
    results = {}

    def worker(i):
        try:
            if i == 0:
                results[i] = srv.complete(**req)["choices"][0]["text"]
            else:
                srv.complete(prompt=f"Tell me fact number {i} about the ocean.",
                             max_tokens=8 + i % 9, temperature=0.8 if i % 2 else 0, seed=i)
                results[i] = "ok"
        except Exception as e:  # noqa: BLE001
            results[i] = f"error {e}"

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check("same text among 15 others", results.get(0) == alone, (results.get(0), alone))
    check("others succeeded", all(results[i] == "ok" for i in range(1, 16)), results)


def prefix_cache(srv):
    system = " ".join(f"Rule {i}: answer politely and briefly, using plain words." for i in range(40))
    before = srv.metrics().get("loom_prefix_cache_hits_total", 0)
    for q in ("What is a cat?", "What is a dog?"):
        srv.chat(messages=[{"role": "system", "content": system}, {"role": "user", "content": q}],
                 max_tokens=4, temperature=0)
    m = srv.metrics()
    check("prefix cache hits", m.get("loom_prefix_cache_hits_total", 0) >= before + 10, m)
    check("prefix hit rate", 0 < m.get("loom_prefix_cache_hit_rate", 0) <= 1, m)


def raw_stream_client(port, req, cut):
    """Streams a request over a raw socket; closes after `cut` bytes (None: read all)."""
    body = json.dumps(dict(req, stream=True)).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=300)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    try:
        while cut is None or len(got) < cut:
            b = s.recv(4096)
            if not b:
                break
            got += b
            if b"data: [DONE]" in got:
                break
    finally:
        s.close()
    return got


def disconnects(srv):
    rnd = random.Random(7)
    out = {}

    cuts = {i: rnd.choice([0, 1, 200, 600, 1200, 2000]) for i in range(0, 64, 3)}
    before = srv.metrics().get("loom_generation_tokens_total", 0)

    def worker(i):
        # leavers ask for many tokens: only cancellation ends them soon
        cut = cuts.get(i)
        req = dict(prompt=f"Describe city number {i} in a few words.",
                   max_tokens=16 if cut is None else 1000, temperature=0)
        try:
            got = raw_stream_client(srv.port, req, cut)
            out[i] = cut is not None or b"data: [DONE]" in got
        except Exception as e:  # noqa: BLE001
            out[i] = f"error {e}"

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check("64 streams finished", all(v is True for v in out.values()) and len(out) == 64,
          {k: v for k, v in out.items() if v is not True})
    deadline = time.time() + 20
    m = srv.metrics()
    while time.time() < deadline:
        m = srv.metrics()
        if (m.get("loom_kv_blocks_used") == 0 and m.get("loom_requests_running") == 0 and
                m.get("loom_requests_waiting") == 0):
            break
        time.sleep(0.2)
    check("no KV blocks held once idle", m.get("loom_kv_blocks_used") == 0 and
          m.get("loom_requests_running") == 0, m)
    made = m.get("loom_generation_tokens_total", 0) - before
    check("leavers were cancelled", made < 43 * 16 + len(cuts) * 300, made)


def bad_input(srv):
    cases = [
        ("malformed json", "/v1/completions", b"{", 400),
        ("not an object", "/v1/completions", b"[1,2]", 400),
        ("prompt wrong type", "/v1/completions", {"prompt": 5}, 400),
        ("prompt missing", "/v1/completions", {"max_tokens": 3}, 400),
        ("negative max_tokens", "/v1/completions", {"prompt": "x", "max_tokens": -1}, 400),
        ("huge max_tokens", "/v1/completions", {"prompt": "x", "max_tokens": 10 ** 12}, 400),
        ("max_tokens string", "/v1/completions", {"prompt": "x", "max_tokens": "5"}, 400),
        ("n zero", "/v1/completions", {"prompt": "x", "n": 0}, 400),
        ("n huge", "/v1/completions", {"prompt": "x", "n": 1000}, 400),
        ("top_k negative", "/v1/completions", {"prompt": "x", "top_k": -5}, 400),
        ("top_k huge", "/v1/completions", {"prompt": "x", "top_k": 10 ** 9}, 400),
        ("temperature string", "/v1/completions", {"prompt": "x", "temperature": "hot"}, 400),
        ("top_p out of range", "/v1/completions", {"prompt": "x", "top_p": 3}, 400),
        ("stop wrong type", "/v1/completions", {"prompt": "x", "stop": 7}, 400),
        ("too many stops", "/v1/completions", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400),
        ("stream not bool", "/v1/completions", {"prompt": "x", "stream": "yes"}, 400),
        ("echo not bool", "/v1/completions", {"prompt": "x", "echo": 1}, 400),
        ("logprobs above 20", "/v1/completions", {"prompt": "x", "logprobs": 21}, 400),
        ("seed float", "/v1/completions", {"prompt": "x", "seed": 1.5}, 400),
        ("token id out of range", "/v1/completions", {"prompt": [1, 10 ** 8]}, 400),
        ("prompt too long", "/v1/completions", {"prompt": "hello " * 5000}, 400),
        ("empty prompt", "/v1/completions", {"prompt": ""}, 400),
        ("messages missing", "/v1/chat/completions", {"max_tokens": 2}, 400),
        ("messages not array", "/v1/chat/completions", {"messages": "hi"}, 400),
        ("bad role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400),
        ("content wrong type", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400),
        ("message not object", "/v1/chat/completions", {"messages": [3]}, 400),
    ]
    for name, path, body, want in cases:
        raw = body if isinstance(body, bytes) else None
        st, _, data = srv.post(path, body, raw=raw)
        try:
            err = json.loads(data)["error"]
            shaped = all(k in err for k in ("message", "type", "param", "code")) and err["message"]
        except (ValueError, KeyError, TypeError):
            shaped = False
        check(f"bad input: {name}", st == want and shaped, (st, data[:200]))
    # unknown fields of any type are ignored
    st, _, _ = srv.post("/v1/completions", {"prompt": "x", "max_tokens": 1, "whatever": {"a": [1]}})
    check("unknown field ignored", st == 200, st)
    st, _, data = srv.get("/nope")
    check("404", st == 404 and b"error" in data, st)
    c = srv.conn()
    c.request("GET", "/v1/completions")
    r = c.getresponse()
    check("405", r.status == 405 and b"error" in r.read(), r.status)
    c.close()
    # body over --max-body (64 KiB in these tests): 413
    st = None
    try:
        st, _, data = srv.post("/v1/completions", None, raw=b"{\"prompt\": \"" + b"a" * 200000 + b"\"}")
    except (ConnectionError, BrokenPipeError):
        st = "reset"
    check("body too large", st == 413 or st == "reset", st)
    # headers beyond MHD's per-connection memory: a 4xx
    c = srv.conn()
    try:
        c.request("GET", "/health", headers={"X-Big": "a" * 200000})
        st = c.getresponse().status
    except (ConnectionError, BrokenPipeError, http.client.HTTPException):
        st = "reset"
    c.close()
    check("headers too large", st == "reset" or 400 <= st < 500, st)
    st, _, _ = srv.get("/health")
    check("health after bad input", st == 200, st)
    m = srv.metrics()
    check("requests_total by status", m.get('loom_requests_total{status="400"}', 0) >= len(cases), m)


def preemption():
    global BLOCK_BYTES
    # 24 blocks of 16 tokens: 12 concurrent requests need ~5 blocks each
    kv = 24 * BLOCK_BYTES
    srv = Server("--kv-mem", str(kv), "--ctx-size", "128", "--parallel", "16", "--max-body", "64K")
    try:
        req = dict(prompt="Here is a list of fruits and their colors: apple is red,",
                   max_tokens=40, temperature=0)
        alone = srv.complete(**req)["choices"][0]["text"]
        res = {}

        def worker(i):
            try:
                if i == 0:
                    res[i] = srv.complete(**req)["choices"][0]["text"]
                else:
                    srv.complete(prompt=f"Here is a list of {i} animals and their sounds: a dog barks,",
                                 max_tokens=40, temperature=0)
                    res[i] = "ok"
            except Exception as e:  # noqa: BLE001
                res[i] = f"error {e}"

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        m = srv.metrics()
        check("small KV total", m.get("loom_kv_blocks_total") == 24, m.get("loom_kv_blocks_total"))
        check("preemptions happened", m.get("loom_preemptions_total", 0) > 0, m)
        check("same text under preemption", res.get(0) == alone, (res.get(0), alone))
        check("others under preemption", all(res[i] == "ok" for i in range(1, 12)), res)
    finally:
        srv.stop()


def queue_full():
    srv = Server("--ctx-size", "256", "--parallel", "1", "--max-waiting", "1")
    try:
        res = {}

        def worker(i):
            try:
                res[i] = srv.post("/v1/completions", {"prompt": f"Count to {i + 5}:",
                                                      "max_tokens": 24, "temperature": 0})
            except Exception as e:  # noqa: BLE001
                res[i] = (f"error {e}", {}, b"")

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = sorted(r[0] for r in res.values() if isinstance(r[0], int))
        full = [r for r in res.values() if r[0] == 503]
        check("queue full gives 503", len(codes) == 6 and 503 in codes and 200 in codes and
              set(codes) <= {200, 503}, codes)
        check("503 has Retry-After and an error body",
              all("Retry-After" in r[1] and b'"error"' in r[2] for r in full), full[:1])
        m = srv.metrics()
        check("rejected counted", m.get("loom_requests_rejected_total", 0) >= len(full), m)
    finally:
        srv.stop()


def stream_flagged(srv, req, started):
    """stream() that sets the event `started` once the first SSE event has
    arrived: the request was admitted and is generating."""
    c = srv.conn()
    c.request("POST", "/v1/completions", body=json.dumps(dict(req, stream=True)).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    head = r.read1(65536) if r.status == 200 else b""
    started.set()
    data = head + r.read()
    c.close()
    return r.status, dict(r.getheaders()), data


def shutdown():
    srv = Server("--ctx-size", "4096", "--parallel", "2", "--shutdown-timeout", "2")
    result = {}
    started = threading.Event()

    def long_stream():
        try:
            result["body"] = stream_flagged(srv, dict(prompt="1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
                                                      max_tokens=4000, temperature=0), started)
        except Exception as e:  # noqa: BLE001
            result["body"] = f"error {e}"
        started.set()

    t = threading.Thread(target=long_stream)
    t.start()
    # SIGTERM once the stream is generating (a fixed wait raced its
    # admission on a loaded machine)
    check("the long stream starts", started.wait(120) and "body" not in result,
          result.get("body"))
    t0 = time.time()
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    try:
        st, _, _ = srv.get("/ready")
        check("ready 503 while draining", st == 503, st)
        st, hdr, body = srv.post("/v1/completions", {"prompt": "x", "max_tokens": 1})
        check("new request 503 while draining", st == 503 and "Retry-After" in hdr and b"error" in body,
              (st, hdr))
    except OSError as e:
        check("server answers while draining", False, e)
    try:
        rc = srv.proc.wait(30)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        rc = "hung"
    elapsed = time.time() - t0
    t.join(30)
    check("SIGTERM exits 0", rc == 0, (rc, srv.stderr()[-500:]))
    check("SIGTERM within the timeout", elapsed < 2 + 5, elapsed)
    # 4000 tokens do not fit in the 2 s drain: the stream is cut, and says so
    # with an error event instead of a finish_reason and [DONE]
    body = result.get("body")
    ok = isinstance(body, tuple) and body[0] == 200
    events = sse_events(body[2]) if ok else None
    last = json.loads(events[-1]) if events and events[-1] != "[DONE]" else {}
    check("cut stream ends with an error event", ok and events is not None and
          "error" in last and b"[DONE]" not in body[2] and
          b'"finish_reason":"stop"' not in body[2], str(body)[-300:])


def model_block_bytes():
    from gguf import GGUFReader  # only for the KV geometry of the model
    r = GGUFReader(MODEL)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()

    def val(key):
        f = r.fields[f"{arch}.{key}"]
        return int(f.parts[f.data[0]][0])

    n_layer, n_head, n_kv = val("block_count"), val("attention.head_count"), val("attention.head_count_kv")
    head_dim = val("embedding_length") // n_head
    return n_layer * 2 * n_kv * head_dim * 16 * 4  # f32 K and V, 16 tokens


def main():
    global BLOCK_BYTES
    if not MODEL or not os.path.exists(MODEL):
        print(f"skip: model not found ({MODEL or '$LOOM_MODEL unset'})")
        return 77
    BLOCK_BYTES = model_block_bytes()
    srv = Server("--ctx-size", "2048", "--parallel", "16", "--max-waiting", "64", "--max-body", "64K",
                 "--kv-mem", str(600 * BLOCK_BYTES))
    try:
        for test in (shapes_and_usage, n_choices, sse_format, stop_strings, determinism,
                     prefix_cache, bad_input, disconnects):
            t0 = time.time()
            try:
                test(srv)
            except Exception as e:  # noqa: BLE001
                check(test.__name__, False, f"raised {e!r}")
            print(f"{test.__name__}: {time.time() - t0:.1f} s", flush=True)
        check("main server exits 0", srv.stop() == 0, srv.stderr()[-500:])
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    for test in (preemption, queue_full, shutdown):
        t0 = time.time()
        try:
            test()
        except Exception as e:  # noqa: BLE001
            check(test.__name__, False, f"raised {e!r}")
        print(f"{test.__name__}: {time.time() - t0:.1f} s", flush=True)
    print(f"{passed} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
