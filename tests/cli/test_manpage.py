#!/usr/bin/env python3
"""The manual page and the bash completion come from the one options table:
every option of tools/options.c's table (read here from the source, not
from loom), its short letter and every llama.cpp spelling appear in the
built loom.1 and in the completion script; the page is what
`loom --help-man` prints and renders without groff warnings; the script
parses and completes commands, options and file names.

Usage: test_manpage.py LOOM loom.1 COMPLETION tools/options.c
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

LOOM, MAN, COMPLETION, OPTIONS_C = sys.argv[1:5]
failures = []


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else ": " + str(detail)[-400:]))
    if not cond:
        failures.append(name)


def table():
    """Long names and short letters of the opts table; llama.cpp's
    spellings (aliases and refusals)."""
    src = open(OPTIONS_C).read()
    body = src[src.index("opts[] = {"):src.index("#define N_OPTS")]
    longs = re.findall(r'\{ \.name = "([a-z0-9-]+)"', body)
    shorts = re.findall(r"\.short_name = '(.)'", body)
    alias = src[src.index("flag_aliases[] = {"):src.index("flag_refusals[] = {")]
    spellings = re.findall(r'\{ "(-[a-z-]+)", "', alias)
    refused = src[src.index("flag_refusals[] = {"):src.index("static const struct cmd_def")]
    return longs, shorts, spellings, re.findall(r'\{ "(-[a-z-]+)", "', refused)


def roff(s):
    return s.replace("-", "\\-")


def completes(words, cword):
    script = ('source "%s"; COMP_WORDS=(%s); COMP_CWORD=%d; _loom; printf "%%s\\n" "${COMPREPLY[@]}"'
              % (COMPLETION, " ".join("'%s'" % w for w in words), cword))
    p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    return p.stdout.split()


def main():
    longs, shorts, spellings, refused = table()
    check("the table was read", len(longs) > 80 and len(shorts) > 10 and len(spellings) > 10
          and len(refused) > 3, (len(longs), len(shorts), len(spellings), len(refused)))
    man = open(MAN).read()
    comp = open(COMPLETION).read()
    printed = subprocess.run([LOOM, "--help-man"], capture_output=True, text=True).stdout
    check("loom.1 is what loom --help-man prints", printed == man)
    miss_man = [n for n in longs if "\\fB\\-\\-%s\\fR" % roff(n) not in man]
    check("every option is in the manual page", not miss_man, miss_man)
    miss_short = [c for c in shorts if "\\fB\\-%s\\fR" % c not in man]
    check("every short letter is in the manual page", not miss_short, miss_short)
    miss_sp = [s for s in spellings + refused if roff(s) not in man]
    check("every llama.cpp spelling, taken or refused, is in the manual page", not miss_sp, miss_sp)
    words = set()
    for line in re.findall(r'words="([^"]*)"', comp):
        words.update(line.split())
    miss = [n for n in longs if "--" + n not in words] + [s for s in spellings if s not in words]
    miss += ["-" + c for c in shorts if "-" + c not in words]
    check("every option and spelling is a completion word", not miss, miss)
    if shutil.which("groff"):
        p = subprocess.run(["groff", "-man", "-ww", "-z", MAN], capture_output=True, text=True)
        check("groff renders the page without a warning", p.returncode == 0 and not p.stderr,
              p.stderr)
    p = subprocess.run(["bash", "-n", COMPLETION], capture_output=True, text=True)
    check("the completion script parses", p.returncode == 0, p.stderr)
    check("completes a command", completes(["loom", "ch"], 1) == ["chat", "check-backend"],
          completes(["loom", "ch"], 1))
    check("completes run's options", "--n-gpu-layers" in completes(["loom", "run", "--n-g"], 2))
    check("completes llama.cpp's spellings", "-ngl" in completes(["loom", "run", "-ng"], 2))
    check("serve's options, not run's", completes(["loom", "serve", "--api"], 2) == ["--api-key"]
          and completes(["loom", "run", "--api"], 2) == [])
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, "model.gguf"), "w").close()
        got = completes(["loom", "run", "-m", os.path.join(tmp, "mo")], 3)
        check("completes a file after -m", got == [os.path.join(tmp, "model.gguf")], got)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
