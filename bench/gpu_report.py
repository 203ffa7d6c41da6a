#!/usr/bin/env python3
"""The GPU issue's measurements in one command, for a machine with a GPU.

    python3 bench/gpu_report.py [--backend cuda.so] [--models smollm2,1b,8b]
        [--reps 3] [--prompt 512] [--gen 128] [--peak-gbs GB/s] [--skip-tests]

Run from the repository root after `bash scripts/setup.sh --test` (which builds
into build/). It:

1. runs the backend's tests: `meson test -C build gpu_load_<stem>` (create,
   `loom run`, the full conformance suite against ref.so),
   `gpu_e2e_<stem>` (32 greedy tokens equal cpu.so's, graphs replayed) and
   `backend_graphs` (step regions bit for bit against direct calls);
2. writes the random-weight llama models of the 1B and 8B presets with
   tools/mkgguf.py (q4_0, cached in ~/.cache/loom/) unless they exist;
3. runs `loom bench` on each model with step graphs on and off
   (LOOM_GPU_GRAPHS=0), prefill of --prompt tokens and decode of --gen;
4. prints a markdown table for docs/BENCHMARKS.md with the decode
   bandwidth: bytes of weights read per decoded token (every tensor but
   token_embd, which decode reads one row of, unless the output head is
   tied to it) times tokens per second, and its fraction of the card's
   peak (--peak-gbs, or looked up from nvidia-smi's name: H100 SXM 3350,
   H100 PCIe 2000, H100 NVL 3900, H200 4800 GB/s).

Every command is echoed before it runs, so the table can cite them.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

CACHE = os.path.expanduser("~/.cache/loom")
MODELS = {
    "smollm2": os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "1b": os.path.join(CACHE, "bench-llama-1b-q4_0.gguf"),
    "8b": os.path.join(CACHE, "bench-llama-8b-q4_0.gguf"),
}
PEAK_GBS = [("H200", 4800), ("H100 NVL", 3900), ("H100 PCIe", 2000), ("H100", 3350)]


def sh(cmd, env=None, check=True):
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if check and p.returncode != 0:
        sys.stdout.write(p.stdout + p.stderr)
        raise SystemExit(f"command failed with status {p.returncode}")
    return p


def run_tests(stem):
    p = sh(["meson", "test", "-C", "build", "--print-errorlogs", f"gpu_load_{stem}",
            f"gpu_e2e_{stem}", "backend_graphs"], check=False)
    lines = [l for l in p.stdout.splitlines() if re.match(r"\s*\d+/\d+ ", l)]
    print("\n".join(lines))
    return p.returncode == 0, lines


def ensure_model(name):
    path = MODELS[name]
    if not os.path.isfile(path):
        if name == "smollm2":
            raise SystemExit(f"{path} missing: run scripts/setup.sh --test first")
        os.makedirs(CACHE, exist_ok=True)
        sh([sys.executable, "tools/mkgguf.py", path, "--preset", name, "--type", "q4_0"])
    return path


def decode_bytes(path):
    """Bytes of weights one decode step reads."""
    from gguf import GGUFReader
    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors}
    total = sum(tensors.values())
    if "output.weight" in tensors:
        total -= tensors.get("token_embd.weight", 0)
    return total, os.path.getsize(path)


def bench(backend, model, args, graphs):
    env = dict(os.environ)
    if not graphs:
        env["LOOM_GPU_GRAPHS"] = "0"
    cmd = ["build/tools/loom", "bench", "--model", model, f"--backend={backend}",
           "-p", str(args.prompt), "-n", str(args.gen), "-r", str(args.reps)]
    if not graphs:
        print("$ LOOM_GPU_GRAPHS=0 \\")
    out = sh(cmd, env=env).stdout
    rates = {}
    for test in (f"pp{args.prompt}", f"tg{args.gen}"):
        m = re.search(r"\|\s*" + test + r"\s*\|\s*([\d.]+)\s*±\s*([\d.]+)", out)
        rates[test] = (float(m.group(1)), float(m.group(2))) if m else None
    return rates


def peak_gbs(args):
    if args.peak_gbs:
        return args.peak_gbs, "a device of the given peak bandwidth"
    p = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                       capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    name = p.stdout.strip().splitlines()[0] if p and p.returncode == 0 and p.stdout.strip() else ""
    for key, gbs in PEAK_GBS:
        if key in name:
            return gbs, name
    return None, name or "unknown device"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cuda.so")
    ap.add_argument("--models", default="smollm2,1b,8b")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--peak-gbs", type=float, default=0.0)
    ap.add_argument("--skip-tests", action="store_true")
    args = ap.parse_args()
    stem = args.backend[:-3] if args.backend.endswith(".so") else args.backend
    tests_ok, test_lines = (True, []) if args.skip_tests else run_tests(stem)
    peak, device = peak_gbs(args)
    rows = []
    for name in args.models.split(","):
        path = ensure_model(name)
        weights, size = decode_bytes(path)
        for graphs in (True, False):
            r = bench(args.backend, path, args, graphs)
            tg = r[f"tg{args.gen}"]
            gbs = weights * tg[0] / 1e9 if tg else None
            rows.append((name, size, graphs, r[f"pp{args.prompt}"], tg, gbs))
    print(f"\n{args.backend} on {device}; tests {'passed' if tests_ok else 'FAILED'}")
    for l in test_lines:
        print("    " + l.strip())
    fmt = lambda v: f"{v[0]:.1f} ± {v[1]:.1f}" if v else "-"
    print(f"\n| model | file MiB | graphs | pp{args.prompt} t/s | tg{args.gen} t/s "
          f"| decode GB/s | of peak{f' ({peak:.0f} GB/s)' if peak else ''} |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for name, size, graphs, pp, tg, gbs in rows:
        frac = f"{100 * gbs / peak:.1f}%" if gbs and peak else "-"
        print(f"| {name} | {size / 2**20:.0f} | {'on' if graphs else 'off'} | {fmt(pp)} "
              f"| {fmt(tg)} | {f'{gbs:.0f}' if gbs else '-'} | {frac} |")
    return 0 if tests_ok else 1


if __name__ == "__main__":
    sys.exit(main())
