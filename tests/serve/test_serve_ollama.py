"""`loom serve`: Ollama's API (issue 32 item 4): /api/chat, /api/generate
(streamed NDJSON by default, and "stream": false), /api/tags, /api/show.

argv[1] is the loom binary; the model is $LOOM_MODEL (skip, exit 77, when
absent). The shapes checked are the ones Ollama's API documentation gives
(docs/api.md: field names, NDJSON lines, done/done_reason, durations in
nanoseconds, {"error": "..."} on failure); the content is checked against
the OpenAI endpoints of the same server, which run the same engine
request: greedy text, prompt and reply token counts must agree exactly.
Refusals (unsupported options by name) and the limits of the OpenAI path
(--max-body, the context, cancel on disconnect) are checked on the Ollama
path too.
"""
import json
import os
import socket
import sys
import time

import test_serve as ts
from test_serve import MODEL, Server, check

CTX = 1024
CANCEL_TOKENS = 64  # most tokens a stream may make after its client left
ASK = [{"role": "user", "content": "Name a colour."}]


def post(srv, path, req):
    st, hdr, body = srv.post(path, req)
    return st, hdr, body


def ndjson(body):
    """An NDJSON body's objects; None if a line is not one JSON object."""
    text = body.decode("utf-8")
    if not text.endswith("\n"):
        return None
    out = []
    for line in text[:-1].split("\n"):
        try:
            o = json.loads(line)
        except ValueError:
            return None
        if not isinstance(o, dict):
            return None
        out.append(o)
    return out


def is_ns(x):
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def check_final(name, o, chat):
    """The documented last object: done, done_reason and the counts and
    durations (nanoseconds, integers)."""
    keys = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
            "eval_count", "eval_duration")
    check(f"{name}: final object has model, created_at, done true, done_reason",
          isinstance(o.get("model"), str) and isinstance(o.get("created_at"), str) and
          o.get("done") is True and o.get("done_reason") in ("stop", "length"), o)
    check(f"{name}: final object has the counts and durations as integers",
          all(is_ns(o.get(k)) for k in keys), o)
    check(f"{name}: created_at is RFC 3339 UTC",
          len(o.get("created_at", "")) >= 20 and o["created_at"][4] == "-" and
          o["created_at"][10] == "T" and o["created_at"].endswith("Z"), o.get("created_at"))
    check(f"{name}: durations add up", o.get("total_duration", 0) >=
          o.get("prompt_eval_duration", 0) + o.get("eval_duration", 0) - 1000, o)
    if chat:
        check(f"{name}: message is the assistant's",
              isinstance(o.get("message"), dict) and o["message"].get("role") == "assistant", o)


def chat_whole_and_streamed(srv, model):
    """/api/chat, "stream": false and streamed (the default): the same text
    and counts as /v1/chat/completions at temperature 0."""
    ref = srv.chat(messages=ASK, max_tokens=12, temperature=0)
    want = ref["choices"][0]["message"]["content"]
    st, hdr, body = post(srv, "/api/chat", {"model": model, "messages": ASK, "stream": False,
                                            "options": {"temperature": 0, "num_predict": 12}})
    check("chat whole: 200 application/json", st == 200 and
          hdr.get("Content-Type", "").startswith("application/json"), (st, body[:300]))
    o = json.loads(body)
    check_final("chat whole", o, True)
    check("chat whole: the text of /v1/chat/completions", o["message"]["content"] == want,
          (o["message"]["content"], want))
    check("chat whole: prompt_eval_count is usage.prompt_tokens",
          o["prompt_eval_count"] == ref["usage"]["prompt_tokens"], (o, ref["usage"]))
    check("chat whole: eval_count is usage.completion_tokens",
          o["eval_count"] == ref["usage"]["completion_tokens"], (o, ref["usage"]))
    check("chat whole: done_reason as finish_reason",
          o["done_reason"] == ref["choices"][0]["finish_reason"], (o, ref))
    # streamed: the default when "stream" is absent
    st, hdr, body = post(srv, "/api/chat", {"model": model, "messages": ASK,
                                            "options": {"temperature": 0, "num_predict": 12}})
    lines = ndjson(body) if st == 200 else None
    check("chat stream: 200 application/x-ndjson, one JSON object a line",
          lines is not None and hdr.get("Content-Type") == "application/x-ndjson",
          (st, hdr.get("Content-Type"), body[:300]))
    if not lines:
        return
    check("chat stream: chunks before the last are done false with the assistant's text",
          len(lines) >= 2 and all(x.get("done") is False and x["message"]["role"] == "assistant"
                                  and isinstance(x["message"]["content"], str)
                                  for x in lines[:-1]), lines[:3])
    check_final("chat stream", lines[-1], True)
    text = "".join(x["message"]["content"] for x in lines)
    check("chat stream: the chunks spell the whole answer", text == want, (text, want))
    check("chat stream: the counts of the whole answer",
          lines[-1]["eval_count"] == o["eval_count"] and
          lines[-1]["prompt_eval_count"] == o["prompt_eval_count"], (lines[-1], o))


def generate(srv, model):
    """/api/generate: the prompt through the chat template (with system),
    or raw; streamed and not."""
    sys_msg = "You answer briefly."
    ref = srv.chat(messages=[{"role": "system", "content": sys_msg}] + ASK, max_tokens=10,
                   temperature=0)
    req = {"model": model + ":latest", "prompt": ASK[0]["content"], "system": sys_msg,
           "stream": False, "options": {"temperature": 0, "num_predict": 10}}
    st, _, body = post(srv, "/api/generate", req)
    o = json.loads(body) if st == 200 else {}
    check("generate whole: 200 (a ':latest' tag accepted)", st == 200, body[:300])
    if st != 200:
        return
    check_final("generate whole", o, False)
    check("generate whole: 'response' is the chat's text with the system message",
          o.get("response") == ref["choices"][0]["message"]["content"],
          (o.get("response"), ref["choices"][0]["message"]["content"]))
    check("generate whole: prompt_eval_count as the chat's",
          o["prompt_eval_count"] == ref["usage"]["prompt_tokens"], (o, ref["usage"]))
    st, hdr, body = post(srv, "/api/generate", dict(req, stream=True))
    lines = ndjson(body) if st == 200 else None
    check("generate stream: NDJSON", lines is not None and
          hdr.get("Content-Type") == "application/x-ndjson", body[:300])
    if lines:
        check("generate stream: chunks are done false with 'response'",
              all(x.get("done") is False and isinstance(x.get("response"), str)
                  for x in lines[:-1]), lines[:3])
        check_final("generate stream", lines[-1], False)
        check("generate stream: the chunks spell the whole answer",
              "".join(x["response"] for x in lines) == o["response"], lines)
    # raw: the prompt as written, as /v1/completions takes it
    prompt = "The capital of France is"
    cref = srv.complete(prompt=prompt, max_tokens=6, temperature=0)
    st, _, body = post(srv, "/api/generate", {"model": model, "prompt": prompt, "raw": True,
                                              "stream": False,
                                              "options": {"temperature": 0, "num_predict": 6}})
    o = json.loads(body) if st == 200 else {}
    check("generate raw: the completion's text and prompt tokens",
          st == 200 and o.get("response") == cref["choices"][0]["text"] and
          o.get("prompt_eval_count") == cref["usage"]["prompt_tokens"], (st, body[:300], cref))


def options(srv, model):
    """Options honoured (stop, seed, top_k, format) and refused by name."""
    def gen(opts, **extra):
        req = dict({"model": model, "prompt": "Count from one to ten in words.",
                    "stream": False, "options": opts}, **extra)
        st, _, body = post(srv, "/api/generate", req)
        return st, json.loads(body)

    st, full = gen({"temperature": 0, "num_predict": 24})
    words = full.get("response", "").split()
    if st == 200 and len(words) >= 3:
        stop = words[2]
        st, o = gen({"temperature": 0, "num_predict": 24, "stop": [stop]})
        check("options.stop: the text ends before the stop string",
              st == 200 and stop not in o["response"] and
              full["response"].startswith(o["response"]) and o["done_reason"] == "stop",
              (o, stop))
    a = gen({"temperature": 1.0, "seed": 7, "top_k": 40, "top_p": 0.9, "num_predict": 12})
    b = gen({"temperature": 1.0, "seed": 7, "top_k": 40, "top_p": 0.9, "num_predict": 12})
    check("options.seed: the same seed, the same text", a[0] == b[0] == 200 and
          a[1]["response"] == b[1]["response"], (a, b))
    st, o = gen({"temperature": 0, "num_predict": 3})
    check("options.num_predict: at most that many tokens",
          st == 200 and o["eval_count"] <= 3 and o["done_reason"] == "length", o)
    st, o = gen({"temperature": 0, "num_predict": 60}, format="json")
    if st == 200 and o["done_reason"] == "stop":
        try:
            json.loads(o["response"])
            ok = True
        except ValueError:
            ok = False
        check("format json: the answer is JSON", ok, o["response"])
    else:
        check("format json: answered", st == 200, o)
    schema = {"type": "object", "properties": {"colour": {"type": "string"}},
              "required": ["colour"]}
    st, o = gen({"temperature": 0, "num_predict": 60}, format=schema)
    if st == 200 and o["done_reason"] == "stop":
        v = json.loads(o["response"])
        check("format schema: the answer has the required key",
              isinstance(v, dict) and isinstance(v.get("colour"), str), v)
    else:
        check("format schema: answered", st == 200, o)
    # refusals: 400 {"error": "..."} naming what is refused
    for opts, name in (({"mirostat": 2}, "mirostat"), ({"num_gpu": 1}, "num_gpu"),
                       ({"typical_p": 0.5}, "typical_p"), ({"bogus_option": 1}, "bogus_option"),
                       ({"num_ctx": CTX * 4}, "num_ctx"), ({"num_predict": 0}, "num_predict"),
                       ({"temperature": "hot"}, "temperature")):
        st, o = gen(opts)
        check(f"refused: options {opts} is a 400 naming {name}",
              st == 400 and set(o) == {"error"} and name in o["error"], (st, o))
    for extra, name in (({"images": ["aGVsbG8="]}, "images"), ({"template": "{{ .Prompt }}"},
                                                                 "template"),
                        ({"suffix": "end"}, "suffix"), ({"context": [1, 2]}, "context"),
                        ({"think": True}, "think"), ({"frobnicate": 1}, "frobnicate")):
        st, o = gen({"num_predict": 2}, **extra)
        check(f"refused: {name} is a 400 naming it",
              st == 400 and set(o) == {"error"} and name in o["error"], (st, o))
    st, o = gen({"num_predict": 2, "num_ctx": 64, "temperature": 0})
    check("options.num_ctx below the server's: honoured (the prompt and reply fit it)",
          st == 200, o)
    st, o = gen({"num_predict": 200, "num_ctx": 64})
    check("options.num_ctx: a reply that cannot fit it is refused", st == 400 and
          "error" in o, o)


def tags_show(srv, model):
    st, hdr, body = srv.get("/api/tags")
    o = json.loads(body) if st == 200 else {}
    ms = o.get("models", [])
    check("tags: a model list", st == 200 and isinstance(ms, list) and len(ms) >= 1, body[:300])
    m = next((x for x in ms if x.get("name") == model), None)
    check("tags: the model, with model, modified_at, size, digest and details",
          m is not None and m.get("model") == model and isinstance(m.get("modified_at"), str) and
          m.get("size") == os.path.getsize(MODEL) and isinstance(m.get("digest"), str) and
          isinstance(m.get("details"), dict), m)
    if m:
        d = m["details"]
        check("tags: details (format gguf, family, families, parameter_size, quantization_level)",
              d.get("format") == "gguf" and d.get("family") == "llama" and
              d.get("families") == ["llama"] and isinstance(d.get("parameter_size"), str) and
              d.get("quantization_level") == "q4_1", d)
    st, _, body = post(srv, "/api/show", {"model": model})
    o = json.loads(body) if st == 200 else {}
    check("show: 200 with details, model_info, template, capabilities",
          st == 200 and isinstance(o.get("details"), dict) and
          isinstance(o.get("model_info"), dict) and isinstance(o.get("template"), str) and
          {"completion", "tools"} <= set(o.get("capabilities", [])), body[:300])
    if st == 200:
        info = o["model_info"]
        check("show: model_info holds the file's metadata",
              info.get("general.architecture") == "llama" and
              isinstance(info.get("llama.context_length"), int) and
              "tokenizer.chat_template" not in info, {k: info[k] for k in list(info)[:8]})
        check("show: the template is the model's", "<|im_start|>" in o["template"],
              o["template"][:200])
    st, _, body = post(srv, "/api/show", {"name": model + ":latest"})
    check("show: the older 'name' field and a ':latest' tag", st == 200, body[:200])
    st, _, body = post(srv, "/api/show", {"model": "no-such-model"})
    check("show: an unknown model is a 404 {error}",
          st == 404 and "no-such-model" in json.loads(body).get("error", ""), (st, body))


def load_and_models(srv, model):
    """An empty request loads the model (done_reason "load"); another
    model's name is a 404 as on the OpenAI path."""
    for path, req, key in (("/api/generate", {"model": model}, "response"),
                           ("/api/chat", {"model": model, "messages": []}, "message")):
        st, _, body = post(srv, path, req)
        o = json.loads(body) if st == 200 else {}
        check(f"{path}: an empty request is a load answer",
              st == 200 and o.get("done") is True and o.get("done_reason") == "load" and
              key in o, (st, body[:300]))
    st, _, body = post(srv, "/api/chat", {"model": "other", "messages": ASK})
    check("chat: an unknown model is a 404 {error}",
          st == 404 and "error" in json.loads(body) and
          isinstance(json.loads(body)["error"], str), (st, body))


def tool_history(srv, model):
    """A conversation with a tool call (arguments an object, as Ollama
    sends them) and its result (tool_name) is the OpenAI conversation
    with arguments as JSON text: the same prompt tokens."""
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    oll = [{"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
           {"role": "tool", "content": "18C and sunny", "tool_name": "get_weather"}]
    oai = [oll[0],
           {"role": "assistant", "content": "", "tool_calls": [{
               "id": "call_1", "type": "function",
               "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
           {"role": "tool", "content": "18C and sunny", "tool_call_id": "call_1",
            "name": "get_weather"}]
    ref = srv.chat(messages=oai, tools=tools, max_tokens=4, temperature=0)
    st, _, body = post(srv, "/api/chat", {"model": model, "messages": oll, "tools": tools,
                                          "stream": False,
                                          "options": {"temperature": 0, "num_predict": 4}})
    o = json.loads(body) if st == 200 else {}
    check("tools: history with calls and results, the OpenAI request's prompt",
          st == 200 and o.get("prompt_eval_count") == ref["usage"]["prompt_tokens"],
          (st, body[:300], ref["usage"]))
    calls = o.get("message", {}).get("tool_calls")
    if calls:  # a small model may answer in text; a call must be Ollama's shape
        check("tools: calls in Ollama's shape (arguments an object)",
              all(isinstance(c["function"]["arguments"], dict) and
                  c["function"]["name"] == "get_weather" for c in calls), calls)


def wait_metrics(srv, cond, timeout=120):
    """/metrics once cond holds of it, or the last read at the timeout."""
    end = time.time() + timeout
    m = srv.metrics()
    while not cond(m) and time.time() < end:
        time.sleep(0.02)
        m = srv.metrics()
    return m


def limits(srv, model):
    """The OpenAI path's limits hold: --max-body, the context, cancel on
    disconnect."""
    big = {"model": model, "prompt": "x" * 70000, "stream": False}
    st, _, body = post(srv, "/api/generate", big)
    check("limits: a body over --max-body is a 413 {error}",
          st == 413 and "error" in json.loads(body), (st, body[:200]))
    long_prompt = "word " * (CTX * 2)
    st, _, body = post(srv, "/api/generate", {"model": model, "prompt": long_prompt,
                                              "stream": False})
    check("limits: a prompt longer than the context is a 400 {error}",
          st == 400 and "context" in json.loads(body).get("error", ""), (st, body[:200]))
    # a client that leaves a stream: its KV blocks come back
    s = socket.create_connection(("127.0.0.1", srv.port))
    req = json.dumps({"model": model, "prompt": "Tell me a long story.",
                      "options": {"num_predict": -2, "temperature": 0}}).encode()
    s.sendall(b"POST /api/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(req)).encode() + b"\r\n\r\n" + req)
    s.recv(4096)  # the headers: it was accepted
    # Counted in the engine's tokens, not in seconds, so that a loaded
    # machine's slow steps cannot fail it: the request holds KV blocks
    # once it runs; after the close, the server stops it at its next
    # client check (100 ms: a few tokens), where the story would go on for
    # hundreds of tokens (to the end of the context) if it were not.
    m = wait_metrics(srv, lambda m: m.get("loom_kv_blocks_used", 0) > 0)
    used = m.get("loom_kv_blocks_used", 0)
    before = m.get("loom_generation_tokens_total", 0)
    s.close()
    m = wait_metrics(srv, lambda m: m.get("loom_kv_blocks_used", 1) == 0)
    made = m.get("loom_generation_tokens_total", 0) - before
    print(f"limits: {made:.0f} tokens made after the client left", flush=True)
    check("limits: a stream whose client left is cancelled (KV blocks back to 0)",
          used > 0 and m.get("loom_kv_blocks_used", 1) == 0 and made < CANCEL_TOKENS,
          (used, m.get("loom_kv_blocks_used"), made))


def main():
    if not os.path.exists(MODEL):
        print(f"skip: model {MODEL} missing")
        sys.exit(77)
    srv = Server("-c", str(CTX), "--max-body", "65536")
    try:
        model = json.loads(srv.get("/v1/models")[2])["data"][0]["id"]
        for test in (chat_whole_and_streamed, generate, options, tags_show, load_and_models,
                     tool_history, limits):
            t0 = time.time()
            try:
                test(srv, model)
            except Exception as e:  # noqa: BLE001
                check(test.__name__, False, f"raised {e!r}")
            print(f"{test.__name__}: {time.time() - t0:.1f} s", flush=True)
        check("server exits 0", srv.stop() == 0, srv.stderr()[-500:])
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    print(f"{ts.passed} passed, {len(ts.failures)} failed")
    sys.exit(1 if ts.failures else 0)


if __name__ == "__main__":
    main()
