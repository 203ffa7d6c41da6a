"""The loom command as a user meets it: config files, refusals, determinism.

argv[1] is the loom binary. Model-dependent checks are skipped (with a line
saying so) when $LOOM_MODEL is absent; the others always run.
"""
import os
import subprocess
import sys
import tempfile

LOOM = sys.argv[1]
MODEL = os.environ.get("LOOM_MODEL", "")
SHARED = os.environ.get("LOOM_SHARED_DIR", "")
failures = []
passed = 0


def run(*args, timeout=300):
    p = subprocess.run([LOOM, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def check(name, cond, detail=""):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(f"{name}: {detail}")
        print(f"FAIL {name}: {detail}")


def write(dirname, name, text):
    path = os.path.join(dirname, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def config_errors(tmp):
    cfg = write(tmp, "bad.ini", "[loom]\ntemp = 0\nbogus_key = 3\n")
    rc, _, err = run("run", "--config", cfg, "--model", "/nonexistent", "-p", "x")
    check("unknown config key", rc != 0 and f"{cfg}:3" in err and "bogus_key" in err, err)

    cfg = write(tmp, "badval.ini", "top_p = 7\n")
    rc, _, err = run("run", "--config", cfg, "--model", "/nonexistent", "-p", "x")
    check("bad config value", rc != 0 and f"{cfg}:1" in err and "top_p" in err, err)

    cfg = write(tmp, "section.ini", "[server]\nport = 1\n")
    rc, _, err = run("run", "--config", cfg, "-p", "x")
    check("unknown section", rc != 0 and "server" in err, err)

    rc, _, err = run("run", "--config", os.path.join(tmp, "missing.ini"), "-p", "x")
    check("missing config", rc != 0 and "missing.ini" in err, err)


def option_table(tmp):
    """One option table: every subcommand takes --config; a flag another
    subcommand takes is refused by name; [serve] keys count for serve only."""
    for cmd, flag in (("run", "--port"), ("serve", "--temp"), ("info", "-p"),
                      ("bench", "--spec"), ("tokenize", "--kv-mem")):
        rc, _, err = run(cmd, flag, "1", "--model", "/nonexistent")
        check(f"{cmd} refuses {flag}", rc != 0 and flag in err and f"loom {cmd}" in err, err)
    for cmd in ("info", "tokenize", "bench", "serve"):
        rc, _, err = run(cmd, "--config", os.path.join(tmp, "missing.ini"))
        check(f"{cmd} reads --config", rc != 0 and "missing.ini" in err, err)
    cfg = write(tmp, "serve.ini", "[serve]\nport = 99999\n")
    rc, _, err = run("tokenize", "--config", cfg, "--model", "/nonexistent", "x")
    check("[serve] keys are checked everywhere", rc != 0 and f"{cfg}:2" in err and "port" in err, err)
    cfg = write(tmp, "shared.ini", "model = /nonexistent/a.gguf\nport = 9\n[serve]\nmodel = /nonexistent/b.gguf\n")
    rc, _, err = run("run", "--config", cfg, "-p", "x")
    check("[serve] is skipped by run", rc != 0 and "a.gguf" in err and "port" not in err, err)
    rc, _, err = run("serve", "--config", cfg)
    check("[serve] is read by serve", rc != 0 and "b.gguf" in err, err)
    rc, _, err = run("bench", "-p", "abc", "--model", "/nonexistent")
    check("bench -p is a count", rc != 0 and "'abc'" in err, err)
    rc, out, err = run("serve", "--help")
    check("serve --help", rc == 0 and "--kv-mem" in out and "--temp" not in out, out + err)


def model_errors(tmp):
    junk = write(tmp, "junk.gguf", "this is not a gguf file at all")
    rc, _, err = run("run", "--model", junk, "-p", "x")
    check("non-gguf model", rc != 0 and "junk.gguf" in err, err)
    rc, _, err = run("info", junk)
    check("info on junk", rc != 0 and "junk.gguf" in err, err)
    rc, _, err = run("run", "--model", junk)
    check("bad usage exits non-zero", rc != 0, err)


def vocab_only_info():
    vocab = os.path.join(SHARED, "data", "tokenizer", "ggml-vocab-llama-spm.gguf")
    if not os.path.exists(vocab):
        print(f"skip vocab-only info: {vocab} not found")
        return
    rc, out, err = run("info", vocab)
    check("info on vocab-only file", rc == 0 and "llama" in out, err)


def supported_table():
    """loom info --archs: the tables from the descriptors, also printed by
    a bare `loom info`, and README's copy is the same text."""
    rc, out, err = run("info", "--archs")
    check("info --archs", rc == 0 and out.startswith("Architectures"), err)
    rows = {line.split("|")[1].strip() for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| architecture")}
    for name in ("llama", "qwen2", "gemma3", "gpt2", "default", "llama3"):
        check(f"info --archs lists {name}", name in rows, out)
    check("gemma3 row says sliding window", any(
        line.startswith("| gemma3 |") and "sliding window" in line
        for line in out.splitlines()), out)
    rc2, out2, err2 = run("info")
    check("bare info prints the tables", rc2 == 0 and out2 == out, err2)
    readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")
    with open(readme) as f:
        text = f.read()
    begin, end = "<!-- begin: loom info --archs -->\n", "<!-- end: loom info --archs -->"
    i, j = text.find(begin), text.find(end)
    check("README holds loom info --archs verbatim (run scripts/readme_archs.py "
          "build/tools/loom)", 0 <= i < j and text[i + len(begin):j] == out,
          "README block differs from the command's output")


def generation():
    prompt = ["-p", "The capital of France is", "-n", "24", "--temp", "0", "--no-progress"]
    rc, ref_out, err = run("run", "--backend=ref.so", "--model", MODEL, *prompt)
    check("ref.so runs", rc == 0, err)
    # cpu.so agrees with ref.so in exact mode (f32 activations)
    prompt = prompt + ["--exact"]
    rc, cpu_out, err = run("run", "--backend=cpu.so", "--model", MODEL, *prompt)
    check("cpu.so runs", rc == 0, err)
    check("ref.so and cpu.so agree (greedy)", ref_out == cpu_out, f"{ref_out!r} vs {cpu_out!r}")
    check("the continuation names Paris", "Paris" in cpu_out, cpu_out)
    rc, again, err = run("run", "--backend=cpu.so", "--model", MODEL, *prompt)
    check("greedy is repeatable", again == cpu_out, f"{again!r} vs {cpu_out!r}")
    # Prefill in chunks of 2 tokens: same cache contents, same text.
    rc, chunked, err = run("run", "--backend=cpu.so", "--model", MODEL, *prompt, "-b", "2")
    check("chunked prefill gives the same text", chunked == cpu_out, f"{chunked!r} {err}")
    # A context too small for prompt + n_predict: generated until it is
    # full, and said (llama.cpp's behaviour); one the prompt alone
    # overflows is refused, not truncated.
    rc, out, err = run("run", "--model", MODEL, *prompt, "-c", "8")
    check("context too small for -n: generates until full and says so",
          rc == 0 and "generated 3 tokens" in err and "does not fit" in err and
          "stopped: the context (8 tokens) is full" in err and out.strip(), err)
    rc, _, err = run("run", "--model", MODEL, *prompt, "-c", "4")
    check("a prompt beyond the context is refused", rc != 0 and "exceeds the context" in err, err)

    sampled = ["-p", "Once upon a time", "-n", "16", "--temp", "0.9", "--top-p", "0.95",
               "--no-progress"]
    a = run("run", "--model", MODEL, *sampled, "--seed", "7")[1]
    b = run("run", "--model", MODEL, *sampled, "--seed", "7")[1]
    c = run("run", "--model", MODEL, *sampled, "--seed", "8")[1]
    check("same seed, same sample", a == b and a.strip() != "", f"{a!r} vs {b!r}")
    check("another seed, another sample", a != c, f"{a!r} vs {c!r}")

    with tempfile.TemporaryDirectory() as tmp:
        cfg = write(tmp, "loom.ini", f"[loom]\nbackend = ref.so\nmodel = {MODEL}\n"
                    "temp = 0\nn_predict = 4\n")
        rc, out, err = run("run", "--config", cfg, "-p", "The capital of France is",
                           "--backend=cpu.so", "-n", "24", "--no-progress", "--exact")
        check("flags override the config file", rc == 0 and out == cpu_out and "cpu" in err,
              f"{out!r} {err}")

    rc, _, err = run("run", "--backend=nosuch.so", "--model", MODEL, "-p", "x")
    check("missing backend named", rc != 0 and "nosuch.so" in err, err)

    # bench: the table has a row per test; -d puts context before the
    # decode and names it as llama-bench does
    rc, out, err = run("bench", "--model", MODEL, "-p", "8", "-n", "4", "-d", "40", "-t", "1",
                       "-r", "1")
    rows = {c[4].strip(): float(c[5].split()[0]) for c in
            (line.split("|") for line in out.splitlines()) if len(c) == 7 and "±" in c[5]}
    check("bench -d: pp8 and 'tg4 @ d40' rows with t/s > 0",
          rc == 0 and rows.get("pp8", 0) > 0 and rows.get("tg4 @ d40", 0) > 0, f"{out!r} {err}")
    rc, _, err = run("bench", "--model", MODEL, "-p", "8", "-n", "4", "-d", "1000000")
    check("bench -d past the model's context refused", rc != 0 and "context" in err, err)
    # -npl: sequences that decode together, their prefills spread over
    # several steps by -b (3 x 41 tokens, 32 a step)
    rc, out, err = run("bench", "--model", MODEL, "-p", "8", "-n", "6", "-d", "40", "-t", "1",
                       "-r", "1", "-npl", "3", "-b", "32")
    rows = {c[4].strip(): float(c[5].split()[0]) for c in
            (line.split("|") for line in out.splitlines()) if len(c) == 7 and "±" in c[5]}
    check("bench -npl 3: a 'tg6 @ d40 np3' row with t/s > 0",
          rc == 0 and rows.get("tg6 @ d40 np3", 0) > 0, f"{out!r} {err}")
    for bad in ("0", "257", "x"):
        rc, _, err = run("bench", "--model", MODEL, "-npl", bad)
        check(f"bench -npl {bad} refused", rc != 0 and "--n-parallel" in err, err)


def unescape(piece):
    """--pieces' quoting undone: the token's bytes."""
    assert piece[0] == piece[-1] == "'", piece
    out, i, body = bytearray(), 0, piece[1:-1]
    while i < len(body):
        c = body[i]
        if c != "\\":
            out += c.encode()
            i += 1
        elif body[i + 1] == "x":
            out.append(int(body[i + 2:i + 4], 16))
            i += 4
        else:
            out += {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\", "'": b"'"}[body[i + 1]]
            i += 2
    return bytes(out)


def pieces():
    """tokenize --pieces: the ids of plain tokenize, one a line with the
    escaped bytes each stands for; the bytes put together are the text."""
    text = "Hi\tthere,\n'quoted' back\\slash caf\u00e9 \U0001f999 \x01end"
    rc, plain, err = run("tokenize", "-m", MODEL, "--no-bos", text)
    rc2, out, err2 = run("tokenize", "-m", MODEL, "--no-bos", "--pieces", text)
    lines = out.split("\n")[:-1]
    ids = [ln.split("\t", 1)[0] for ln in lines]
    check("--pieces gives plain tokenize's ids", rc == 0 and rc2 == 0 and ids == plain.split(),
          err + err2)
    try:
        joined = b"".join(unescape(ln.split("\t", 1)[1]) for ln in lines)
    except (AssertionError, IndexError, KeyError, ValueError) as e:
        joined = repr(e).encode()
    check("--pieces' bytes put together are the text", joined == text.encode(),
          f"{joined!r} vs {text.encode()!r}")
    check("--pieces escapes control bytes and split characters",
          "\\t" in out and "\\n" in out and "\\\\" in out and "\\'" in out and
          "\\x01" in out and "\\xf0\\x9f" in out, out)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        config_errors(tmp)
        option_table(tmp)
        model_errors(tmp)
    vocab_only_info()
    supported_table()
    if os.path.exists(MODEL):
        generation()
        pieces()
    else:
        print(f"skip generation checks: model {MODEL!r} not found (run scripts/setup.sh)")
    print(f"{passed} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


main()
