#!/usr/bin/env python3
"""Mixture-of-experts models: loom against the NumPy reference.

Usage: test_moe.py LOOM_BINARY MKGGUF_PY [OLD_ABI_BACKEND ...]

For each case below, tools/mkgguf.py writes a small random MoE model
(2 layers, GQA 4 query / 2 KV heads) and, on cpu.so (exact mode) and
ref.so, which run the routed experts through their moe slot (backend ABI
1.6), on each OLD_ABI_BACKEND (ref_abi11.so: ref.so's operators behind a
table without the slot, which runs them through the host's fallback:
per-expert gemm calls, core/model/moe_exec.c) and on gpuemu.so (the GPU
kernels, emulated, with their moe slot: routing on the device, each
expert's rows grouped):
  - the logits of the last prompt position must match the reference
    (tests/e2e/ref_llama.py, float64): max|loom - ref| / max|ref| < TOL
    and the same top-1 token;
  - the greedy continuation of N_GEN tokens must equal the reference's,
    up to a near tie (as tests/synth/test_synth.py judges them);
  - gpuemu.so's greedy tokens (exact mode) must be ref.so's exactly.
Cases: Mixtral (general.architecture llama with llama.expert_count; 4
experts, 2 routed; and 8 experts, 1 routed), qwen3moe (8 experts, 3
routed, expert FFN narrower than the dense one, QK-norm), qwen2moe (4
experts, 2 routed, shared expert with its sigmoid gate, weights not
normalised), over the f32, f16, q8_0, q4_0 and mxfp4 formats (mxfp4:
E2M1 values with an E8M0 scale, the gpt-oss experts' format, here for
every matrix).

Each routing feature must matter, so an engine that got it wrong would
fail: the reference with one more or one fewer routed expert ("topk"),
with the normalisation of the chosen weights flipped ("norm"), with the
experts picked by the lowest instead of the highest probability
("route"), without the shared expert ("shared") or without its gate
("sharedgate") must move the logits by more than 10 * TOL: ten times what
the logits check allows and about 1e4 times loom's measured error (~2e-7).
One expert more or less of 3, or the normalisation, moves them by only a
few percent on these random models (measured 0.03-0.07), which is why the
bar is not test_synth.py's 100 * TOL; the other features move them by
0.2-0.5.

Batch invariance: cpu.so in its fast mode with LOOM_CPU_INVARIANT=1 gives
the same logits bit for bit whether the prompt is read in one batch (each
expert's rows one GEMM) or in chunks of 3 tokens (other rows share each
expert's GEMMs); fast mode's logits (8-bit activations) stay within
FAST_TOL of the reference.

Refusals: files whose expert keys are missing or out of range, or whose
expert tensors do not have the shape the keys give, are refused by
`loom run` with a message naming the key or tensor (REFUSALS below;
tools/mkgguf.py is run in this process with its expert keys replaced).

MXFP4: `loom quantize` writes it (the f32 Qwen2-MoE case, every expert
tensor, the router kept f32), bytewise what the gguf package's quantizer
writes, and reads it back to f32 bitwise as the gguf package decodes it.

Distributed (when mpirun is on PATH): `--pp 2` (each rank holds its
layers' experts) gives the single process's greedy tokens; `--tp 2
--exact` (experts whole on each rank) its tokens and logits bit for bit,
`--tp 2` outside exact mode (every expert's FFN columns split, the moe
output all-reduced) its logits within float rounding (check_tp).

Exit 77 (skip) when numpy or gguf are missing.
"""

import os
import sys
import tempfile
import time

TOL = 1e-3
FAST_TOL = 0.05
# gpuemu.so's exact mode is ~1e-3 from ref.so on these models with no
# experts at all (a dense llama q8_0 of the same shapes: 7.5e-4 measured;
# the Mixtral q8_0 case 1.3e-3), so the emulated GPU gets a wider bound
GPU_TOL = 5e-3
N_GEN = 12
BACKENDS = ("cpu.so", "ref.so")
PROMPT = "the quick brown fox jumps over the lazy dog and then it runs"

SMALL = ["--layers", "2", "--heads", "4", "--kv-heads", "2", "--ctx", "256",
         "--embd", "64", "--vocab", "300"]
# (name, mkgguf arguments, features the reference must depend on)
CASES = (
    ("mixtral-e4k2-q8_0", ["--arch", "mixtral", "--ff", "128", "--type",
                           "q8_0", "--experts", "4", "--experts-used", "2"],
     ("topk", "norm", "route")),
    ("mixtral-e8k1-f16", ["--arch", "mixtral", "--ff", "64", "--type", "f16",
                          "--experts", "8", "--experts-used", "1"],
     ("topk", "route")),
    ("qwen3moe-e8k3-q4_0", ["--arch", "qwen3moe", "--ff", "192",
                            "--expert-ff", "64", "--type", "q4_0",
                            "--experts", "8", "--experts-used", "3"],
     ("topk", "norm", "route")),
    ("qwen3moe-e4k2-mxfp4", ["--arch", "qwen3moe", "--ff", "128",
                             "--expert-ff", "64", "--type", "mxfp4",
                             "--experts", "4", "--experts-used", "2"],
     ("topk", "route")),
    ("qwen2moe-e4k2-f32", ["--arch", "qwen2moe", "--ff", "128",
                           "--expert-ff", "64", "--shared-ff", "96",
                           "--type", "f32", "--experts", "4",
                           "--experts-used", "2"],
     ("topk", "norm", "route", "shared", "sharedgate")),
)


# (what is broken, expert keys written (None: left out), expected message)
REFUSALS = (
    ("no expert_used_count", {"expert_used_count": None},
     "missing key 'qwen3moe.expert_used_count'"),
    ("no expert_count", {"expert_count": None},
     "missing key 'qwen3moe.expert_count'"),
    ("expert_count 0", {"expert_count": 0},
     "key 'qwen3moe.expert_count' is 0; it must be 1 to"),
    ("more used than experts", {"expert_used_count": 5},
     "key 'qwen3moe.expert_used_count' is 5; it must be 1 to 4"),
    ("no expert_feed_forward_length", {"expert_feed_forward_length": None},
     "missing key 'qwen3moe.expert_feed_forward_length'"),
    ("expert FFN size not the tensors'", {"expert_feed_forward_length": 32},
     "tensor 'blk.0.ffn_gate_exps.weight': shape [64, 64, 4]"),
    ("expert_count not the tensors'", {"expert_count": 3},
     "tensor 'blk.0.ffn_gate_inp.weight': shape"),
    ("expert_weights_norm not a bool", {"expert_weights_norm": 7},
     "qwen3moe.expert_weights_norm"),
)


def write_broken(mkgguf, path, keys):
    """A qwen3moe file (4 experts, 2 routed, expert FFN 64) whose expert
    keys are `keys` over the right ones (None: left out)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("mkgguf_broken", mkgguf)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def add_moe_metadata(w, a, arch):
        want = {"expert_count": a.experts,
                "expert_used_count": a.experts_used,
                "expert_feed_forward_length": a.expert_ff}
        want.update(keys)
        for k, v in want.items():
            if v is not None:
                w.add_uint32(arch + "." + k, v)
    mod.add_moe_metadata = add_moe_metadata
    mod.main([path, "-q", "--arch", "qwen3moe", "--type", "f32",
              "--expert-ff", "64", "--experts", "4", "--experts-used", "2"]
             + SMALL + ["--ff", "128"])


def check_refusals(loom, mkgguf, tmp, fails):
    import subprocess
    for what, keys, want in REFUSALS:
        path = os.path.join(tmp, "broken.gguf")
        write_broken(mkgguf, path, keys)
        p = subprocess.run([loom, "run", "--backend=ref.so", "--model", path,
                            "-p", "a", "-n", "1"], capture_output=True,
                           timeout=60)
        err = p.stderr.decode(errors="replace")
        fails.check(p.returncode not in (0, -11, -6) and want in err,
                    "refused (%s): exit %d, says %r" %
                    (what, p.returncode, err.strip()[-200:]))


def mpi_env():
    """OpenMPI's settings for root in a container; None without mpirun."""
    import shutil
    if not shutil.which("mpirun"):
        return None
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_mpi_yield_when_idle="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    # a sanitizer build: no leak check after OpenMPI's init (scripts/asan.sh)
    env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "").replace(
        "detect_leaks=1", "detect_leaks=0")
    return env


def dist_run(loom, path, backend, tmp, extra, env, ranks=0):
    """Greedy tokens and the dumped logits (a flat float32 list) of one
    `loom run`, under `mpirun -np ranks` when ranks; stderr too."""
    import array
    import subprocess
    toks, logits = os.path.join(tmp, "dist.txt"), os.path.join(tmp, "dist.bin")
    pre = ["mpirun", "-np", str(ranks)] if ranks else []
    cmd = pre + [loom, "run", "--backend=" + backend, "--model", path, "-p", PROMPT,
                 "-n", str(N_GEN), "--temp", "0", "--no-progress", "-t", "1",
                 "--kv-type", "f32", "--dump-tokens", toks, "--dump-logits", logits] + extra
    p = subprocess.run(cmd, capture_output=True, timeout=240,
                       env=dict(env, LOOM_DEBUG="1"))
    err = p.stderr.decode(errors="replace")
    if p.returncode:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd[-12:]), p.returncode, err[-500:]))
    with open(toks) as f:
        t = f.read().split()
    v = array.array("f")
    with open(logits, "rb") as f:
        v.frombytes(f.read())
    return t, list(v), err


def check_tp(loom, path, label, tmp, fails):
    """--tp 2 on ref.so: with --exact the experts are held whole by each
    rank and the tokens and logits are the single process's bit for bit;
    outside it each rank holds half of every expert's FFN columns (and of
    the shared expert's), and the moe outputs summed by an all-reduce give
    logits within 1e-4 of the largest (the sums' other order). A rank that
    skipped the all-reduce, added the expert down bias twice or read
    another rank's columns would be off by whole units."""
    env = mpi_env()
    if env is None:
        print("note: no mpirun, --tp checks skipped")
        return
    for exact in (True, False):
        extra = ["--exact"] if exact else []
        t1, l1, _ = dist_run(loom, path, "ref.so", tmp, extra, env)
        t2, l2, err = dist_run(loom, path, "ref.so", tmp, extra + ["--tp", "2"], env, 2)
        said = "experts held whole" if exact else "experts split by FFN columns"
        fails.check(said in err, "%s --tp 2%s: says %r" %
                    (label, " --exact" if exact else "", said))
        scale = max(abs(x) for x in l1) if l1 else 0.0
        worst = max((abs(a - b) for a, b in zip(l1, l2)), default=float("inf"))
        if exact:
            fails.check(t1 == t2 and l1 == l2 and len(t1) > 0,
                        "%s --tp 2 --exact: the single process's %d tokens and "
                        "%d logits bit for bit (worst %g)" % (label, len(t1), len(l1), worst))
        else:
            fails.check(len(l1) == len(l2) and worst <= 1e-4 * max(scale, 1.0),
                        "%s --tp 2 (experts split, all-reduced): logits within %.3g "
                        "of the single process's (largest %.3g); tokens %s" %
                        (label, worst, scale, "the same" if t1 == t2 else "differ"))


def check_dist(synth, loom, tmp, fails):
    """--pp 2 equals one process on the qwen2moe case; --tp 2 on it (a
    shared expert) and on the qwen3moe q4_0 case (down matrices split on
    their 32-value blocks)."""
    env = mpi_env()
    if env is None:
        print("note: no mpirun, distributed checks skipped")
        return
    path = os.path.join(tmp, CASES[-1][0] + ".gguf")
    t1, _, _ = dist_run(loom, path, "ref.so", tmp, [], env)
    t2, _, _ = dist_run(loom, path, "ref.so", tmp, ["--pp", "2"], env, 2)
    fails.check(t1 == t2 and len(t1) > 0,
                "--pp 2 on %s: the single process's %d tokens" % (CASES[-1][0], len(t1)))
    for case in (CASES[-1], CASES[2]):
        check_tp(loom, os.path.join(tmp, case[0] + ".gguf"), case[0], tmp, fails)


def check_quantize(synth, np, loom, tmp, fails):
    """`loom quantize` to mxfp4 and back on the f32 qwen2moe case: each
    quantized tensor's bytes are the gguf package's quantizer's, the
    router stays f32, and f32 again is the gguf package's dequantization."""
    import gguf
    from gguf.quants import quantize, dequantize
    src = os.path.join(tmp, CASES[-1][0] + ".gguf")
    mx, back = os.path.join(tmp, "mx.gguf"), os.path.join(tmp, "back.gguf")
    synth.run([loom, "quantize", src, mx, "mxfp4"])
    synth.run([loom, "quantize", mx, back, "f32", "--allow-requantize"])
    orig = {t.name: t for t in gguf.GGUFReader(src).tensors}
    got = {t.name: t for t in gguf.GGUFReader(mx).tensors}
    again = {t.name: t for t in gguf.GGUFReader(back).tensors}
    MX = gguf.GGMLQuantizationType.MXFP4
    n_mx = n_ok = n_back = 0
    for name, t in got.items():
        if t.tensor_type != MX:
            continue
        n_mx += 1
        x = np.asarray(orig[name].data, dtype=np.float32)
        x = x.reshape(-1, int(orig[name].shape[0]))
        n_ok += bool(np.array_equal(quantize(x, MX).ravel(),
                                    np.asarray(t.data).ravel()))
        n_back += bool(np.array_equal(dequantize(t.data, MX).ravel(),
                                      np.asarray(again[name].data).ravel()))
    exps = [n for n in got if n.endswith("_exps.weight")]
    fails.check(n_mx > 0 and all(got[n].tensor_type == MX for n in exps) and
                got["blk.0.ffn_gate_inp.weight"].tensor_type ==
                gguf.GGMLQuantizationType.F32,
                "quantize mxfp4: %d tensors mxfp4 (every expert tensor), "
                "the router f32" % n_mx)
    fails.check(n_ok == n_mx and n_back == n_mx,
                "quantize mxfp4: %d/%d bytewise the gguf package's, %d/%d "
                "back to f32 bitwise its dequantization" %
                (n_ok, n_mx, n_back, n_mx))


def skip(msg):
    print("SKIP: " + msg)
    sys.exit(77)


def variant_logits(np, ref_llama, path, feature, ids):
    """Reference logits with one routing feature changed."""
    m = ref_llama.Model(path, np.float64)
    if feature == "topk":
        k = m.n_expert_used
        m.n_expert_used = k + 1 if k < m.n_expert else k - 1
    elif feature == "norm":
        m.expert_norm = not m.expert_norm
    elif feature == "route":
        route = m.route

        def lowest(logits):
            ids, w = route(-logits)   # the least likely experts instead
            return ids, w
        m.route = lowest
    elif feature == "shared":
        m.shared_expert = False
    elif feature == "sharedgate":
        m.shared_gate = False
    return m.forward(ids, 0, m.new_cache())[-1]


def loom_logits(synth, np, loom, path, backend, tmp, env, extra=()):
    lpath = os.path.join(tmp, "logits.f32")
    tpath = os.path.join(tmp, "tokens.txt")
    for p in (lpath, tpath):
        if os.path.exists(p):
            os.unlink(p)
    old = dict(os.environ)
    os.environ.update(env)
    try:
        synth.run([loom, "run", "--backend=" + backend, "--model", path,
                   "-p", PROMPT, "-n", str(N_GEN), "--temp", "0",
                   "--kv-type", "f32", "--dump-logits", lpath,
                   "--dump-tokens", tpath] + list(extra))
    finally:
        os.environ.clear()
        os.environ.update(old)
    with open(tpath) as f:
        return np.fromfile(lpath, dtype="<f4"), synth.parse_ids(f.read())


def check_logits(np, fails, tag, ref, got, tol):
    if not fails.check(got.shape == ref.shape and
                       bool(np.all(np.isfinite(got))),
                       "%s: %d finite logits (want %d)" %
                       (tag, got.size, ref.size)):
        return
    err = float(np.max(np.abs(got.astype(np.float64) - ref)))
    scale = float(np.max(np.abs(ref)))
    fails.check(err / scale < tol, "%s: logits max|diff| %.3g / max|ref| "
                "%.3g = %.3g < %g" % (tag, err, scale, err / scale, tol))
    fails.check(int(np.argmax(got)) == int(np.argmax(ref)),
                "%s: top-1 %d (ref %d)" %
                (tag, int(np.argmax(got)), int(np.argmax(ref))))


def one_case(synth, np, ref_llama, loom, mkgguf, tmp, seed, case, old, fails):
    name, args, features = case
    print("== %s: mkgguf %s" % (name, " ".join(args)))
    path = os.path.join(tmp, name + ".gguf")
    synth.run([sys.executable, mkgguf, path, "-q", "--seed", str(seed)] +
              SMALL + args)
    ref = ref_llama.Model(path, np.float64)
    fails.check(ref.moe, "%s: the reference reads it as a mixture of "
                "experts (%d experts, %d routed)" %
                (name, ref.n_expert, ref.n_expert_used))
    ids = synth.parse_ids(synth.run([loom, "tokenize", "--model", path,
                                     "--no-bos", PROMPT]))
    ids = [int(ref.meta("tokenizer.ggml.bos_token_id"))] + ids
    eos = int(ref.meta("tokenizer.ggml.eos_token_id", -1))
    first, out, steps = ref.generate(ids, N_GEN)
    scale = float(np.max(np.abs(first)))
    for feat in features:
        alt = variant_logits(np, ref_llama, path, feat, ids)
        moved = float(np.max(np.abs(alt - first))) / scale
        fails.check(moved > 10 * TOL, "%s: reference with '%s' changed "
                    "moves logits by %.3g > %g" % (name, feat, moved,
                                                   10 * TOL))
    exact = {"LOOM_CPU_EXACT": "1", "LOOM_GPU_EXACT": "1"}
    got = {}
    for be in BACKENDS + tuple(old):
        tag = "%s %s" % (name, os.path.basename(be))
        try:
            logits, toks = loom_logits(synth, np, loom, path, be, tmp, exact)
        except (RuntimeError, OSError) as e:
            fails.check(False, "%s: loom run: %s" % (tag, e))
            continue
        tol = GPU_TOL if "gpuemu" in os.path.basename(be) else TOL
        check_logits(np, fails, tag, first, logits, tol)
        ok, msg = synth.compare_tokens(out, steps, eos, toks, tol * scale)
        fails.check(ok, "%s: greedy tokens: %s" % (tag, msg))
        got[os.path.basename(be)] = toks
        if "gpuemu" in os.path.basename(be) and "ref.so" in got:
            fails.check(toks == got["ref.so"], "%s: exact greedy tokens "
                        "are ref.so's (%d)" % (tag, len(toks)))
    check_fast(synth, np, loom, path, name, first, tmp, fails)
    check_geometry(synth, loom, path, name, ref, fails)


def check_geometry(synth, loom, path, name, ref, fails):
    """`loom info` and the memory plan state the experts' bytes: the
    three expert tensors of each layer, and k of n experts a token."""
    import subprocess
    import gguf
    exps = [t for t in gguf.GGUFReader(path).tensors
            if t.name.endswith("_exps.weight")]
    total = sum(int(t.n_bytes) for t in exps)
    info = synth.run([loom, "info", path])
    want = "routed experts %d tensors %14d bytes" % (len(exps), total)
    fails.check(want in info and "a token reads %d of %d experts" %
                (ref.n_expert_used, ref.n_expert) in info,
                "%s: loom info states %r" % (name, want))
    env = dict(os.environ, LOOM_DEBUG="1")
    p = subprocess.run([loom, "run", "--backend=ref.so", "--model", path,
                        "-p", "a", "-n", "1"], capture_output=True,
                       timeout=60, env=env)
    err = p.stderr.decode(errors="replace")
    want = "of which routed experts %.1f MiB (%d of %d a token" % (
        total / 1048576.0, ref.n_expert_used, ref.n_expert)
    fails.check(want in err, "%s: the memory plan states %r" % (name, want))


def check_fast(synth, np, loom, path, name, ref_first, tmp, fails):
    """cpu.so fast mode: invariant logits across prompt chunking, and
    within FAST_TOL of the reference."""
    inv = {"LOOM_CPU_INVARIANT": "1", "LOOM_CPU_EXACT": "0"}
    try:
        whole, _ = loom_logits(synth, np, loom, path, "cpu.so", tmp, inv)
        chunked, _ = loom_logits(synth, np, loom, path, "cpu.so", tmp, inv,
                                 ["-b", "3"])
        # one row a step: the experts of a decode row as two pool tasks
        # (cpu_gemm_experts) where the format has a group kernel
        single, _ = loom_logits(synth, np, loom, path, "cpu.so", tmp, inv,
                                ["-b", "1"])
    except (RuntimeError, OSError) as e:
        fails.check(False, "%s fast: loom run: %s" % (name, e))
        return
    fails.check(whole.shape == chunked.shape == single.shape and
                bool(np.array_equal(whole, chunked)) and
                bool(np.array_equal(whole, single)),
                "%s cpu.so fast, invariant: logits of one batch, of "
                "3-token chunks and of one token a step equal bit for bit" % name)
    err = float(np.max(np.abs(whole.astype(np.float64) - ref_first)))
    scale = float(np.max(np.abs(ref_first)))
    fails.check(err / scale < FAST_TOL, "%s cpu.so fast: logits max|diff| "
                "/ max|ref| = %.3g < %g" % (name, err / scale, FAST_TOL))


def main():
    if len(sys.argv) < 3:
        print("usage: test_moe.py LOOM_BINARY MKGGUF_PY [OLD_ABI_BACKEND ...]")
        return 2
    loom, mkgguf, old = sys.argv[1], sys.argv[2], sys.argv[3:]
    try:
        import numpy as np
        import gguf  # noqa: F401
    except ImportError as e:
        skip("python module missing: %s" % e)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    sys.path.insert(0, os.path.join(here, "..", "e2e"))
    import ref_llama
    import test_synth as synth

    t0 = time.time()
    fails = synth.Failures()
    with tempfile.TemporaryDirectory(prefix="loom-moe-") as tmp:
        for seed, case in enumerate(CASES):
            try:
                one_case(synth, np, ref_llama, loom, mkgguf, tmp, seed, case,
                         old, fails)
            except (RuntimeError, OSError, ValueError, KeyError) as e:
                fails.check(False, "%s: %s" % (case[0], e))
        check_refusals(loom, mkgguf, tmp, fails)
        try:
            check_dist(synth, loom, tmp, fails)
        except (RuntimeError, OSError) as e:
            fails.check(False, "distributed: %s" % e)
        check_quantize(synth, np, loom, tmp, fails)
    print("%.1f s" % (time.time() - t0))
    if fails.list:
        print("%d check(s) failed" % len(fails.list))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
