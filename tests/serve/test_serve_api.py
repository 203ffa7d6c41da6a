"""`loom serve`: logprobs, echo, prompt arrays, token-id prompts,
/v1/embeddings, /tokenize and /detokenize (issue 16 item 4).

argv[1] is the loom binary; the model is $LOOM_MODEL (skip, exit 77, when
absent). Oracles independent of the server:
  - logprobs: log softmax (NumPy, float64) of the first token's logits
    that `loom run --dump-logits` writes, within 1e-4;
  - echo: the prompt logprobs at position k equal the first-token
    distribution of a request for the prompt's first k tokens;
  - embeddings: the mean of the final normed hidden states of the NumPy
    reference forward pass (tests/e2e/ref_llama.py), normalized;
  - the official openai client parses what the server sends.
"""
import base64
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import test_serve as ts
from test_serve import LOOM, MODEL, Server, check, sse_events, stream

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))

PROMPT = "The capital of France is"
TOL = 1e-4


def post_ok(srv, path, req):
    st, _, body = srv.post(path, req)
    if st != 200:
        raise RuntimeError(f"{path} HTTP {st}: {body[:300]}")
    return json.loads(body)


def chunks(srv, path, req):
    """A streamed reply's JSON chunks (not [DONE])."""
    st, _, body = stream(srv, path, req)
    events = sse_events(body) if st == 200 else None
    if events is None:
        raise RuntimeError(f"{path} stream HTTP {st}: {body[:300]}")
    return [json.loads(e) for e in events if e != "[DONE]"]


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    return x - m - math.log(np.exp(x - m).sum())


def tokenize(srv, text, add_special=True):
    return post_ok(srv, "/tokenize", {"content": text, "add_special": add_special})["tokens"]


def piece(srv, tok):
    return post_ok(srv, "/detokenize", {"tokens": [tok]})["content"]


def logprobs_match_dump(srv):
    """The first token's logprob and top_logprobs are the log softmax of the
    logits `loom run` dumps for the same prompt (with the f32 KV cache the
    test servers use); sampling settings (a temperature, penalties) do not
    change them."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "logits.bin")
        subprocess.run([LOOM, "run", "--model", MODEL, "-p", PROMPT, "-n", "1", "--temp", "0",
                        "-t", "2", "--no-progress", "--kv-type", "f32", "--dump-logits", path],
                       check=True, capture_output=True)
        ref = log_softmax(np.fromfile(path, dtype=np.float32))
    order = np.argsort(-ref, kind="stable")
    for extra in ({"temperature": 0}, {"temperature": 1.5, "seed": 3, "top_k": 5,
                                       "frequency_penalty": 1.0}):
        r = post_ok(srv, "/v1/completions", dict(prompt=PROMPT, max_tokens=1, logprobs=5, **extra))
        lp = r["choices"][0]["logprobs"]
        top = lp["top_logprobs"][0]
        want = {piece(srv, int(t)): float(ref[t]) for t in order[:5]}
        check(f"logprobs {extra}: top 5 tokens as the dump's", set(top) == set(want), (top, want))
        check(f"logprobs {extra}: top 5 values within {TOL}",
              all(abs(top[k] - want[k]) < TOL for k in want if k in top), (top, want))
        tok = lp["tokens"][0]
        check(f"logprobs {extra}: the token's logprob",
              any(abs(lp["token_logprobs"][0] - float(ref[t])) < TOL and piece(srv, int(t)) == tok
                  for t in order[:50]), lp)
    # chat: sorted tops that contain the chosen token with its own logprob
    r = post_ok(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                              "max_tokens": 6, "temperature": 0,
                                              "logprobs": True, "top_logprobs": 3})
    ch = r["choices"][0]
    content = ch["logprobs"]["content"]
    check("chat logprobs: one item per token", len(content) == r["usage"]["completion_tokens"],
          (len(content), r["usage"]))
    check("chat logprobs: tokens spell the reply",
          "".join(c["token"] for c in content) == ch["message"]["content"], content)
    for c in content:
        tops = [t["logprob"] for t in c["top_logprobs"]]
        check("chat logprobs: 3 tops, sorted", len(tops) == 3 and tops == sorted(tops, reverse=True), c)
        check("chat logprobs: greedy token is the top one",
              c["top_logprobs"][0]["token"] == c["token"] and
              abs(c["top_logprobs"][0]["logprob"] - c["logprob"]) < 1e-9, c)
        check("chat logprobs: bytes are the token's", bytes(c["bytes"]).decode() == c["token"], c)
        check("chat logprobs: at most 0", c["logprob"] <= 0, c)
    # streamed: the same items, split over the chunks
    events = chunks(srv, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0,
        "logprobs": True, "top_logprobs": 3, "stream": True})
    items = [c for e in events if isinstance(e, dict)
             for ch in e["choices"] if ch.get("logprobs") for c in ch["logprobs"]["content"]]
    check("chat stream logprobs: as the whole answer's", items == content, (items, content))
    # logprobs without tops
    r = post_ok(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                              "max_tokens": 2, "temperature": 0, "logprobs": True})
    c = r["choices"][0]["logprobs"]["content"]
    check("chat logprobs, no tops", c[0]["top_logprobs"] == [] and
          abs(c[0]["logprob"] - content[0]["logprob"]) < 1e-9, c)
    # a stop string: its tokens are not in the logprobs, as not in the text
    r = post_ok(srv, "/v1/completions", {"prompt": "Count: 1, 2, 3,", "max_tokens": 10,
                                         "temperature": 0, "logprobs": 1, "stop": [" 5"]})
    ch = r["choices"][0]
    lp = ch["logprobs"]
    check("stop string: logprobs end with the text", ch["finish_reason"] == "stop" and
          "".join(lp["tokens"]) == ch["text"] and max(lp["text_offset"]) < len(ch["text"]), ch)
    r = post_ok(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                              "max_tokens": 2})
    check("no logprobs asked: null", r["choices"][0]["logprobs"] is None, r)


def echo(srv):
    """echo: the prompt's text and logprobs come first (the first null);
    position k's logprobs are the distribution a request for the first k
    prompt tokens gets; max_tokens 0 scores the prompt alone."""
    ids = tokenize(srv, "Paris is the capital of France")
    r = post_ok(srv, "/v1/completions", {"prompt": ids, "max_tokens": 0, "echo": True,
                                         "logprobs": 3})
    ch = r["choices"][0]
    lp = ch["logprobs"]
    check("echo: the prompt's text", ch["text"] == post_ok(srv, "/detokenize", {"tokens": ids})["content"], ch)
    check("echo: a token per prompt token, the first null",
          len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None and
          lp["top_logprobs"][0] is None, lp)
    check("echo: max_tokens 0 generates nothing", r["usage"]["completion_tokens"] == 0 and
          ch["finish_reason"] == "length", r)
    check("echo: text offsets", lp["text_offset"] ==
          [sum(len(t.encode()) for t in lp["tokens"][:i]) for i in range(len(ids))], lp)
    for k in (1, 3, len(ids) - 1):
        one = post_ok(srv, "/v1/completions", {"prompt": ids[:k], "max_tokens": 1, "logprobs": 3,
                                               "temperature": 0})
        want = one["choices"][0]["logprobs"]["top_logprobs"][0]
        got = lp["top_logprobs"][k]
        check(f"echo: position {k} as a request for {k} tokens",
              set(got) == set(want) and all(abs(got[t] - want[t]) < TOL for t in want), (got, want))
    # with generated tokens after the prompt
    r = post_ok(srv, "/v1/completions", {"prompt": ids, "max_tokens": 3, "echo": True,
                                         "logprobs": 1, "temperature": 0})
    plain = post_ok(srv, "/v1/completions", {"prompt": ids, "max_tokens": 3, "logprobs": 1,
                                             "temperature": 0})
    e, p = r["choices"][0], plain["choices"][0]
    check("echo + tokens: prompt then the reply", e["text"] == ch["text"] + p["text"], (e, p))
    check("echo + tokens: logprobs continue",
          e["logprobs"]["token_logprobs"][len(ids):] == p["logprobs"]["token_logprobs"], (e, p))


def prompt_arrays(srv):
    """A prompt array: one choice per prompt (times n), prompt-major, each
    as its own request would answer; token-id prompts as their text."""
    texts = ["The sky is", "One two three"]
    r = post_ok(srv, "/v1/completions", {"prompt": texts, "max_tokens": 4, "temperature": 0,
                                         "n": 2})
    chs = r["choices"]
    check("prompt array: 4 choices, indexed", [c["index"] for c in chs] == [0, 1, 2, 3], chs)
    single = [post_ok(srv, "/v1/completions", {"prompt": t, "max_tokens": 4, "temperature": 0})
              ["choices"][0]["text"] for t in texts]
    check("prompt array: each as alone", [c["text"] for c in chs] ==
          [single[0], single[0], single[1], single[1]], (chs, single))
    ids = [tokenize(srv, t) for t in texts]
    check("prompt array: usage counts every prompt", r["usage"]["prompt_tokens"] ==
          sum(len(i) for i in ids), r["usage"])
    r = post_ok(srv, "/v1/completions", {"prompt": ids, "max_tokens": 4, "temperature": 0})
    check("token-id prompt array: as the texts", [c["text"] for c in r["choices"]] == single, r)
    r = post_ok(srv, "/v1/completions", {"prompt": ids[1], "max_tokens": 4, "temperature": 0})
    check("token-id prompt: as the text", r["choices"][0]["text"] == single[1], r)
    events = chunks(srv, "/v1/completions", {"prompt": texts, "max_tokens": 4,
                                             "temperature": 0, "stream": True})
    got = {0: "", 1: ""}
    for e in events:
        if isinstance(e, dict):
            for c in e["choices"]:
                got[c["index"]] += c["text"]
    check("prompt array streamed", [got[0], got[1]] == single, (got, single))


def cosine(a, b):
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def embeddings(srv):
    """Identical texts embed identically, different ones differently; unit
    length; base64 is the same floats; token ids as their text."""
    texts = ["The cat sat on the mat.", "The cat sat on the mat.", "Stock markets fell sharply."]
    r = post_ok(srv, "/v1/embeddings", {"input": texts})
    vs = [np.array(d["embedding"]) for d in r["data"]]
    check("embeddings: one per input, indexed", [d["index"] for d in r["data"]] == [0, 1, 2] and
          r["object"] == "list" and r["data"][0]["object"] == "embedding", r["data"][0].keys())
    check("embeddings: identical texts identical", np.array_equal(vs[0], vs[1]))
    check("embeddings: different texts differ", cosine(vs[0], vs[2]) < 0.99, cosine(vs[0], vs[2]))
    check("embeddings: unit length", all(abs(np.linalg.norm(v) - 1) < 1e-5 for v in vs))
    ids = [tokenize(srv, t) for t in texts]
    check("embeddings: usage", r["usage"]["prompt_tokens"] == sum(len(i) for i in ids), r["usage"])
    b = post_ok(srv, "/v1/embeddings", {"input": texts[0], "encoding_format": "base64"})
    dec = np.frombuffer(base64.b64decode(b["data"][0]["embedding"]), dtype="<f4")
    check("embeddings: base64 = float", np.array_equal(dec, vs[0].astype(np.float32)),
          np.abs(dec - vs[0]).max())
    t = post_ok(srv, "/v1/embeddings", {"input": [ids[0], ids[2]]})
    check("embeddings: token ids as their text",
          np.allclose(np.array(t["data"][0]["embedding"]), vs[0], atol=1e-6) and
          np.allclose(np.array(t["data"][1]["embedding"]), vs[2], atol=1e-6))
    return ids[2], vs[2]


def embeddings_reference(ids, fast):
    """The embedding against the NumPy reference (the mean of the final
    normed hidden states, normalized): within float rounding in exact mode
    (f32 activations); the default fast mode quantizes activations, so it
    is held to a cosine only."""
    import ref_llama  # noqa: E402 (tests/e2e)
    srv = Server("--exact")
    try:
        got = np.array(post_ok(srv, "/v1/embeddings", {"input": ids})["data"][0]["embedding"])
    finally:
        srv.stop()
    m = ref_llama.Model(MODEL, dtype=np.float32)  # float32: half the memory, error ~1e-7
    ref = m.hidden(ids, 0, m.new_cache()).mean(axis=0)
    ref /= np.linalg.norm(ref)
    err = float(np.abs(ref - got).max() / np.abs(ref).max())
    check("embeddings, exact: the NumPy reference's pooled hidden state", err < 1e-5, err)
    print(f"embeddings: exact mode within {err:.1e} of the reference's largest entry")
    check("embeddings, fast: near the reference", cosine(ref, fast) > 0.999, cosine(ref, fast))


def tokenize_roundtrip(srv):
    text = "Hello, world! Ünïcödé and 日本語 <|im_start|>"
    ids = tokenize(srv, text, add_special=False)
    back = post_ok(srv, "/detokenize", {"tokens": ids})["content"]
    check("tokenize/detokenize round trip", back == text, (text, back))
    p = post_ok(srv, "/tokenize", {"content": text, "with_pieces": True})["tokens"]
    check("with_pieces: ids as plain", [x["id"] for x in p] == ids, p)
    joined = b"".join(x["piece"].encode() if isinstance(x["piece"], str) else bytes(x["piece"])
                      for x in p)
    check("with_pieces: pieces spell the text", joined == text.encode(), joined)
    one = tokenize(srv, "<|im_start|>", False)
    check("tokenize: control-token text is the token, as in a completion prompt", len(one) == 1, one)
    check("detokenize: a control token shows its text",
          post_ok(srv, "/detokenize", {"tokens": one})["content"] == "<|im_start|>")


def errors(srv):
    def err(path, req, param, needle):
        st, _, body = srv.post(path, req)
        try:
            e = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            e = {}
        check(f"{path} {json.dumps(req)[:60]}: 400 naming {param}", st == 400 and
              e.get("param") == param and needle in e.get("message", "") and
              e.get("type") == "invalid_request_error", (st, body[:300]))

    chat = {"messages": [{"role": "user", "content": "x"}]}
    err("/v1/chat/completions", dict(chat, logprobs=True, top_logprobs=21), "top_logprobs", "20")
    err("/v1/chat/completions", dict(chat, top_logprobs=2), "top_logprobs", "logprobs")
    err("/v1/chat/completions", dict(chat, logprobs=1), "logprobs", "boolean")
    err("/v1/completions", {"prompt": "a", "logprobs": 21}, "logprobs", "20")
    err("/v1/completions", {"prompt": [[1, 2], [3, 10 ** 9]]}, "prompt", "prompt[1][1]")
    err("/v1/completions", {"prompt": [5, -1]}, "prompt", "prompt[1]")
    err("/v1/completions", {"prompt": "a", "max_tokens": 0}, "max_tokens", "max_tokens")
    err("/v1/embeddings", {"input": []}, "input", "input")
    err("/v1/embeddings", {"input": ""}, "input", "empty")
    err("/v1/embeddings", {}, "input", "required")
    err("/v1/embeddings", {"input": "a", "encoding_format": "hex"}, "encoding_format", "base64")
    err("/v1/embeddings", {"input": ["a", [1, 10 ** 9]]}, "input", "input[1][1]")
    err("/detokenize", {"tokens": [1, -5]}, "tokens", "tokens[1]")
    err("/tokenize", {"content": 5}, "content", "content")


def openai_client(srv):
    """The official client: completions with logprobs, chat logprobs,
    streaming, embeddings (float and base64) and an error."""
    try:
        import openai
    except ImportError as e:
        print(f"openai client: skipped ({e})")
        return
    model = json.loads(srv.get("/v1/models")[2])["data"][0]["id"]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="none")
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=3, temperature=0,
                                  logprobs=2, echo=True)
    lp = r.choices[0].logprobs
    check("openai completions: logprobs", lp.token_logprobs[0] is None and
          len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) and
          all(x <= 0 for x in lp.token_logprobs[1:]), lp)
    ask = [{"role": "user", "content": "Say hello."}]
    r = client.chat.completions.create(model=model, messages=ask, max_tokens=5, temperature=0,
                                       logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    check("openai chat: logprobs", len(content) == r.usage.completion_tokens and
          all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content), content)
    toks = []
    for chunk in client.chat.completions.create(model=model, messages=ask, max_tokens=5,
                                                temperature=0, logprobs=True, stream=True):
        for ch in chunk.choices:
            if ch.logprobs and ch.logprobs.content:
                toks += [c.token for c in ch.logprobs.content]
    check("openai chat stream: logprobs", toks == [c.token for c in content], (toks, content))
    # the developer role (current SDKs send it for the system prompt) is the
    # system role: the same prompt tokens and the same greedy reply
    said = {}
    for role in ("system", "developer"):
        r = client.chat.completions.create(
            model=model, max_tokens=8, temperature=0,
            messages=[{"role": role, "content": "Answer in French."}] + ask)
        said[role] = (r.usage.prompt_tokens, r.choices[0].message.content)
    check("openai chat: a developer message is a system message",
          said["developer"] == said["system"] and said["system"][0] > 0, said)
    e1 = client.embeddings.create(model=model, input=["a red apple", "a red apple"])
    e2 = client.embeddings.create(model=model, input="a red apple", encoding_format="float")
    check("openai embeddings: base64 (the client's default) and float agree",
          np.allclose(e1.data[0].embedding, e2.data[0].embedding, atol=1e-7) and
          e1.data[0].embedding == e1.data[1].embedding and
          len(e2.data[0].embedding) > 0, (e1.data[0].embedding[:3], e2.data[0].embedding[:3]))
    try:
        client.chat.completions.create(model=model, messages=ask, logprobs=True, top_logprobs=21)
        check("openai: top_logprobs 21 refused", False, "accepted")
    except openai.BadRequestError as e:
        check("openai: top_logprobs 21 is a BadRequestError", e.status_code == 400 and
              "top_logprobs" in str(e), e)


def main():
    if not os.path.exists(MODEL):
        print(f"skip: model {MODEL} missing")
        sys.exit(77)
    srv = Server("--parallel", "2")
    ref_input = None
    try:
        for test in (logprobs_match_dump, echo, prompt_arrays, embeddings, tokenize_roundtrip,
                     errors, openai_client):
            t0 = time.time()
            try:
                out = test(srv)
                if test is embeddings:
                    ref_input = out
            except Exception as e:  # noqa: BLE001
                check(test.__name__, False, f"raised {e!r}")
            print(f"{test.__name__}: {time.time() - t0:.1f} s", flush=True)
        check("server exits 0", srv.stop() == 0, srv.stderr()[-500:])
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    if ref_input:
        t0 = time.time()
        embeddings_reference(*ref_input)
        print(f"embeddings_reference: {time.time() - t0:.1f} s", flush=True)
    print(f"{ts.passed} passed, {len(ts.failures)} failed")
    sys.exit(1 if ts.failures else 0)


if __name__ == "__main__":
    main()
