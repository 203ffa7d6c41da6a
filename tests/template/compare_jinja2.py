#!/usr/bin/env python3
"""Compares `loom template` with Python's jinja2 (configured as transformers
configures it) on inputs neither was written against. A tool for working on
the interpreter, not part of the suite (it needs jinja2).

  compare_jinja2.py LOOM contexts [SEED] [N]   the shared templates, N random
                                               conversations each
  compare_jinja2.py LOOM whitespace [SEED] [N] N random templates of tags,
                                               whitespace control and blanks
  compare_jinja2.py LOOM FILE.jinja [SEED] [N] one template, N conversations

Prints each difference (jinja2 rendered and loom did not, or the texts
differ) and a count; both failing counts as agreement.
"""
import copy
import datetime
import glob
import json
import os
import random
import subprocess
import sys

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = 1767323045  # 2026-01-02 03:04:05 UTC, as the shared cases


def hf_env():
    def raise_exception(msg):
        raise TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW, datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


CONTENTS = ["Hi", "", " padded ", "multi\nline\n", "ünïcødé 😀", "<|im_start|>x", "{{ x }}",
            "it's \"q\"", "\t", "<think>r</think>ans", "  <think>\nr\n</think>\n\nans  "]


def rand_msg(rng, role):
    m = {"role": role, "content": rng.choice(CONTENTS)}
    if role == "assistant" and rng.random() < 0.3:
        args = rng.choice([{}, {"q": "x y", "n": [1, 2.5, None, True]}, '{"s": "str"}'])
        m["tool_calls"] = [{"id": rng.choice(["call_1", "abcdefghi"]), "type": "function",
                            "function": {"name": "f0", "arguments": args}}]
    if role == "tool":
        m.update(tool_call_id="call_1", name="f0")
    if role == "user" and rng.random() < 0.1:
        m["content"] = [{"type": "text", "text": "part"}]
    return m


def rand_context(rng):
    msgs = [rand_msg(rng, "system")] if rng.random() < 0.5 else []
    for _ in range(rng.randint(0, 5)):
        msgs.append(rand_msg(rng, rng.choice(["user", "assistant", "user", "assistant", "tool"])))
    ctx = {"messages": msgs, "add_generation_prompt": rng.random() < 0.7,
           "bos_token": "<s>", "eos_token": "</s>"}
    if rng.random() < 0.4:
        ctx["tools"] = [{"type": "function", "function": {
            "name": "f0", "description": "d", "parameters": {
                "type": "object", "properties": {"a": {"type": "integer", "enum": [1, 2]}},
                "required": ["a"]}}}]
    return ctx


def rand_whitespace_template(rng, depth=0):
    texts = ["", " ", "\n", " \n", "\n  ", "a", " a ", "\t", "\n\n", "  \n  ", "\r\n"]

    def tag(body, kind):
        lm, rm = rng.choice(["", "", "-", "+"]), rng.choice(["", "", "-", "+"])
        if kind == "{":
            return "{{" + lm.replace("+", "") + " " + body + " " + rm.replace("+", "") + "}}"
        return "{" + kind + lm + " " + body + " " + rm + kind + "}"

    out = ""
    for _ in range(rng.randint(1, 5)):
        r = rng.random()
        out += rng.choice(texts)
        if r < 0.3 and depth < 3:
            out += (tag("if true", "%") + rand_whitespace_template(rng, depth + 1) +
                    tag("else", "%") + rand_whitespace_template(rng, depth + 1) + tag("endif", "%"))
        elif r < 0.5 and depth < 3:
            out += (tag("for i in [1,2]", "%") + rand_whitespace_template(rng, depth + 1) +
                    tag("endfor", "%"))
        elif r < 0.7:
            out += tag("'v'", "{")
        elif r < 0.85:
            out += tag("c", "#")
        out += rng.choice(texts)
    return out


def loom_render(loom, path, ctx):
    p = subprocess.run([loom, "template", "--now", str(NOW), path],
                       input=json.dumps(ctx).encode(), capture_output=True, timeout=60)
    if p.returncode not in (0, 1):
        return None, f"exit {p.returncode}"
    return (p.stdout.decode("utf-8", "replace"), None) if p.returncode == 0 else (None, p.stderr)


def compare(env, loom, path, ctx, label):
    with open(path, encoding="utf-8", newline="") as f:
        src = f.read()
    try:
        want = env.from_string(src).render(**copy.deepcopy(ctx))
    except Exception:  # noqa: BLE001 - any jinja2 failure: loom must fail too
        want = None
    got, err = loom_render(loom, path, ctx)
    if err and not isinstance(err, bytes):
        print(f"{label}: loom crashed ({err})")
        return False
    if want == got:
        return True
    if want is None:
        print(f"{label}: jinja2 raised, loom rendered {got[:100]!r}")
    elif got is None:
        print(f"{label}: loom failed: {err.decode()[:200]}")
    else:
        i = next((k for k in range(min(len(want), len(got))) if want[k] != got[k]),
                 min(len(want), len(got)))
        print(f"{label}: differs at {i}: got {got[max(0, i - 50):i + 50]!r}\n"
              f"  want {want[max(0, i - 50):i + 50]!r}")
    return False


def main():
    loom, mode = sys.argv[1], sys.argv[2]
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    env, total, bad = hf_env(), 0, 0
    if mode == "whitespace":
        path = "/tmp/loom-compare-ws.jinja"
        for i in range(n):
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(rand_whitespace_template(rng))
            total += 1
            bad += not compare(env, loom, path, {}, f"template {i} ({path})")
    else:
        shared = os.environ.get("LOOM_SHARED_DIR", "../shared")
        paths = (sorted(glob.glob(os.path.join(shared, "data", "chat-templates", "*",
                                               "template.jinja")))
                 if mode == "contexts" else [mode])
        for path in paths:
            for i in range(n):
                total += 1
                bad += not compare(env, loom, path, rand_context(rng), f"{path} context {i}")
    print(f"{total} compared, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
