#!/usr/bin/env python3
"""llama.cpp's spellings as its users type them (README.md, "Coming from
llama.cpp"), each with its exit status and message:

  -ngl / --n-gpu-layers: 0 runs on cpu.so; a GPU count with --backend
    cpu.so is refused naming cpu.so; with no backend named, a GPU backend
    that loads is taken, else the refusal names cpu.so; a partial count is
    refused with the model's layer count (on gpuemu.so, a device backend);
    all (99, -1, the layer count) runs there;
  -fa / --flash-attn [on|auto] accepted, off refused with the reason;
  -cnv / --conversation: `loom run` (or flags alone) becomes `loom chat`,
    -p the system prompt, the same replies as loom chat -sys;
  -hf, -hfr, --hf-repo: "loom downloads nothing, pass -m FILE", exit 1
    (never llama's -h -f bundle: no usage, no exit 0);
  -n -1 generates until the context is full (or the end of the sequence),
    and -n larger than the context generates until it is full, saying so;
  a word after one dash is matched whole: -xyz is refused by name, -n5
    still has its attached number, and "-p -fa" is a prompt.

Usage: test_llama_flags.py LOOM_BINARY   (model: $LOOM_MODEL; skips the
model parts without it)
"""
import os
import re
import subprocess
import sys

LOOM = sys.argv[1]
MODEL = os.environ.get("LOOM_MODEL", "")
QUIET = ["--no-progress", "-t", "2"]
failures = []
passed = 0


def run(*args, stdin=None, timeout=120):
    p = subprocess.run([LOOM, *args], input=stdin if stdin is not None else "",
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def check(name, cond, detail=""):
    global passed
    if cond:
        passed += 1
        print("ok   " + name)
    else:
        failures.append(name)
        print(f"FAIL {name}: {detail[-600:]}")


def gpu_layers():
    rc, out, err = run("run", "-m", MODEL, "-p", "hi", "-n", "2", "--temp", "0", "-ngl", "0", *QUIET)
    check("-ngl 0 runs every layer on cpu.so", rc == 0 and "backend cpu," in err, err)
    rc, out, err = run("run", "-m", MODEL, "-p", "hi", "-n", "2", "--backend", "ref.so",
                       "-ngl", "0", *QUIET)
    check("-ngl 0 keeps a named host backend (ref.so)", rc == 0 and "backend ref," in err, err)
    for spelling in ("-ngl", "--n-gpu-layers", "--gpu-layers"):
        rc, _, err = run("run", "-m", MODEL, "-p", "hi", "--backend", "cpu.so", spelling, "99")
        check(f"{spelling} 99 with --backend cpu.so is refused naming cpu.so",
              rc == 1 and "cpu.so runs on the CPU" in err and "-ngl 99" in err, err)
    rc, _, err = run("run", "-m", MODEL, "-p", "hi", "-n", "1", "-ngl", "99", *QUIET)
    if rc == 0:  # a machine with a GPU backend that finds its device
        check("-ngl 99 takes a GPU backend", re.search(r"backend (cuda|rocm),", err), err)
    else:
        check("-ngl 99 without a GPU backend is refused naming cpu.so",
              rc == 1 and "no GPU backend loads here" in err and "cpu.so" in err, err)
    rc, _, err = run("run", "-m", MODEL, "-p", "hi", "-ngl", "many")
    check("-ngl takes a number", rc == 1 and "'many' is not an integer" in err, err)
    rc, _, err = run("run", "-m", MODEL, "-p", "hi", "-ngl", "-2")
    check("-ngl below -1 is refused", rc == 1 and "not an integer in [-1" in err, err)
    rc, _, err = run("run", "-m", MODEL, "-p", "hi", "--backend", "ref.so", "-ngl", "5")
    check("-ngl 5 on ref.so is refused as a host backend", rc == 1 and "ref.so runs on the CPU" in err, err)


def partial_offload():
    """gpuemu.so stands for a device backend (test-only, build tree)."""
    rc, _, err = run("backends", "--json")
    if "gpuemu" not in (err + _):
        print("skip: gpuemu.so not built")
        return
    for spelling in ("-ngl", "--n-gpu-layers"):
        rc, _, err = run("run", "-m", MODEL, "-p", "hi", "--backend", "gpuemu.so", spelling, "5", *QUIET)
        check(f"{spelling} 5 on a device backend is refused: no partial offload",
              rc == 1 and "5 GPU layers of the model's 30" in err and "no partial offload" in err,
              err)
    rc, _, err = run("run", "-m", MODEL, "-p", "hi", "--backend", "gpuemu.so", "-ngl", "29", *QUIET)
    check("-ngl 29 of 30 layers is partial, refused", rc == 1 and "29 GPU layers" in err, err)
    rc, _, err = run("run", "-m", MODEL, "-p", "hi", "--backend", "gpuemu.so", "-ngl", "0")
    check("-ngl 0 with a device backend is refused",
          rc == 1 and "-ngl 0 keeps every layer on the CPU" in err and "gpuemu.so" in err, err)
    for n in ("99", "-1", "30"):
        rc, _, err = run("run", "-m", MODEL, "-p", "hi", "-n", "1", "--temp", "0",
                         "--backend", "gpuemu.so", "-ngl", n, *QUIET, timeout=300)
        check(f"-ngl {n} runs all 30 layers on the device backend",
              rc == 0 and "backend gpuemu," in err, err)


def flash_attn():
    base = ["run", "-m", MODEL, "-p", "hi", "-n", "2", "--temp", "0", *QUIET]
    ref = run(*base)
    for extra in (["-fa"], ["--flash-attn"], ["-fa", "on"], ["-fa", "auto"], ["--flash-attn", "on"],
                  ["--flash-attn=true"]):
        rc, out, err = run(*base, *extra)
        check("%s is accepted, the same text" % " ".join(extra), rc == 0 and out == ref[1], err)
    for extra in (["-fa", "off"], ["--flash-attn=off"]):
        rc, _, err = run(*base, *extra)
        check("%s is refused with the reason" % " ".join(extra),
              rc == 1 and "always flash-style" in err, err)


def conversation():
    turn = "What is 2+2?\n"
    sys_prompt = "You are terse."
    greedy = ["-n", "8", "--temp", "0", *QUIET]
    rc, want, err0 = run("chat", "-m", MODEL, "-sys", sys_prompt, *greedy, stdin=turn)
    check("loom chat answers", rc == 0 and want.strip() and "loom chat:" in err0, err0)
    for spelling in ("-cnv", "--conversation"):
        rc, out, err = run("run", "-m", MODEL, spelling, "-p", sys_prompt, *greedy, stdin=turn)
        check(f"loom run {spelling} is loom chat, -p its system prompt",
              rc == 0 and out == want and "loom chat:" in err, f"{out!r} vs {want!r} {err}")
    rc, out, err = run("-m", MODEL, "-cnv", "-p", sys_prompt, *greedy, stdin=turn)
    check("flags alone with -cnv are loom chat (llama-cli)", rc == 0 and out == want, err)
    rc, _, err = run("-m", MODEL, "-p", "hi")
    check("flags alone without -cnv: a command comes first", rc == 2 and "loom run -m FILE" in err, err)
    rc, _, err = run("run", "-m", MODEL, "-p", "hi", "-no-cnv")
    check("-no-cnv is refused by name", rc == 1 and "-no-cnv" in err, err)


def downloads():
    for cmd in (["run"], ["chat"], ["serve"], ["bench"], []):
        for flag in ("-hf", "-hfr", "--hf-repo"):
            rc, out, err = run(*cmd, flag, "ggml-org/gemma-3-1b-it-GGUF")
            check(f"{' '.join(cmd + [flag])} is refused: loom downloads nothing",
                  rc == 1 and f"{flag}: loom downloads nothing, pass -m FILE" in err and
                  "usage" not in out, out + err)


def whole_words():
    rc, _, err = run("run", "-m", MODEL, "-p", "hi", "-xyz")
    check("-xyz is refused whole", rc == 1 and "'-xyz'" in err and "never single letters bundled" in err, err)
    rc, _, err = run("run", "-m", MODEL, "-p", "hi", "-n3", "--temp", "0", *QUIET)
    check("-n3 still reads as -n 3", rc == 0 and "generated 3 tokens" in err, err)
    # "-fa" is -p's value, not a flag: the prompt is the 3 characters
    rc, out, _ = run("tokenize", "-m", MODEL, "--no-bos", "--", "-fa")
    want = len(out.split())
    rc, _, err = run("run", "-m", MODEL, "--no-bos", "-p", "-fa", "-n", "1", "--temp", "0", *QUIET)
    check("-p -fa is a prompt, not a flag",
          rc == 0 and want > 0 and f"prompt {want} tokens" in err, err)


def context_fill():
    rc, out, err = run("tokenize", "-m", MODEL, "hi")
    n_prompt = len(out.split())
    rc, out, err = run("run", "-m", MODEL, "-p", "hi", "-n", "-1", "-c", "32", "--temp", "0", *QUIET)
    m = re.search(r"generated (\d+) tokens", err)
    made = int(m.group(1)) if m else -1
    full = "stopped: the context (32 tokens) is full" in err
    check("-n -1 generates until the end of the sequence or a full context",
          rc == 0 and 0 < made <= 32 - n_prompt and (full == (made == 32 - n_prompt)), err)
    rc, out, err = run("run", "-m", MODEL, "-p", "The capital of France is", "-n", "100000",
                       "-c", "64", "--temp", "0", *QUIET)
    m = re.search(r"the prompt takes (\d+); generating until it is full \((\d+) tokens at most\)", err)
    g = re.search(r"generated (\d+) tokens", err)
    check("-n beyond the context generates until it is full and says so",
          rc == 0 and m and int(m.group(1)) + int(m.group(2)) == 64 and "-n 100000 does not fit" in err
          and g and (int(g.group(1)) == int(m.group(2))) == ("is full" in err.split("generated")[-1]),
          err)


def main():
    downloads()
    if not os.path.exists(MODEL):
        print("skip: the model parts (no LOOM_MODEL)")
    else:
        gpu_layers()
        partial_offload()
        flash_attn()
        conversation()
        whole_words()
        context_fill()
    print(f"{passed} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
