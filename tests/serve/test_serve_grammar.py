"""`loom serve`: structured output and tools (grammar-constrained decoding).

argv[1] is the loom binary; the model is $LOOM_MODEL (skip, exit 77, when
absent). The oracle is independent of loom: Python's json and jsonschema.
json_schema replies must parse and validate for several schemas, seeds
and temperatures (n choices per request), with plain decoding and with
--spec=ngram.so (token trees, --spec-tree 12, pruned by the grammar);
greedy with ngram must equal greedy without; json_object
replies must be objects; tool_choice required and named must come back as
OpenAI tool_calls whose arguments validate against the tool's parameters,
streamed or not; unsupported schemas and bad tool_choice are 400s naming
the problem.
"""
import json
import os
import sys
import time

import jsonschema

import test_serve as ts
from test_serve import MODEL, Server, check, stream

SCHEMAS = [
    ("person", "Describe a fictional person as JSON.", {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                       "city": {"type": "string"}},
        "required": ["name", "age", "city"], "additionalProperties": False}),
    ("order", "Write a pizza order as JSON.", {
        "type": "object",
        "properties": {
            "size": {"enum": ["small", "medium", "large"]},
            "toppings": {"type": "array", "items": {"enum": ["cheese", "ham", "olives", "basil"]},
                         "minItems": 1, "maxItems": 3},
            "delivery": {"type": "boolean"},
            "note": {"anyOf": [{"type": "null"}, {"type": "string"}]}},
        "required": ["size", "toppings", "delivery", "note"], "additionalProperties": False}),
    ("scores", "Give three test scores between 0 and 100 as a JSON array.", {
        "type": "array", "items": {"type": "number"}, "minItems": 3, "maxItems": 3}),
    ("nested", "Describe a small library with one book as JSON.", {
        "$defs": {"book": {"type": "object", "properties": {
            "title": {"type": "string"}, "year": {"type": "integer"}},
            "required": ["title", "year"], "additionalProperties": False}},
        "type": "object",
        "properties": {"library": {"type": "string"},
                       "books": {"type": "array", "items": {"$ref": "#/$defs/book"},
                                 "maxItems": 2}},
        "required": ["library", "books"], "additionalProperties": False}),
]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                   "required": ["tz"]}}}


def chat_req(prompt, schema, **extra):
    return dict({"messages": [{"role": "user", "content": prompt}], "max_tokens": 120,
                 "response_format": {"type": "json_schema", "json_schema": {
                     "name": "out", "strict": True, "schema": schema}}}, **extra)


def validates(text, schema):
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def schema_outputs(srv, spec, temp, seed):
    """Every schema, greedy and sampled (3 seeds a request at temperature
    temp): replies that stop must validate; most must stop."""
    n_stop = n_all = 0
    greedy = {}
    for name, prompt, schema in SCHEMAS:
        runs = [dict(temperature=0), dict(temperature=temp, seed=seed, n=3)]
        for extra in runs:
            r = srv.chat(**chat_req(prompt, schema, speculative=spec, **extra))
            for ch in r["choices"]:
                text = ch["message"]["content"]
                n_all += 1
                if ch["finish_reason"] == "length":
                    continue
                n_stop += 1
                check(f"{name} {spec} {extra}: stops", ch["finish_reason"] == "stop", ch)
                check(f"{name} {spec} {extra}: validates", validates(text, schema), text)
            if extra["temperature"] == 0:
                greedy[name] = r["choices"][0]["message"]["content"]
    check(f"{spec}: most replies finish ({n_stop} of {n_all})", n_stop >= 0.8 * n_all,
          f"{n_stop}/{n_all}")
    return greedy


def json_object(srv):
    for spec in ("none", "ngram"):
        r = srv.chat(messages=[{"role": "user", "content": "List two colors as JSON."}],
                     max_tokens=120, temperature=0, speculative=spec,
                     response_format={"type": "json_object"})
        ch = r["choices"][0]
        if ch["finish_reason"] == "stop":
            check(f"json_object {spec}: an object",
                  isinstance(json.loads(ch["message"]["content"]), dict), ch)
        # completions take response_format too
        r = srv.complete(prompt="A JSON object describing a cat:", max_tokens=80, temperature=0,
                         speculative=spec, response_format={"type": "json_object"})
        ch = r["choices"][0]
        if ch["finish_reason"] == "stop":
            check(f"completions json_object {spec}: an object",
                  isinstance(json.loads(ch["text"]), dict), ch)


def check_calls(what, msg, finish, names):
    check(f"{what}: finish_reason tool_calls", finish == "tool_calls", finish)
    calls = msg.get("tool_calls") or []
    check(f"{what}: calls", 1 <= len(calls), msg)
    check(f"{what}: content null", msg.get("content") is None, msg)
    for c in calls:
        check(f"{what}: call shape", c["type"] == "function" and c["id"].startswith("call_"), c)
        fn = c["function"]
        check(f"{what}: name", fn["name"] in names, fn)
        params = {"get_weather": WEATHER, "get_time": TIME}[fn["name"]]["function"]["parameters"]
        check(f"{what}: arguments is a JSON string that validates",
              isinstance(fn["arguments"], str) and validates(fn["arguments"], params), fn)


def tools(srv):
    ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    named = {"type": "function", "function": {"name": "get_time"}}
    for spec, choice, names, temp in (
            ("none", "required", ("get_weather", "get_time"), 0),
            ("none", named, ("get_time",), 0.8),
            ("ngram", "required", ("get_weather", "get_time"), 0.8),
            ("ngram", named, ("get_time",), 0)):
        r = srv.chat(messages=ask, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=120,
                     temperature=temp, seed=5, speculative=spec, n=2 if temp else 1)
        for ch in r["choices"]:
            check_calls(f"tools {choice} {spec} t={temp}", ch["message"], ch["finish_reason"],
                        names)
    # streamed: deltas as OpenAI sends them, reassembled into the same calls
    req = dict(messages=ask, tools=[WEATHER], tool_choice="required", max_tokens=120,
               temperature=0, stream=True)
    st, _, body = stream(srv, "/v1/chat/completions", req)
    events = ts.sse_events(body)
    check("tools stream: 200 and [DONE]", st == 200 and events and events[-1] == "[DONE]", body[:300])
    calls, finish = {}, None
    for e in events[:-1]:
        for ch in json.loads(e)["choices"]:
            for tc in ch["delta"].get("tool_calls", []):
                c = calls.setdefault(tc["index"], {"id": None, "type": None,
                                                   "function": {"name": "", "arguments": ""}})
                c["id"] = tc.get("id", c["id"])
                c["type"] = tc.get("type", c["type"])
                c["function"]["name"] += tc.get("function", {}).get("name", "")
                c["function"]["arguments"] += tc.get("function", {}).get("arguments", "")
            check("tools stream: no content", not ch["delta"].get("content"), ch)
            finish = ch.get("finish_reason") or finish
    whole = srv.chat(**dict(req, stream=False))["choices"][0]["message"]
    check_calls("tools stream", {"content": None, "tool_calls": list(calls.values())}, finish,
                ("get_weather",))
    check("tools stream: same calls as not streamed",
          [c["function"] for c in calls.values()] == [c["function"] for c in whole["tool_calls"]],
          f"{calls} vs {whole}")
    # auto: text or calls, both well-formed; a tool result in the history
    r = srv.chat(messages=ask, tools=[WEATHER], tool_choice="auto", max_tokens=120, temperature=0)
    ch = r["choices"][0]
    if ch["finish_reason"] == "tool_calls":
        check_calls("tools auto", ch["message"], ch["finish_reason"], ("get_weather",))
    else:
        check("tools auto: text", isinstance(ch["message"]["content"], str) and
              not ch["message"]["content"].startswith("<tool_call>"), ch)
    hist = ask + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21, "sky": "clear"}'}]
    r = srv.chat(messages=hist, tools=[WEATHER], tool_choice="none", max_tokens=40, temperature=0)
    check("tools history: answered as text", isinstance(r["choices"][0]["message"]["content"], str),
          r)
    # none: no constraint, no tool_calls
    r = srv.chat(messages=ask, tools=[WEATHER], tool_choice="none", max_tokens=20, temperature=0)
    check("tools none: no calls", "tool_calls" not in r["choices"][0]["message"], r)


def errors(srv):
    bad = [
        (chat_req("x", {"type": "string", "pattern": "a+"}), "pattern"),
        (chat_req("x", {"type": "integer", "minimum": 3}), "minimum"),
        (chat_req("x", {"type": "object", "properties": {"a": {"type": "date"}}}), "date"),
        (chat_req("x", {"$ref": "#/$defs/nope"}), "nope"),
        (dict(messages=[{"role": "user", "content": "x"}], response_format={"type": "yaml"}),
         "yaml"),
        (dict(messages=[{"role": "user", "content": "x"}], tools=[WEATHER],
              tool_choice={"type": "function", "function": {"name": "nope"}}), "nope"),
        (dict(messages=[{"role": "user", "content": "x"}], tools=[{"type": "function"}]),
         "tools[0]"),
        (dict(messages=[{"role": "user", "content": "x"}], tool_choice="required"), "tools"),
    ]
    for req, word in bad:
        st, _, body = srv.post("/v1/chat/completions", req)
        msg = json.loads(body).get("error", {}).get("message", "") if st == 400 else ""
        check(f"400 naming {word}", st == 400 and word in msg, f"{st} {body[:200]}")
    st, _, body = srv.post("/v1/completions", {"prompt": "x", "tools": [WEATHER]})
    check("completions: tools refused", st == 400, body[:200])


def cli():
    """loom run --json-schema: the output validates, the same with ngram;
    a bad schema or grammar kind is one error line naming it."""
    import subprocess
    import tempfile
    schema = SCHEMAS[0][2]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(schema, f)
        path = f.name
    outs = []
    for extra in ([], ["--spec", "ngram.so"]):
        p = subprocess.run([ts.LOOM, "run", "--model", MODEL, "-p", "A JSON object describing a dog:",
                            "-n", "80", "--temp", "0", "-t", "2", "--no-progress",
                            "--json-schema", path, *extra], capture_output=True, text=True,
                           timeout=120)
        check(f"run --json-schema {extra}: exit 0", p.returncode == 0, p.stderr[-300:])
        check(f"run --json-schema {extra}: validates", validates(p.stdout, schema), p.stdout)
        outs.append(p.stdout)
    check("run --json-schema: ngram == plain", outs[0] == outs[1], outs)
    with open(path, "w") as f:
        json.dump({"type": "string", "format": "email"}, f)
    p = subprocess.run([ts.LOOM, "run", "--model", MODEL, "-p", "x", "--json-schema", path],
                       capture_output=True, text=True, timeout=120)
    check("run: unsupported schema named", p.returncode != 0 and "'format'" in p.stderr
          and path in p.stderr, p.stderr)
    os.unlink(path)


def openai_client(srv):
    """The official openai client: tools (plain and streamed) and a
    Pydantic model through chat.completions.parse (a strict schema with
    $defs, titles and nested objects, as the client writes it)."""
    try:
        import openai
        import pydantic
    except ImportError as e:
        print(f"openai client: skipped ({e})")
        return
    model = json.loads(srv.get("/v1/models")[2])["data"][0]["id"]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="none")
    ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    r = client.chat.completions.create(model=model, messages=ask, tools=[WEATHER],
                                       tool_choice="required", temperature=0, max_tokens=120)
    ch = r.choices[0]
    check("openai tools: finish", ch.finish_reason == "tool_calls", ch)
    calls = ch.message.tool_calls or []
    params = WEATHER["function"]["parameters"]
    check("openai tools: a call that validates", len(calls) == 1 and
          calls[0].function.name == "get_weather" and validates(calls[0].function.arguments, params),
          ch.message)
    args, name, finish = "", "", None
    for chunk in client.chat.completions.create(model=model, messages=ask, tools=[WEATHER],
                                                tool_choice="required", temperature=0,
                                                max_tokens=120, stream=True):
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                name += tc.function.name or "" if tc.function else ""
                args += tc.function.arguments or "" if tc.function else ""
            finish = c.finish_reason or finish
    check("openai stream tools: same call", finish == "tool_calls" and name == "get_weather" and
          args == (calls[0].function.arguments if calls else None), (name, args, finish))

    class Pet(pydantic.BaseModel):
        name: str
        legs: int

    class Owner(pydantic.BaseModel):
        name: str
        pets: list[Pet]

    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    r = parse(model=model, messages=[{"role": "user", "content": "Describe an owner and a pet."}],
              response_format=Owner, temperature=0, max_tokens=150)
    ch = r.choices[0]
    check("openai parse: a parsed Owner", ch.finish_reason == "length" or
          isinstance(ch.message.parsed, Owner), ch)


def main():
    if not os.path.exists(MODEL):
        print(f"skip: model {MODEL} missing")
        sys.exit(77)
    # trees (ngram.so proposes chains when its continuations agree: both)
    srv = Server("--spec", "ngram.so", "--spec-tree", "12", "--parallel", "4")
    try:
        t0 = time.time()
        plain = schema_outputs(srv, "none", 0.7, 11)
        fast = schema_outputs(srv, "ngram", 1.0, 23)
        for name in plain:
            check(f"{name}: greedy with ngram == without", fast[name] == plain[name],
                  f"{fast[name]!r} vs {plain[name]!r}")
        print(f"schemas: {time.time() - t0:.1f} s", flush=True)
        for test in (json_object, tools, errors, openai_client, lambda srv: cli()):
            t0 = time.time()
            try:
                test(srv)
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
