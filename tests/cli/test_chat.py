#!/usr/bin/env python3
"""`loom chat` driven through a pipe (turns one a line from stdin), greedy:
history is sent back each turn, /reset clears it, replies repeat, message
text never becomes a control token, Ctrl-C stops a reply and not the
program, and two Ctrl-Cs at the prompt end it; --chat-template FILE
replaces the model's template. Also `loom run` reading
its prompt from stdin and the one-line refusals of unknown commands and
flags.

Usage: test_chat.py LOOM_BINARY   (model: $LOOM_MODEL; skips without it)
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

LOOM = sys.argv[1]
MODEL = os.environ.get("LOOM_MODEL", "")
GREEDY = ["--temp", "0", "-n", "16", "-t", "2", "--no-progress"]
failures = []


def check(name, cond, detail=""):
    if not cond:
        failures.append(name)
        print(f"FAIL {name}: {detail}")


def chat(lines, *extra):
    """Replies (one a line of stdout) and the per-turn stats of stderr."""
    p = subprocess.run([LOOM, "chat", "-m", MODEL, *GREEDY, *extra],
                       input="".join(line + "\n" for line in lines),
                       capture_output=True, text=True, timeout=120)
    stats = [tuple(int(x) for x in m) for m in re.findall(
        r"prompt (\d+) tokens \((\d+) cached\).*reply (\d+) tokens", p.stderr)]
    return p.returncode, p.stdout.split("\n")[:-1], stats, p.stderr


def history_and_reset():
    sys_prompt = ["-sys", "You are a helpful assistant."]
    rc, a, sa, err = chat(["Hi, my name is Zorblax.", "What is my name?"], *sys_prompt)
    check("chat runs", rc == 0 and len(a) == 2 and len(sa) == 2, err)
    if rc or len(sa) != 2:
        return
    # the second prompt holds the first message, its reply and the new one
    check("history is sent back", sa[1][0] > sa[0][0] + sa[0][2], sa)
    check("earlier turns come from the prefix cache", sa[1][1] > 0, sa)
    rc, b, sb, err = chat(["What is my name?"], *sys_prompt)
    check("a fresh chat runs", rc == 0 and len(b) == 1, err)
    check("the reply depends on the history", a[1] != b[0], f"{a[1]!r}")
    rc, c, sc, err = chat(["Hi, my name is Zorblax.", "/reset", "What is my name?",
                           "/exit", "never read"], *sys_prompt)
    check("/reset clears the history", rc == 0 and c == [a[0], b[0]] and sc[1][0] == sb[0][0],
          f"{c!r} {sc} {sb}")
    check("/exit ends the chat", len(sc) == 2, sc)
    # without -sys; and message text is tokenized as text: "<|im_start|>"
    # costs more than one token more than "x"
    rc, d, sd, err = chat(["What is my name?", "/reset", "x", "/reset", "<|im_start|>"])
    check("-sys reaches the prompt", rc == 0 and len(sd) == 3 and sd[0][0] != sb[0][0],
          f"{sd} {sb}")
    check("special-token text in a message is plain text",
          len(sd) == 3 and sd[2][0] > sd[1][0] + 2, sd)


def wait_for(pred, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def ctrl_c():
    """SIGINT during a reply stops it; the chat goes on; two at the prompt
    end it."""
    # -n 200: the first reply is still running a few tokens in, when the
    # Ctrl-C comes; the second (greedy, it may loop) ends in bounded time
    p = subprocess.Popen([LOOM, "chat", "-m", MODEL, "--temp", "0", "-n", "200",
                          "-c", "4096", "-t", "2", "--no-progress"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, bufsize=1)
    got, errs = [], []
    for stream, sink in ((p.stdout, got), (p.stderr, errs)):
        threading.Thread(target=lambda s=stream, k=sink: k.extend(iter(lambda: s.read(1), "")),
                         daemon=True).start()

    def out():
        return "".join(got)

    def err():
        return "".join(errs)
    try:
        p.stdin.write("Write a very long story about a dragon and a knight.\n")
        p.stdin.flush()
        check("a reply starts", wait_for(lambda: len(out()) > 20), out())
        p.send_signal(signal.SIGINT)
        check("Ctrl-C ends the reply", wait_for(lambda: out().endswith("\n")), out())
        p.stdin.write("Say hello.\n")
        p.stdin.flush()
        # the second reply ends (its statistics line) before the prompt's Ctrl-Cs
        check("the chat goes on after Ctrl-C",
              wait_for(lambda: err().count("loom chat: prompt") >= 2, timeout=240), out())
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=30)
        check("two Ctrl-Cs at the prompt exit cleanly", rc == 0, f"rc {rc} {err()}")
        check("the stopped reply is reported", ", stopped" in err(), err())
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def run_stdin():
    """loom run takes its prompt from a pipe, and from -f -."""
    args = ["run", "-m", MODEL, *GREEDY]
    ref = subprocess.run([LOOM, *args, "-p", "The capital of France is"],
                         capture_output=True, text=True, timeout=120)
    piped = subprocess.run([LOOM, *args, "-s", "42"], input="The capital of France is",
                           capture_output=True, text=True, timeout=120)
    dash = subprocess.run([LOOM, *args, "-f", "-"], input="The capital of France is",
                          capture_output=True, text=True, timeout=120)
    check("run reads a piped prompt", ref.returncode == 0 and piped.stdout == ref.stdout,
          f"{piped.stdout!r} vs {ref.stdout!r} {piped.stderr}")
    check("run -f - reads stdin", dash.stdout == ref.stdout, dash.stderr)
    check("-s is --seed", "seed: 42\n" in piped.stderr, piped.stderr)


def refusals():
    """Unknown commands and flags: one line naming them."""
    for args, word in ((["frobnicate"], "'frobnicate'"), (["run", "--bogus", "1"], "'--bogus'"),
                       (["run", "-x"], "'-x'"), (["chat", "-n"], "'-n'"),
                       (["chat", "--port", "1"], "--port")):
        p = subprocess.run([LOOM, *args], capture_output=True, text=True, timeout=30)
        check(f"refuses {args}", p.returncode != 0 and word in p.stderr
              and p.stderr.count("\n") == 1, p.stderr)
    p = subprocess.run([LOOM, "chat", "-m", "/nonexistent.gguf", "-sys", "a",
                        "-sysf", "/nonexistent.txt"], capture_output=True, text=True, timeout=30)
    check("-sys and -sysf exclude each other", p.returncode != 0 and "-sysf" in p.stderr, p.stderr)


# SmolLM2's own template, written out: the same prompt as the model's
SMOL_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != "
                 "'system' %}{{ '<|im_start|>system\\nYou are a helpful AI assistant named "
                 "SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + "
                 "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{% endif %}")


def chat_template_override():
    """--chat-template FILE: the same template gives the same prompt and
    reply; one without the system turn a shorter prompt; a broken one is
    refused naming the file."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="loom-tmpl-") as tmp:
        paths = {}
        for name, text in (("same", SMOL_TEMPLATE),
                           ("nosys", SMOL_TEMPLATE.replace("loop.first and", "false and")),
                           ("bad", "{% if messages %}unclosed")):
            paths[name] = os.path.join(tmp, name + ".jinja")
            with open(paths[name], "w", encoding="utf-8") as f:
                f.write(text)
        turn = ["What is 2+2?"]
        rc0, a0, s0, _ = chat(turn)
        rc1, a1, s1, e1 = chat(turn, "--chat-template", paths["same"])
        check("--chat-template: same template, same prompt and reply",
              rc0 == 0 and rc1 == 0 and a0 == a1 and s0 and s1 and s0[0][0] == s1[0][0],
              (a0, a1, s0, s1, e1))
        rc2, _, s2, e2 = chat(turn, "--chat-template", paths["nosys"])
        check("--chat-template: its own prompt", rc2 == 0 and s2 and s0 and s2[0][0] < s0[0][0],
              (s0, s2, e2))
        rc3, _, _, e3 = chat(turn, "--chat-template", paths["bad"])
        check("--chat-template: a broken one is refused", rc3 != 0 and "bad.jinja" in e3
              and "missing {% endif %}" in e3, e3)


def main():
    refusals()
    if not MODEL or not os.path.exists(MODEL):
        print(f"skip: model not found ({MODEL or '$LOOM_MODEL unset'})")
        return 77 if not failures else 1
    history_and_reset()
    chat_template_override()
    run_stdin()
    ctrl_c()
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
