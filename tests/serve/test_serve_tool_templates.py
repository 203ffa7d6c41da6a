"""`loom serve`: tools through the chat template (issue 32 item 1).

argv[1] is the loom binary; the model is $LOOM_MODEL (SmolLM2: its vocabulary
holds ChatML's tokens), served with real templates of other models from
../shared/data/chat-templates (--chat-template). Oracles independent of
loom's renderer:
  - the prompt of a chat with tools, a tool call and its result has exactly
    the tokens of jinja2's rendering of the same conversation (the shared
    case's "expected" text, tokenized by /tokenize);
  - the model's calls come back as OpenAI tool_calls in the format the
    template asks for (Hermes <tool_call>, Llama 3.x bare JSON with
    "parameters", Mistral [TOOL_CALLS][...]), grammar-constrained: with
    tool_choice "required" every reply is a call with a valid argument
    object; Mistral's ids are 9 letters and digits, as its template demands
    when they come back in the history.
"""
import json
import os
import re
import struct
import sys
import tempfile
import time

import test_serve as ts
from test_serve import MODEL, Server, check

SHARED = os.environ.get("LOOM_SHARED_DIR", os.path.join(os.path.dirname(__file__), "..", "..",
                                                         "..", "shared"))
TEMPLATES = os.path.join(SHARED, "data", "chat-templates")
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                   "required": ["location"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def case(name):
    with open(os.path.join(TEMPLATES, name, "cases.json")) as f:
        return json.load(f)["cases"]["tools"]


def openai_messages(msgs):
    """A shared case's messages (arguments objects, as transformers takes
    them) as an OpenAI client sends them (arguments JSON text)."""
    out = []
    for m in msgs:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [dict(c, function=dict(c["function"], arguments=json.dumps(
                c["function"]["arguments"]))) for c in m["tool_calls"]]
        out.append(m)
    return out


def ok(srv, req):
    st, _, body = srv.post("/v1/chat/completions", req)
    if st != 200:
        raise RuntimeError(f"HTTP {st}: {body[:300]}")
    return json.loads(body)


def prompt_as_jinja2(srv, name):
    """The prompt of the shared tools case is jinja2's rendering, token for
    token."""
    c = case(name)
    r = ok(srv, {"messages": openai_messages(c["input"]["messages"]),
                 "tools": c["input"]["tools"], "max_tokens": 1, "temperature": 0})
    # the case writes BOS as "<|bos|>"; the prompt holds the model's one BOS
    text = c["expected"]
    bos = text.startswith("<|bos|>")
    st, _, body = srv.post("/tokenize", {"content": text[7:] if bos else text,
                                         "add_special": False})
    want = len(json.loads(body)["tokens"]) + bos
    check(f"{name}: the prompt is jinja2's rendering ({want} tokens)",
          r["usage"]["prompt_tokens"] == want, (r["usage"], want))


def required_call(srv, name, stream=False):  # noqa: C901
    """tool_choice "required": a call, parsed from the template's format."""
    req = {"messages": ASK, "tools": WEATHER, "tool_choice": "required", "max_tokens": 60,
           "temperature": 0}
    if not stream:
        r = ok(srv, req)
        ch = r["choices"][0]
        calls = ch["message"].get("tool_calls") or []
        check(f"{name}: a required call comes back as tool_calls",
              ch["finish_reason"] == "tool_calls" and len(calls) >= 1 and
              ch["message"]["content"] is None, ch)
    else:
        st, _, body = srv.post("/v1/chat/completions", dict(req, stream=True))
        events = [json.loads(e) for e in ts.sse_events(body) if e != "[DONE]"]
        deltas = [c for e in events for ch in e["choices"]
                  for c in (ch["delta"].get("tool_calls") or [])]
        names = [d["function"]["name"] for d in deltas if d["function"].get("name")]
        args = "".join(d["function"].get("arguments", "") for d in deltas)
        calls = [{"id": deltas[0].get("id"), "function": {"name": names[0], "arguments": args}}] \
            if names else []
        text = "".join(ch["delta"].get("content") or "" for e in events for ch in e["choices"])
        check(f"{name} stream: the call streams as tool_calls deltas, no text",
              names == ["get_weather"] and text == "", (names, text))
    for c in calls:
        check(f"{name}: the call names the tool", c["function"]["name"] == "get_weather", c)
        a = json.loads(c["function"]["arguments"])
        check(f"{name}: its arguments follow the schema",
              isinstance(a, dict) and isinstance(a.get("location"), str), a)
    return calls


def mistral_ids(srv):
    calls = required_call(srv, "Mistral-Nemo")
    check("Mistral-Nemo: call ids are 9 letters and digits",
          calls and all(re.fullmatch(r"[A-Za-z0-9]{9}", c["id"]) for c in calls), calls)
    if not calls:
        return
    hist = ASK + [{"role": "assistant", "content": None, "tool_calls": calls},
                  {"role": "tool", "tool_call_id": calls[0]["id"], "content": "18C"}]
    st, _, body = srv.post("/v1/chat/completions", {"messages": hist, "tools": WEATHER,
                                                    "max_tokens": 4})
    check("Mistral-Nemo: its template takes the calls back in the history", st == 200,
          (st, body[:300]))


def with_template(name, tests):
    path = os.path.join(TEMPLATES, name, "template.jinja")
    srv = Server("--chat-template", path, "-c", "2048")
    try:
        m = re.search(r"tool calls: (\S+) format, tools presented (.*)", srv.stderr())
        print(f"{name}: {m.group(0) if m else '?'}", flush=True)
        for t in tests:
            t0 = time.time()
            try:
                t(srv)
            except Exception as e:  # noqa: BLE001
                check(f"{name}: {getattr(t, '__name__', 'test')}", False, f"raised {e!r}")
            print(f"  {getattr(t, '__name__', 'test')}: {time.time() - t0:.1f} s", flush=True)
        check(f"{name}: server exits 0", srv.stop() == 0, srv.stderr()[-300:])
        return m.group(1) if m else None
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()


def with_tool_use_variant(path, variant):
    """A copy of the model with tokenizer.chat_template.tool_use set to
    variant's source: the key goes right after the header, padded (with a
    Jinja comment) to a multiple of the file's 32-byte alignment, so the
    tensor data keeps its alignment."""
    with open(os.path.join(TEMPLATES, variant, "template.jinja"), "rb") as f:
        src = f.read()
    key = b"tokenizer.chat_template.tool_use"
    head = 8 + len(key) + 4 + 8
    pad = (-(head + len(src))) % 32
    if 0 < pad < 5:
        pad += 32
    if pad:
        src += b"{#" + b" " * (pad - 4) + b"#}"
    kv = struct.pack("<Q", len(key)) + key + struct.pack("<IQ", 8, len(src)) + src
    with open(MODEL, "rb") as f, open(path, "wb") as out:
        header = f.read(24)
        magic, version, n_tensors, n_kv = struct.unpack("<4sIQQ", header)
        out.write(struct.pack("<4sIQQ", magic, version, n_tensors, n_kv + 1) + kv)
        while True:
            block = f.read(1 << 20)
            if not block:
                break
            out.write(block)


def tool_use_variant():
    """A model whose file has a tool_use variant: requests with tools get
    it (its prompt is jinja2's rendering), requests without get the
    model's own template (the prompt of the unmodified model)."""
    qwen = "Qwen-Qwen2.5-7B-Instruct"
    plain = {"messages": ASK, "max_tokens": 1, "temperature": 0}
    srv = Server()
    try:
        base = ok(srv, plain)["usage"]["prompt_tokens"]
    finally:
        srv.stop()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "with-tool-use.gguf")
        with_tool_use_variant(path, qwen)
        srv = Server("--model", path)
        try:
            check("tool_use: start-up names the variant",
                  "tool_use variant for requests with tools" in srv.stderr(), srv.stderr()[-600:])
            prompt_as_jinja2(srv, qwen)
            check("tool_use: a request without tools gets the model's own template",
                  ok(srv, plain)["usage"]["prompt_tokens"] == base, base)
            required_call(srv, "tool_use")
            check("tool_use: server exits 0", srv.stop() == 0, srv.stderr()[-300:])
        finally:
            if srv.proc.poll() is None:
                srv.proc.kill()


def main():
    if not os.path.exists(MODEL) or not os.path.isdir(TEMPLATES):
        print("skip: model or shared templates missing")
        sys.exit(77)
    qwen = "Qwen-Qwen2.5-7B-Instruct"
    fmt = with_template(qwen, [lambda s: prompt_as_jinja2(s, qwen),
                               lambda s: required_call(s, qwen),
                               lambda s: required_call(s, qwen, stream=True)])
    check("Qwen2.5: Hermes format, presented by the template", fmt == "hermes", fmt)
    hermes = "NousResearch-Hermes-3-Llama-3.1-8B-tool_use"
    with_template(hermes, [lambda s: prompt_as_jinja2(s, hermes)])
    llama = "meta-llama-Llama-3.1-8B-Instruct"
    fmt = with_template(llama, [lambda s: required_call(s, "Llama-3.1"),
                                lambda s: required_call(s, "Llama-3.1", stream=True)])
    check("Llama 3.1: its bare JSON format", fmt == "llama3-json", fmt)
    fmt = with_template("mistralai-Mistral-Nemo-Instruct-2407", [mistral_ids])
    check("Mistral Nemo: its [TOOL_CALLS] format", fmt == "mistral", fmt)
    t0 = time.time()
    try:
        tool_use_variant()
    except Exception as e:  # noqa: BLE001
        check("tool_use_variant", False, f"raised {e!r}")
    print(f"tool_use_variant: {time.time() - t0:.1f} s", flush=True)
    print(f"{ts.passed} passed, {len(ts.failures)} failed")
    sys.exit(1 if ts.failures else 0)


if __name__ == "__main__":
    main()
