"""`loom run` and `loom check-backend` refuse a broken backend in one line,
with a non-zero exit and no signal: a wild table, a table of 0xff, a good
head over wild slots, an entry symbol that is data, a slot that points
into libc's text (code, but not the backend's), and a copy of a good
backend whose ELF header says aarch64 (or x86_64 on an aarch64 host).
`loom run --spec` and `loom quantize --strategy` refuse spec and
quant-strategy plugins the same way: a wild name, a wild optional slot
(observe, input_scales), a wild required slot, a required slot in libc.

argv[1] is the loom binary, argv[2] the folder of the fake backends.
"""
import os
import platform
import shutil
import subprocess
import sys
import tempfile

LOOM, MODS = sys.argv[1], sys.argv[2]
MODEL = os.environ.get("LOOM_MODEL", "/nonexistent.gguf")
failures = []


def refuse(what, path, expect, cmd):
    args = [LOOM, *cmd(path)]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    expect = [expect] if isinstance(expect, str) else expect
    ok = (p.returncode > 0 and len(lines) == 1 and all(e in lines[0] for e in expect)
          and os.path.basename(path) in lines[0])
    print(f"{'ok  ' if ok else 'FAIL'} {what} {cmd(path)[0]}: rc={p.returncode} {lines}")
    if not ok:
        failures.append(what)


def foreign_copy(tmp):
    """good.so with e_machine patched to another architecture."""
    path = os.path.join(tmp, "foreign.so")
    shutil.copy(os.path.join(MODS, "good.so"), path)
    host = platform.machine()
    other, name = (62, "x86_64") if host == "aarch64" else (183, "aarch64")
    with open(path, "r+b") as f:
        f.seek(18)
        f.write(other.to_bytes(2, "little"))
    return path, f"built for {name}, this is {host}"


def main():
    run = lambda p: ["run", f"--backend={p}", "--model", MODEL, "-p", "x", "-n", "1"]
    check = lambda p: ["check-backend", p]
    cases = [
        ("wild table", "wild_table.so", "outside the plugin's readable segments"),
        ("0xff table", "ff_table.so", "ABI major 4294967295"),
        ("0xff slots", "ff_slots.so", "points outside the plugin's own code"),
        ("data entry", "data_entry.so", "is not a function"),
        ("slot in libc", "libc_slot.so", ["slot gemm", "outside the plugin's own code"]),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        path, text = foreign_copy(tmp)
        for what, file, expect in cases + [("foreign ELF", path, text)]:
            full = os.path.join(MODS, file)
            refuse(what, full, expect, run)
            refuse(what, full, expect, check)
    spec = lambda p: ["run", "--model", MODEL, f"--spec={p}", "-p", "x", "-n", "1"]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.gguf")
        quant = lambda p: ["quantize", MODEL, out, "q8_0", "--strategy", p]
        name = "name (0xdead0000) is not a readable string"
        own = "outside the plugin's own code"
        for what, file, expect, cmd in [
                ("spec: wild name", "spec_wild_name.so", [name], spec),
                ("spec: wild observe", "spec_wild_observe.so", ["slot observe", own], spec),
                ("spec: wild propose", "spec_wild_propose.so", ["slot propose", own], spec),
                ("spec: propose in libc", "spec_libc_propose.so", ["slot propose", own], spec),
                ("qstrategy: wild name", "qs_wild_name.so", [name], quant),
                ("qstrategy: wild input_scales", "qs_wild_scales.so",
                 ["slot input_scales", own], quant),
                ("qstrategy: wild quantize", "qs_wild_quantize.so", ["slot quantize", own],
                 quant),
                ("qstrategy: quantize in libc", "qs_libc_quantize.so", ["slot quantize", own],
                 quant)]:
            refuse(what, os.path.join(MODS, file), expect, cmd)
    if failures:
        sys.exit(f"{len(failures)} failed: {', '.join(failures)}")


main()
