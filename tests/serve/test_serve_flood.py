#!/usr/bin/env python3
"""loom serve against clients that leave and requests that are too big.

Usage: test_serve_flood.py LOOM_BINARY   (model: $LOOM_MODEL)

Leaving: a non-streaming n=64 request (and a streaming one) whose client
closes its socket mid-generation is cancelled, and every KV block is free
again within a second (loom_kv_blocks_used in /metrics; within two engine
steps where a step takes longer than 0.4 s, timed before the close and
over the steps run while the client left, so that a machine that slows
down meanwhile moves the bound with it; a sanitizer build, where steps
are tens of times slower, uses n=4); so is one whose client shut only
its sending side (the default;
--half-close answers it, test_serve_edges.py).

Clients that close with their request, or while it is parsed (every parse
made 400 ms long by the server's test-only LOOM_TEST_PARSE_DELAY_MS),
start no job: no prompt token is read for them.

Leaving while the choices are submitted: with a 100 ms wait before each
of an n=64 request's choices is submitted (the server's test-only
LOOM_TEST_SUBMIT_DELAY_MS, as a starved submitting thread on a loaded
machine), a client that closes once two choices run lets at most 8 more
into the engine (counted from loom_prompt_tokens_total, not timed), and
another client's greedy answer asked meanwhile is the one it gets alone.

Flooding: a 1 MB chat message, a 1,000-tool request and six 127 KB
messages at once, while /health is polled every 50 ms and a second client
(127.0.0.2) asks for a short answer: every /health answers within 1 s, the
big requests are refused (the context is 512 tokens) within FLOOD_BOUND_S,
and the second client's request is answered within FLOOD_BOUND_S.
"""
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_serve_edges import Server, error_of  # noqa: E402

LOOM = sys.argv[1] if len(sys.argv) > 1 else "loom"
MODEL = os.environ.get("LOOM_MODEL", "")
FLOOD_BOUND_S = 10.0  # a big request's refusal, the other client's answer
HEALTH_BOUND_S = 1.0
failures = []
passed = 0


def check(name, cond, detail=""):
    global passed
    if cond:
        passed += 1
        print(f"ok: {name}", flush=True)
    else:
        failures.append(name)
        print(f"FAIL: {name}: {str(detail)[:600]}", flush=True)


def metrics(srv):
    st, _, body = srv.get("/metrics")
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#") and "{" not in line:
            k, v = line.split()
            out[k] = float(v)
    return out


def raw_request(srv, path, body):
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def wait_metric(srv, cond, timeout, trace=None):
    """(seconds until cond held of /metrics or None, the last read); each
    read appended to trace as (seconds, running, waiting, blocks used,
    steps)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        m = metrics(srv)
        if trace is not None:
            trace.append((round(time.time() - t0, 3), m.get("loom_requests_running"),
                          m.get("loom_requests_waiting"), m.get("loom_kv_blocks_used"),
                          m.get("loom_steps_total")))
        if cond(m):
            return time.time() - t0, m
        time.sleep(0.02)
    return None, metrics(srv)


# ---- clients that leave ----

def sanitized():
    """A sanitizer build steps the model tens of times slower."""
    out = subprocess.run(["ldd", LOOM], capture_output=True, text=True).stdout
    return "libasan" in out or "libtsan" in out


def leave(srv, stream, how, n):
    """n choices generating, then the client closes (or shuts its sending
    side): its blocks must all be free within a second, or two engine steps
    where a step takes longer."""
    body = {"prompt": "Once upon a time", "n": n, "max_tokens": 400, "temperature": 1.0,
            "stream": stream}
    s = raw_request(srv, "/v1/completions", body)
    # all n choices generating before the close: on a loaded machine they
    # reach the engine over many steps (3 running and none waiting, the
    # other 61 counted nowhere, for 0.4 s), and a close then is a
    # different case (left_during_submit)
    started, m0 = wait_metric(srv, lambda m: m.get("loom_requests_running", 0) >= n and
                              m.get("loom_kv_blocks_used", 0) > 0, 60)
    check(f"n={n} running (stream={stream})", started is not None, m0)
    t0 = time.time()
    stepped, _ = wait_metric(srv, lambda m: m["loom_steps_total"] >=
                             m0["loom_steps_total"] + 2, 120)
    step_s = (time.time() - t0) / 2
    mc = metrics(srv)
    at_close = mc["loom_steps_total"]
    if how == "close":
        s.close()
    else:
        s.shutdown(socket.SHUT_WR)
    trace = []
    freed, m = wait_metric(srv, lambda m: m["loom_kv_blocks_used"] == 0 and
                           m["loom_requests_running"] == 0 and
                           m["loom_requests_waiting"] == 0, 60, trace)
    # A step's time is also taken from the steps run while the client was
    # leaving: where the machine got slower after step_s was timed, the
    # bound follows it; a late cancel lets the steps go on at their pace
    # and still misses it.
    steps = m["loom_steps_total"] - at_close
    during = freed / max(steps, 1) if freed is not None else 0
    bound = max(1.0, 2 * max(step_s, during) + 0.2)
    print(f"  {how} (stream={stream}): blocks free after {freed} s, {steps:.0f} steps "
          f"(a step takes {step_s:.3f} s; {mc['loom_requests_running']:.0f} running at the close)",
          flush=True)
    check(f"client {how}: n={n} cancelled, blocks free within {bound:.1f} s (stream={stream})",
          stepped is not None and freed is not None and freed < bound, (freed, steps, trace[:40]))
    if how != "close":
        s.close()


def send_and_close(srv, i, words, corked, wait=0.0):
    """A completion request whose client closes its socket: at once with
    the request (corked: the request and the FIN leave together), or after
    `wait` seconds."""
    data = json.dumps({"prompt": f"{i} " + "hello " * words, "max_tokens": 100}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    if corked:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
              f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
              .encode() + data)
    time.sleep(wait)
    s.close()


def left_before_answer(srv, what, count, words=300, **how):
    """Clients gone before their answer start no job: no prompt token is
    read for them (each prompt is distinct, so a started one would add its
    tokens to loom_prompt_tokens_total)."""
    m0 = metrics(srv)
    for i in range(count):
        send_and_close(srv, i, words, **how)
    time.sleep(1.5)
    m = metrics(srv)
    read = m["loom_prompt_tokens_total"] - m0["loom_prompt_tokens_total"]
    print(f"  {count} clients {what}: {read:.0f} prompt tokens read", flush=True)
    check(f"{count} clients {what}: no job started", read == 0 and
          m["loom_requests_running"] == 0 and m["loom_kv_blocks_used"] == 0, (read, m))


def left_during_parse():
    """With every parse 400 ms long (a test-only knob of the server), a
    client that leaves 100 ms after sending is gone when its parse ends:
    no job; one that stays is answered."""
    srv = Server(env={"LOOM_TEST_PARSE_DELAY_MS": "400"})
    try:
        left_before_answer(srv, "gone during the parse", 4, corked=False, wait=0.1)
        st, _, _ = srv.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        check("a client that stays is answered (parse delayed)", st == 200, st)
    finally:
        check("server exits 0 (parse delayed)", srv.stop() == 0, srv.stderr()[-500:])


def leaving():
    srv = Server("--parallel", "64", "--ctx-size", "512")
    try:
        n = 4 if sanitized() else 64
        for stream, how in ((False, "close"), (True, "close"), (False, "shut_wr")):
            leave(srv, stream, how, n)
        left_before_answer(srv, "gone with their request", 20, corked=True)
        st, _, _ = srv.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        check("served after the cancels", st == 200, st)
    finally:
        check("server exits 0 (leaving)", srv.stop() == 0, srv.stderr()[-500:])


# the test-only wait before each choice after the first is submitted
SUBMIT_DELAY_MS = 100
# choices a cancel may still let in after the close: the deadline thread
# looks every 100 ms, so about one submit delay passes before it does;
# without the cancel reaching the unsubmitted choices all 60-odd get in
LATE_ADMITS = 8


def greedy_text(srv, prompt):
    st, _, body = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 8,
                                               "temperature": 0})
    r = json.loads(body) if st == 200 else {}
    return st, r.get("choices", [{}])[0].get("text"), r.get("usage", {}).get("prompt_tokens")


def leave_while_submitted(srv, stream, n, prompt, other):
    """The client closes once two of its choices run, with the others
    still being submitted (one per SUBMIT_DELAY_MS), while another client
    asks for other["prompt"]'s greedy answer. Counted in choices admitted
    (loom_prompt_tokens_total grows by a prompt's length at each first
    admission) and engine steps, not seconds."""
    m0 = metrics(srv)
    s = raw_request(srv, "/v1/completions", {"prompt": prompt["text"], "n": n,
                                             "max_tokens": 400, "temperature": 1.0,
                                             "stream": stream})
    started, mc = wait_metric(srv, lambda m: m["loom_prompt_tokens_total"] >=
                              m0["loom_prompt_tokens_total"] + 2 * prompt["n"], 60)
    got = {}
    t = threading.Thread(target=lambda: got.update(r=greedy_text(srv, other["text"])))
    t.start()
    s.close()
    trace = []
    freed, m = wait_metric(srv, lambda m: m["loom_kv_blocks_used"] == 0 and
                           m["loom_requests_running"] == 0 and
                           m["loom_requests_waiting"] == 0 and not t.is_alive(), 120, trace)
    t.join(120)
    late = (m["loom_prompt_tokens_total"] - mc["loom_prompt_tokens_total"] - other["n"]) \
        / prompt["n"]
    peak = max([mc["loom_requests_running"]] + [r[1] for r in trace])
    steps = m["loom_steps_total"] - mc["loom_steps_total"]
    print(f"  stream={stream}: {late:.0f} choices admitted after the close; {steps:.0f} "
          f"steps and {freed} s until all blocks were free; running "
          f"{mc['loom_requests_running']:.0f} at the close, {peak:.0f} at most after",
          flush=True)
    check(f"client left while its choices were submitted: at most {LATE_ADMITS} admitted "
          f"after the close (stream={stream})",
          started is not None and freed is not None and 0 <= late <= LATE_ADMITS,
          (late, steps, trace[:40]))
    check(f"another client's greedy answer untouched (stream={stream})",
          got.get("r") == (200, other["alone"], other["n"]), (got, other))


def left_during_submit():
    """With a SUBMIT_DELAY_MS wait before each choice of a request is
    submitted (the server's test-only LOOM_TEST_SUBMIT_DELAY_MS: a
    submitting thread starved on a loaded machine), a client that leaves
    while its n=64 choices are still being submitted stops the rest: no
    more than LATE_ADMITS enter the engine after the close, and every
    block is free again. Another client's greedy answer, asked meanwhile,
    is the one it gets alone."""
    srv = Server("--parallel", "64", "--ctx-size", "512",
                 env={"LOOM_TEST_SUBMIT_DELAY_MS": str(SUBMIT_DELAY_MS)})
    try:
        n = 4 if sanitized() else 64
        prompt, other = {"text": "Once upon a time"}, {"text": "The capital of France is"}
        for p in (prompt, other):
            st, p["alone"], p["n"] = greedy_text(srv, p["text"])
            check(f"greedy answer alone ({p['text']})", st == 200 and p["n"], st)
        for stream in (False, True):
            leave_while_submitted(srv, stream, n, prompt, other)
    finally:
        check("server exits 0 (submit delayed)", srv.stop() == 0, srv.stderr()[-500:])


# ---- a flood of big requests ----

def big_requests():
    tools = [{"type": "function", "function": {
        "name": f"fn_{i}", "description": f"Looks up item {i} in the catalogue",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                        "limit": {"type": "integer"}},
                       "required": ["query"]}}} for i in range(1000)]
    out = [("1 MB message", {"messages": [{"role": "user",
                                           "content": "hello " * ((1 << 20) // 6 - 64)}],
                             "max_tokens": 4}),
           ("1,000 tools", {"messages": [{"role": "user", "content": "hi"}], "tools": tools,
                            "max_tokens": 4})]
    for i in range(6):
        out.append((f"127 KB message {i}", {"messages": [{"role": "user",
                                                          "content": "x" * (127 << 10)}],
                                            "max_tokens": 4}))
    return out


def timed_post(srv, body, source="127.0.0.1"):
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120,
                                   source_address=(source, 0))
    c.request("POST", "/v1/chat/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, time.time() - t0, data


def flood():
    srv = Server("--ctx-size", "512", "--parallel", "4")
    polls, results, lock = [], {}, threading.Lock()
    done = threading.Event()

    def poll():
        while not done.is_set():
            t0 = time.time()
            try:
                c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
                c.request("GET", "/health")
                st = c.getresponse().status
                c.close()
            except OSError as e:
                st = repr(e)
            with lock:
                polls.append((st, time.time() - t0))
            time.sleep(0.05)

    def send(name, body, source="127.0.0.1"):
        try:
            results[name] = timed_post(srv, body, source)
        except OSError as e:
            results[name] = (repr(e), None, b"")

    try:
        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(0.2)
        senders = [threading.Thread(target=send, args=nb) for nb in big_requests()]
        for t in senders:
            t.start()
        time.sleep(0.1)
        other = threading.Thread(target=send, args=(
            "other client", {"messages": [{"role": "user", "content": "Say hi"}],
                             "max_tokens": 4}, "127.0.0.2"))
        other.start()
        for t in senders + [other]:
            t.join(120)
        time.sleep(0.3)
        done.set()
        poller.join()
        worst = max((p[1] for p in polls), default=None)
        print(f"  /health: {len(polls)} polls, slowest {worst:.3f} s", flush=True)
        check("every /health poll answered 200 within 1 s", polls and
              all(p[0] == 200 and p[1] < HEALTH_BOUND_S for p in polls),
              [p for p in polls if p[0] != 200 or p[1] >= HEALTH_BOUND_S][:5])
        for name, _ in big_requests():
            st, dt, data = results.get(name, (None, None, b""))
            e = error_of(data)
            print(f"  {name}: {st} in {dt} s", flush=True)
            check(f"{name}: refused with context_length_exceeded within {FLOOD_BOUND_S} s",
                  st == 400 and e and e["code"] == "context_length_exceeded" and
                  dt < FLOOD_BOUND_S, (st, dt, data[:200]))
        st, dt, data = results.get("other client", (None, None, b""))
        print(f"  other client: {st} in {dt} s", flush=True)
        check(f"the other client answered within {FLOOD_BOUND_S} s",
              st == 200 and dt < FLOOD_BOUND_S, (st, dt, data[:200]))
    finally:
        done.set()
        check("server exits 0 (flood)", srv.stop() == 0, srv.stderr()[-500:])


def main():
    if not MODEL or not os.path.exists(MODEL):
        print(f"skip: model not found ({MODEL or '$LOOM_MODEL unset'})")
        return 77
    for test in (leaving, left_during_parse, left_during_submit, flood):
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
