#!/usr/bin/env python3
"""`loom run --spec=...` against plain greedy `loom run` on the real model.

For several prompts (copy-heavy ones included) and every bundled strategy,
the greedy tokens (--dump-tokens) must be the plain run's, token for token.
Also: the stats line is printed, and bad --spec values and config keys are
reported with the plugin path or file:line and key.
Usage: test_greedy.py LOOM_EXE (LOOM_MODEL names the model).
"""
import os
import subprocess
import sys
import tempfile

PARAGRAPH = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, "
             "carrying a can of oil and a cloth. He polished the great lens until it "
             "shone, then lit the lamp and watched the beam sweep across the water.")
PROMPTS = [
    "Repeat the following text exactly:\n" + PARAGRAPH + "\n\nRepeated text:\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
    "# The same function again, unchanged:\ndef fib(n):\n",
    "Count: one, two, three, four, five, six, seven, eight, nine, ten. Again: one, two,",
    "What is the capital of France? Tell me about its history.",
]
CONFIGS = [
    ["--spec=ngram.so"],
    ["--spec=ngram", "--spec-max-draft", "12", "--spec-ngram-min", "2"],
    ["--spec=layerskip.so", "--spec-layers", "12"],
    ["--spec=draft.so", "--spec-draft-model", "{model}", "--spec-max-draft", "4"],
]


def run(loom, model, prompt, extra, out):
    cmd = [loom, "run", "--model", model, "-p", prompt, "-n", "40", "--temp", "0",
           "-t", "2", "--no-progress", "--dump-tokens", out] + extra
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit("FAIL: %s\n%s" % (" ".join(cmd[:2] + extra), p.stderr.strip()))
    with open(out) as f:
        return f.read().split(), p.stderr


def expect_error(loom, model, extra, needles, what):
    p = subprocess.run([loom, "run", "--model", model, "-p", "hi", "-n", "2"] + extra,
                       capture_output=True, text=True, timeout=300)
    if p.returncode == 0 or not all(n in p.stderr for n in needles):
        sys.exit("FAIL: %s: expected an error naming %s, got rc %d: %s"
                 % (what, needles, p.returncode, p.stderr.strip()))


def main():
    loom = sys.argv[1]
    model = os.environ.get("LOOM_MODEL", "")
    if not os.path.isfile(model):
        print("model %s not found; set LOOM_MODEL" % model)
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "tokens")
        for i, prompt in enumerate(PROMPTS):
            plain, _ = run(loom, model, prompt, [], out)
            for cfg in CONFIGS:
                extra = [a.format(model=model) for a in cfg]
                spec, err = run(loom, model, prompt, extra, out)
                if spec != plain:
                    n = next((j for j, (a, b) in enumerate(zip(spec, plain)) if a != b),
                             min(len(spec), len(plain)))
                    sys.exit("FAIL: prompt %d, %s: tokens differ from plain greedy at %d"
                             % (i, " ".join(extra), n))
                if "acceptance" not in err or "mean accepted length" not in err:
                    sys.exit("FAIL: %s: no stats line on stderr:\n%s" % (extra, err))
            print("prompt %d: %d tokens identical under %d strategies"
                  % (i, len(plain), len(CONFIGS)))
        expect_error(loom, model, ["--spec=nosuch.so"], ["nosuch.so", "not found"],
                     "missing plugin")
        expect_error(loom, model, ["--spec-max-draft", "0"], ["--spec-max-draft"],
                     "bad flag value")
        ini = os.path.join(tmp, "loom.ini")
        with open(ini, "w") as f:
            f.write("[loom]\nspec = ngram.so\nspec_max_draft = many\n")
        expect_error(loom, model, ["--config", ini], [ini + ":3", "spec_max_draft"],
                     "bad config value")
        with open(ini, "w") as f:
            f.write("[loom]\nspec_bogus = 1\n")
        expect_error(loom, model, ["--config", ini], [ini + ":2", "spec_bogus"],
                     "unknown config key")
        with open(ini, "w") as f:
            f.write("[loom]\nspec = /nonexistent/strategy.so\n")
        expect_error(loom, model, ["--config", ini], ["/nonexistent/strategy.so"],
                     "config names a missing plugin")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
