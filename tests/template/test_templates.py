#!/usr/bin/env python3
"""Renders every case of ../shared/data/chat-templates with `loom template`.

  test_templates.py LOOM [CASES_DIR]

Each folder holds a real model's template.jinja and cases.json: six
conversations with their variables (`input`, plus the file's `variables`)
and what jinja2, configured as transformers configures it, rendered
(`expected`) or raised (`error`). A rendering must match byte for byte; an
error case must fail with the template's message (jinja2's text after
"TemplateError: ", or the whole "Kind: message" for other exceptions).
KNOWN_FAILURES lists the cases that are allowed to fail: the test fails
if any other case fails, and if a listed one passes (so the list shrinks
as they are fixed). Skips (77) without ../shared.
"""
import json
import os
import subprocess
import sys

# strftime_now's fixed time in the cases: 2026-01-02 03:04:05 UTC
NOW = "1767323045"
KNOWN_FAILURES = set()


def render(loom, tmpl, ctx):
    return subprocess.run([loom, "template", "--now", NOW, tmpl], input=json.dumps(ctx).encode(),
                          capture_output=True, timeout=60)


def check_case(loom, folder, case):
    ctx = dict(case.get("_variables", {}))
    ctx.update(case["input"])
    p = render(loom, os.path.join(folder, "template.jinja"), ctx)
    err = p.stderr.decode("utf-8", "replace")
    if "error" in case:
        want = case["error"]
        if want.startswith("TemplateError: "):
            want = want[len("TemplateError: "):]
        if p.returncode != 1:
            return f"rendered (exit {p.returncode}) where jinja2 raised {case['error']!r}"
        if want not in err:
            return f"failed with {err.strip()!r}, not {want!r}"
        return None
    if p.returncode != 0:
        return f"exit {p.returncode}: {err.strip()[:300]}"
    out = p.stdout.decode("utf-8", "replace")
    if out != case["expected"]:
        exp = case["expected"]
        i = next((k for k in range(min(len(out), len(exp))) if out[k] != exp[k]),
                 min(len(out), len(exp)))
        return (f"differs at char {i}: got {out[max(0, i - 40):i + 40]!r}, "
                f"want {exp[max(0, i - 40):i + 40]!r}")
    return None


def main():
    loom = sys.argv[1]
    root = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.environ.get("LOOM_SHARED_DIR", "../shared"), "data", "chat-templates")
    if not os.path.isdir(root):
        print(f"skip: {root} not found (the shared test data)")
        return 77
    failed, passed, total = {}, 0, 0
    for name in sorted(os.listdir(root)):
        folder = os.path.join(root, name)
        if not os.path.isfile(os.path.join(folder, "cases.json")):
            continue
        with open(os.path.join(folder, "cases.json"), encoding="utf-8") as f:
            data = json.load(f)
        for cname, case in data["cases"].items():
            case["_variables"] = data.get("variables", {})
            total += 1
            why = check_case(loom, folder, case)
            if why:
                failed[f"{name}/{cname}"] = why
            else:
                passed += 1
    bad = 0
    for key in sorted(failed):
        if key not in KNOWN_FAILURES:
            print(f"FAIL {key}: {failed[key]}")
            bad += 1
    for key in sorted(KNOWN_FAILURES - set(failed)):
        print(f"FAIL {key}: passes now; take it off KNOWN_FAILURES")
        bad += 1
    print(f"{passed}/{total} cases pass ({len(failed)} fail, {len(KNOWN_FAILURES)} known)")
    if total < 264:
        print(f"FAIL: only {total} cases found under {root}, expected at least 264")
        bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
