#!/usr/bin/env python3
"""Token trees on the real model: `loom run --spec=ngram.so --spec-tree N`
gives, token for token, the plain greedy output, in exact mode on ref.so
and on cpu.so (whose tree rows go through the decode kernels: bit for bit
the plain logits). The prompts repeat one stem with several endings, so
ngram.so's trees branch; the tree runs must verify more drafts than the
chain runs (trees were proposed and verified, not silently turned into
chains). The same for layerskip.so's trees (the early-exit model's chain
with its unsure runner-ups beside it) on cpu.so, on the first two
prompts. Also: --spec-tree out of range is refused naming the flag.
With BACKEND (a GPU emulator, gpuemu.so or gpuemu64.so) that backend
alone, in exact mode, on the side-branch prompt, where a tree's side
branch is taken (the tree run accepts more drafts than the chain run, so
a side node's row decides tokens and a wrong ancestor mask shows), 16
tokens: its tree rows go through the split-K kernel (decode rows' bits),
about a second a token there.
With a JSON schema (tests/grammar/person.schema.json) on cpu.so in
exact mode: ngram.so's trees, pruned by the grammar and their rows masked
after each node's own path, give the tokens of plain constrained greedy
decoding, an output the schema accepts, and more drafts than chains.
Usage: test_tree_greedy.py LOOM_EXE [BACKEND] (LOOM_MODEL names the model).
"""
import os
import re
import subprocess
import sys
import tempfile

PROMPTS = [
    "The cat sat on the mat. The cat ran to the door. The cat sat on the chair. "
    "The cat ate the fish. The cat sat on the",
    "Count: one, two, three, four, five, six, seven, eight, nine, ten. Again: one, two,",
    # side-branch prompt: "1 2 3" goes on "4 5" three times, "9 9" twice
    "1 2 3 4 5. 1 2 3 4 5. 1 2 3 4 5. 1 2 3 9 9. 1 2 3 9 9. 1 2 3",
]
# ref.so is slow (seconds a run): the branching prompt only
BACKENDS = [(["--backend", "ref.so"], PROMPTS[:1]),
            (["--backend", "cpu.so", "--exact"], PROMPTS)]
NGRAM = ["--spec=ngram.so"]
# layerskip.so at 26 of SmolLM2's 30 layers drafts well enough to go on
# proposing; cpu.so only (ref.so is slow)
LAYERSKIP = ["--spec=layerskip.so", "--spec-layers", "26"]


def run(loom, model, prompt, extra, out, n=20, text=None):
    """Tokens, drafts verified, drafts accepted; the output text goes to
    text[0] when text is a list."""
    cmd = [loom, "run", "--model", model, "-p", prompt, "-n", str(n), "--temp", "0",
           "-t", "1", "--no-progress", "--dump-tokens", out] + extra
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit("FAIL: %s\n%s" % (" ".join(extra), p.stderr.strip()))
    if text is not None:
        text[:] = [p.stdout]
    m = re.search(r"\((\d+) of (\d+) drafts\)", p.stderr)
    with open(out) as f:
        return f.read().split(), (int(m.group(2)) if m else 0), (int(m.group(1)) if m else 0)


def check_backend(loom, model, spec, be, prompts, out, n=20):
    """Chains and trees of strategy `spec` on backend `be`: plain greedy
    tokens (n of them), more drafts verified with trees than with chains,
    and (ngram.so on the side-branch prompt) a side branch taken."""
    tree_drafts = chain_drafts = 0
    label = " ".join(be + spec)
    for i, prompt in enumerate(prompts):
        plain, _, _ = run(loom, model, prompt, be, out, n)
        chain, n_chain, acc_chain = run(loom, model, prompt, be + spec, out, n)
        tree, n_tree, acc_tree = run(loom, model, prompt, be + spec + ["--spec-tree", "16"], out,
                                     n)
        for name, toks in (("chain", chain), ("tree", tree)):
            if toks != plain:
                n = next((j for j, (a, b) in enumerate(zip(toks, plain)) if a != b),
                         min(len(toks), len(plain)))
                sys.exit("FAIL: %s prompt %d %s: differs from plain greedy at token %d"
                         % (label, i, name, n))
        tree_drafts += n_tree
        chain_drafts += n_chain
        print("%s prompt %d: %d tokens identical (drafts: chain %d, tree %d; "
              "accepted: chain %d, tree %d)"
              % (label, i, len(plain), n_chain, n_tree, acc_chain, acc_tree))
        if spec == NGRAM and prompt == PROMPTS[2] and acc_tree <= acc_chain:
            sys.exit("FAIL: %s: no side branch taken (accepted: tree %d, chain %d)"
                     % (label, acc_tree, acc_chain))
    if tree_drafts <= chain_drafts:
        sys.exit("FAIL: %s: trees verified %d drafts, chains %d: no tree was used"
                 % (label, tree_drafts, chain_drafts))


SCHEMA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "grammar",
                      "person.schema.json")
# JSON-schema prompts: earlier objects branch after the same keys (so
# ngram.so's trees branch), some with values the schema refuses ("age" a
# string, "ok" a number: nodes the grammar prunes)
GRAMMAR_PROMPTS = [
    'People: {"name": "Ann", "age": 31, "ok": true} {"name": "Ann", "age": "old", "ok": 1} '
    '{"name": "Ann", "age": 31, "tags": ["x"]} {"name": "Ann", "age": 31, "ok": true} '
    '{"name": "Ann", "age": 31, "tags": ["y"]} {"name": "Ann", "age": "old"} Next:',
    'Rows: {"name": "Bo", "age": 7, "tags": ["a", "b"], "ok": false} '
    '{"name": "Bo", "age": "7", "tags": "a"} {"name": "Bo", "age": 7, "tags": ["a", "c"]} '
    '{"name": "Bo", "age": 7, "ok": 0} {"name": "Bo", "age": 7, "tags": ["a", "b"], "ok": true} '
    'Another:',
    # values the schema refuses after the same stems ("ok": "yes", "age":
    # "31"): a tree's refused branch is pruned (seen: 10 nodes, 8 kept)
    'Records: {"name": "Ann", "age": 31, "ok": true} {"name": "Ann", "age": 31, "ok": "yes"} '
    '{"name": "Ann", "age": "31", "ok": true} {"name": "Ann", "age": 31, "ok": "yes"} '
    '{"name": "Ann", "age": 31, "ok": true} Next:',
]
# cpu.so in exact mode only: the grammar prunes and masks on the host, and
# ref.so's tree rows are checked above (its one grammar prompt took half
# of this test's minute and a half)
GRAMMAR_BACKENDS = [(["--backend", "cpu.so", "--exact"], GRAMMAR_PROMPTS)]


def check_grammar(loom, model, be, prompts, out):
    """--json-schema with ngram.so's trees on backend `be`: the tokens of
    plain constrained greedy decoding, an output the schema accepts, and
    trees verified (more drafts than the chain runs)."""
    import json
    import jsonschema
    with open(SCHEMA) as f:
        schema = json.load(f)
    gram = ["--json-schema", SCHEMA]
    label = " ".join(be + gram)
    tree_drafts = chain_drafts = 0
    for i, prompt in enumerate(prompts):
        text = []
        plain, _, _ = run(loom, model, prompt, be + gram, out, 60, text)
        chain, n_chain, acc_chain = run(loom, model, prompt, be + gram + NGRAM, out, 60)
        tree, n_tree, acc_tree = run(loom, model, prompt,
                                     be + gram + NGRAM + ["--spec-tree", "16"], out, 60)
        for name, toks in (("chain", chain), ("tree", tree)):
            if toks != plain:
                n = next((j for j, (a, b) in enumerate(zip(toks, plain)) if a != b),
                         min(len(toks), len(plain)))
                sys.exit("FAIL: %s prompt %d %s: differs from plain constrained greedy "
                         "at token %d" % (label, i, name, n))
        try:
            jsonschema.validate(json.loads(text[0]), schema)
        except (ValueError, jsonschema.ValidationError) as e:
            sys.exit("FAIL: %s prompt %d: output %r does not fit the schema: %s"
                     % (label, i, text[0], e))
        tree_drafts += n_tree
        chain_drafts += n_chain
        print("%s prompt %d: %d tokens identical, schema-valid (drafts: chain %d, tree %d; "
              "accepted: chain %d, tree %d)"
              % (label, i, len(plain), n_chain, n_tree, acc_chain, acc_tree))
    if tree_drafts <= chain_drafts:
        sys.exit("FAIL: %s: trees verified %d drafts, chains %d: no tree was used"
                 % (label, tree_drafts, chain_drafts))


def main():
    loom = sys.argv[1]
    cases = [(NGRAM, be, prompts, 20) for be, prompts in BACKENDS]
    cases.append((LAYERSKIP, ["--backend", "cpu.so", "--exact"], PROMPTS[:2], 20))
    if len(sys.argv) > 2:
        # 16 tokens: on cpu.so the tree run accepts 13 drafts there, the
        # chain run 10 (at 20 tokens 16 and 14)
        cases = [(NGRAM, ["--backend", sys.argv[2], "--exact"], PROMPTS[2:], 16)]
    model = os.environ.get("LOOM_MODEL", "")
    if not os.path.isfile(model):
        print("model %s not found; set LOOM_MODEL" % model)
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "tokens")
        for spec, be, prompts, n in cases:
            check_backend(loom, model, spec, be, prompts, out, n)
        if len(sys.argv) <= 2:
            for be, prompts in GRAMMAR_BACKENDS:
                check_grammar(loom, model, be, prompts, out)
        p = subprocess.run([loom, "run", "--model", model, "-p", "hi", "-n", "2",
                            "--spec-tree", "65"], capture_output=True, text=True, timeout=60)
        if p.returncode == 0 or "--spec-tree" not in p.stderr:
            sys.exit("FAIL: --spec-tree 65 accepted: %s" % p.stderr.strip())
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
