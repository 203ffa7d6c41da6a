#!/usr/bin/env python3
"""Write a llama-shaped GGUF with random weights, for tests and benchmarks.

    mkgguf.py OUT.gguf [--arch llama|mistral|qwen2|qwen3|phi3|gemma2|gemma3|
                              mixtral|qwen3moe|qwen2moe|gpt-oss]
        [--layers L] [--embd E]
        [--ff F] [--heads H] [--kv-heads K] [--vocab V] [--ctx C]
        [--type q4_0] [--seed S] [--tied] [--rope-scale 2.0] [--rope-freqs]
        [--rope-llama3 ORIG_CTX]
        [--window W] [--swa-pattern P]       (gemma2/3; llama/mistral: all layers)
        [--attn-softcap C] [--final-softcap C]    (gemma2)
        [--rope-factors]                          (phi3: LongRoPE factors)
        [--experts E] [--experts-used K] [--expert-ff F] [--shared-ff F]
                                                  (mixtral, qwen3moe, qwen2moe)
    mkgguf.py OUT.gguf --preset 1b|8b [--type q4_0]     (sizes for speed runs)

The file is what a converter would write for a llama / qwen2 model:
general.* and <arch>.* hyperparameters, a byte-level BPE tokenizer
(tokenizer.ggml.model "gpt2", pre "default") and the tensors
token_embd, output_norm, output (absent with --tied), rope_freqs (with
--rope-freqs), and per layer attn_norm, attn_q/k/v (+ .bias for qwen2),
attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down. For gemma3 also
attn_q_norm and attn_k_norm ([head size]), post_attention_norm and
post_ffw_norm, and gemma3.attention.sliding_window (--window, default 8;
its RoPE base defaults to 1e6, the local layers' being 10000) and, with
--swa-pattern, gemma3.attention.sliding_window_pattern.
Other families, as llama.cpp's converter writes them:
  qwen3:  attn_q_norm / attn_k_norm, no biases;
  phi3:   attn_qkv ([Q; K; V] rows) and ffn_up ([gate; up], 2 * ff rows)
          instead of the separate matrices; with --rope-factors also
          rope_factors_short / rope_factors_long and the keys
          phi3.rope.scaling.attn_factor / original_context_length;
  gemma2: gemma3's tensors without the QK-norms; the window key only with
          --window > 0 (the family's default is 4096), the soft-cap keys
          (gemma2.attn_logit_softcapping, .final_logit_softcapping) only
          with --attn-softcap / --final-softcap;
  llama / mistral: with --window > 0, <arch>.attention.sliding_window;
  --rope-llama3 ORIG_CTX writes rope_freqs as the converter computes
  Llama 3.1's scaling (factor 8, low 1, high 4, original context ORIG_CTX).
Mixture-of-experts families (--experts E experts, --experts-used K routed
per token; defaults 4 and 2), as llama.cpp's converter writes them:
  mixtral:  general.architecture "llama" with llama.expert_count and
            llama.expert_used_count; per layer ffn_gate_inp ([E][embd],
            f32, as the converter and llama-quantize keep it) and the 3-D
            ffn_gate_exps / ffn_up_exps (GGUF [embd, ff, E]) and
            ffn_down_exps ([ff, embd, E]) instead of ffn_gate/up/down;
            the experts' size is llama.feed_forward_length (--ff);
  qwen3moe: qwen3's attention (QK-norm, no biases) and the same expert
            tensors, sized qwen3moe.expert_feed_forward_length
            (--expert-ff, default --ff); keys qwen3moe.expert_count,
            .expert_used_count;
  qwen2moe: qwen2's attention (Q/K/V biases), the expert tensors
            (qwen2moe.expert_feed_forward_length) and a shared expert:
            ffn_gate_inp_shexp ([embd], its sigmoid gate), ffn_gate_shexp,
            ffn_up_shexp ([shared-ff][embd]) and ffn_down_shexp, sized
            qwen2moe.expert_shared_feed_forward_length (--shared-ff,
            default --ff).
  gpt-oss:  llama.cpp's gpt-oss layout: attn_q/k/v with biases,
            attn_output.bias, attn_sinks ([heads], f32, normal * 2),
            the FFN norm named post_attention_norm, ffn_gate_inp with a
            bias, the expert tensors (gpt-oss.expert_feed_forward_length,
            --expert-ff) each with a bias (GGUF [rows, E], f32), keys
            gpt-oss.attention.sliding_window (--window, default 4; every
            other layer local, layer 0 first), rope.scaling.type "yarn"
            with rope.scaling.factor (--yarn, default 4) and
            rope.scaling.original_context_length (--ctx / 4). The expert
            gate and up matrices get gain --clamp-gain (default 6), so
            that gpt-oss's SwiGLU clamp (7) is reached by some values.
The router (ffn_gate_inp) gets gain 2, so that each token's top-k
experts are chosen by clear margins and not by near ties.

Weights: 2-D matrices are normal * gain / sqrt(fan_in), so every projection
keeps activations of order one; q/k get gain 2 so attention is not uniform
and the output matrix gets gain 4 so logits are spread by a few units (a
random model whose logits are nearly flat would make greedy decoding a
string of near ties). Norm weights are 1 + 0.1 * normal, biases 0.5 * normal,
rope_freqs factors uniform in [1, 8]. 2-D weights are stored in --type
(quantized with gguf.quants.quantize); norms, biases and rope_freqs in f32.

Memory stays bounded: all tensor infos are declared first (GGUFWriter's
add_tensor_info, no data), the header is written, and then each tensor is
generated in chunks of at most 16 Mi floats, quantized chunk by chunk and
written (write_tensor_data) before the next one is made. The peak is one
tensor's stored bytes plus one f32 chunk and quantize()'s temporaries:
about 0.36 GiB resident for the 1b preset in q4_0, and the f32 form of a
whole model never exists.

Timings (2-core VM, q4_0): --preset 1b 22 s (663 MiB file);
--preset 8b 149 s (4309 MiB file, 0.63 GiB peak resident).
"""

import argparse
import math
import sys
import time

import numpy as np
import gguf
from gguf.quants import quantize

TYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
    "q5_0": gguf.GGMLQuantizationType.Q5_0,
    "q5_1": gguf.GGMLQuantizationType.Q5_1,
    "mxfp4": gguf.GGMLQuantizationType.MXFP4,
}

# llama.cpp's llama_ftype numbers for general.file_type
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7,
              "q5_0": 8, "q5_1": 9, "mxfp4": 38}

PRESETS = {
    # Llama-3.2-1B-like
    "1b": dict(embd=2048, layers=16, ff=8192, heads=32, kv_heads=8,
               vocab=128256, ctx=8192, tied=True),
    # Llama-3-8B-like
    "8b": dict(embd=4096, layers=32, ff=14336, heads=32, kv_heads=8,
               vocab=128256, ctx=8192, tied=False),
}

ARCHS = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3",
         "mixtral", "qwen3moe", "qwen2moe", "gpt-oss")
MOE = ("mixtral", "qwen3moe", "qwen2moe", "gpt-oss")
# general.architecture of each --arch (mixtral is llama with experts)
GGUF_ARCH = {"mixtral": "llama"}
BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
CHUNK_ELEMS = 1 << 24   # generate/quantize at most this many floats at once


def byte_unicode_map():
    """GPT-2's byte -> printable character table (bytes_to_unicode)."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + \
        list(range(0xAE, 0x100))
    m, extra = {}, 0
    for b in range(256):
        if b in keep:
            m[b] = chr(b)
        else:
            m[b] = chr(256 + extra)
            extra += 1
    return m


def make_vocab(n_vocab):
    """(tokens, token_types, merges, bos_id, eos_id) of a byte-level BPE.

    Ids 0..255 are the bytes (id = byte value, shown by GPT-2's mapping),
    the last two ids are BOS and EOS (control tokens), and the ids between
    are merged tokens: breadth-first, every token made so far followed by
    one letter of "etaoinshrdlucmfwypvbgkjqxz" (a space, shown as U+0120,
    may only lead a token, as the "default" pre-tokenizer keeps a space in
    front of its word). Each merged token's merge "left right" is listed
    in the order the tokens are made, so both halves always exist first
    and a merge's rank is its token's creation order.
    """
    if n_vocab < 258:
        raise ValueError("vocab must hold 256 bytes + BOS + EOS (>= 258)")
    bmap = byte_unicode_map()
    tokens = [bmap[b] for b in range(256)]
    seen = set(tokens)
    merges = []
    letters = [bmap[ord(c)] for c in "etaoinshrdlucmfwypvbgkjqxz"]
    space = bmap[ord(" ")]
    n_merged = n_vocab - 258
    queue = [space] + letters
    qi = 0
    while len(merges) < n_merged:
        left = queue[qi]
        qi += 1
        for c in letters:
            if len(merges) == n_merged:
                break
            new = left + c
            if new in seen:
                continue
            seen.add(new)
            tokens.append(new)
            merges.append(left + " " + c)
            queue.append(new)
    tokens += [BOS, EOS]
    types = [gguf.TokenType.NORMAL] * (n_vocab - 2) + \
        [gguf.TokenType.CONTROL] * 2
    return tokens, [int(t) for t in types], merges, n_vocab - 2, n_vocab - 1


class Spec:
    """One tensor: name, numpy shape (rows, cols), storage type, init."""

    def __init__(self, name, shape, qtype, init, scale):
        self.name, self.shape, self.qtype = name, tuple(shape), qtype
        self.init, self.scale = init, scale

    def nbytes(self):
        rows = int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1
        bs, ts = gguf.GGML_QUANT_SIZES[self.qtype]
        return rows * (self.shape[-1] // bs) * ts

    def byte_shape(self):
        bs, ts = gguf.GGML_QUANT_SIZES[self.qtype]
        return self.shape[:-1] + (self.shape[-1] // bs * ts,)


def tensor_specs(a):
    """The model's tensors in file order."""
    E, F, V = a.embd, a.ff, a.vocab
    hd = E // a.heads
    Dq, Dkv = a.heads * hd, a.kv_heads * hd
    q = TYPES[a.type]
    f32 = gguf.GGMLQuantizationType.F32

    def mat(name, rows, cols, gain=1.0):
        return Spec(name, (rows, cols), q, "normal", gain / math.sqrt(cols))

    def vec(name, n, init="norm", scale=0.1):
        return Spec(name, (n,), f32, init, scale)

    # token embeddings: unit scale rows (rmsnorm follows); when tied they
    # are also the output matrix, whose logits are then ~sqrt(E) wide.
    specs = [Spec("token_embd.weight", (V, E), q, "normal",
                  4.0 / math.sqrt(E) if a.tied else 1.0)]
    specs.append(vec("output_norm.weight", E))
    if not a.tied:
        specs.append(mat("output.weight", V, E, 4.0))
    if a.rope_freqs:
        specs.append(vec("rope_freqs.weight", hd // 2, "freqs", 0))
    if a.rope_llama3:
        specs.append(vec("rope_freqs.weight", hd // 2, "llama3",
                         (a.rope_base, a.rope_llama3)))
    if a.rope_factors:
        specs.append(vec("rope_factors_long.weight", hd // 2, "long", 0))
        specs.append(vec("rope_factors_short.weight", hd // 2, "freqs", 0))
    gemma = a.arch in ("gemma2", "gemma3")
    for i in range(a.layers):
        p = "blk.%d." % i
        specs.append(vec(p + "attn_norm.weight", E))
        if a.arch == "phi3":
            # q and k rows get gain 2 like the separate matrices below
            specs.append(Spec(p + "attn_qkv.weight", (Dq + 2 * Dkv, E), q,
                              "qkv", (Dq + Dkv, 2.0 / math.sqrt(E),
                                      1.0 / math.sqrt(E))))
        else:
            specs.append(mat(p + "attn_q.weight", Dq, E, 2.0))
            specs.append(mat(p + "attn_k.weight", Dkv, E, 2.0))
            specs.append(mat(p + "attn_v.weight", Dkv, E))
        if a.arch in ("qwen2", "qwen2moe", "gpt-oss"):
            specs.append(vec(p + "attn_q.bias", Dq, "normal", 0.5))
            specs.append(vec(p + "attn_k.bias", Dkv, "normal", 0.5))
            specs.append(vec(p + "attn_v.bias", Dkv, "normal", 0.5))
        if a.arch in ("gemma3", "qwen3", "qwen3moe"):
            specs.append(vec(p + "attn_q_norm.weight", hd))
            specs.append(vec(p + "attn_k_norm.weight", hd))
        specs.append(mat(p + "attn_output.weight", E, Dq))
        if a.arch == "gpt-oss":
            specs.append(vec(p + "attn_output.bias", E, "normal", 0.5))
            specs.append(vec(p + "attn_sinks.weight", a.heads, "normal", 2.0))
        if gemma or a.arch == "gpt-oss":
            specs.append(vec(p + "post_attention_norm.weight", E))
        if a.arch != "gpt-oss":
            specs.append(vec(p + "ffn_norm.weight", E))
        if a.arch in MOE:
            specs += moe_specs(a, p, q)
        elif a.arch == "phi3":
            specs.append(mat(p + "ffn_up.weight", 2 * F, E))
        else:
            specs.append(mat(p + "ffn_gate.weight", F, E))
            specs.append(mat(p + "ffn_up.weight", F, E))
        if a.arch not in MOE:
            specs.append(mat(p + "ffn_down.weight", E, F))
        if gemma:
            specs.append(vec(p + "post_ffw_norm.weight", E))
    return specs


def moe_specs(a, p, q):
    """Layer p's expert tensors (and qwen2moe's shared expert), in the
    numpy shapes (E, rows, cols) of GGUF's [cols, rows, E]."""
    E, X = a.embd, a.experts
    F = a.expert_ff
    f32 = gguf.GGMLQuantizationType.F32
    oss = a.arch == "gpt-oss"
    g = a.clamp_gain if oss else 1.0
    specs = [Spec(p + "ffn_gate_inp.weight", (X, E), f32, "normal",
                  2.0 / math.sqrt(E))]
    if oss:
        specs.append(Spec(p + "ffn_gate_inp.bias", (X,), f32, "normal", 0.5))
    specs.append(Spec(p + "ffn_gate_exps.weight", (X, F, E), q, "normal",
                      g / math.sqrt(E)))
    specs.append(Spec(p + "ffn_down_exps.weight", (X, E, F), q, "normal",
                      1.0 / math.sqrt(F) / g))
    specs.append(Spec(p + "ffn_up_exps.weight", (X, F, E), q, "normal",
                      g / math.sqrt(E)))
    if oss:
        for n, rows in (("gate", F), ("down", E), ("up", F)):
            specs.append(Spec(p + "ffn_%s_exps.bias" % n, (X, rows), f32,
                              "normal", 0.5))
    if a.arch == "qwen2moe":
        S = a.shared_ff
        specs.append(Spec(p + "ffn_gate_inp_shexp.weight", (E,), f32,
                          "normal", 1.0 / math.sqrt(E)))
        specs.append(Spec(p + "ffn_gate_shexp.weight", (S, E), q, "normal",
                          1.0 / math.sqrt(E)))
        specs.append(Spec(p + "ffn_down_shexp.weight", (E, S), q, "normal",
                          1.0 / math.sqrt(S)))
        specs.append(Spec(p + "ffn_up_shexp.weight", (S, E), q, "normal",
                          1.0 / math.sqrt(E)))
    return specs


def llama3_factors(n, base, orig_ctx, factor=8.0, low=1.0, high=4.0):
    """Llama 3.1's per-dimension RoPE divisors, from Meta's definition."""
    out = []
    for i in range(n):
        freq = base ** (-2.0 * i / (2 * n))
        wavelen = 2 * math.pi / freq
        if wavelen < orig_ctx / high:
            out.append(1.0)
        elif wavelen > orig_ctx / low:
            out.append(factor)
        else:
            smooth = (orig_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def tensor_data(spec, rng):
    """Yields the stored bytes of spec in row chunks (bounded memory)."""
    if spec.init == "norm":
        x = 1.0 + spec.scale * rng.standard_normal(spec.shape,
                                                   dtype=np.float32)
        yield np.ascontiguousarray(x, dtype=np.float32)
        return
    if spec.init == "freqs":
        yield rng.uniform(1.0, 8.0, spec.shape).astype(np.float32)
        return
    if spec.init == "long":
        yield rng.uniform(8.0, 40.0, spec.shape).astype(np.float32)
        return
    if spec.init == "llama3":
        yield llama3_factors(spec.shape[0], *spec.scale)
        return
    if spec.init == "qkv":
        # rows below the split get the first scale, the rest the second
        split, s0, s1 = spec.scale
        rows, cols = spec.shape
        x = rng.standard_normal((rows, cols), dtype=np.float32)
        x[:split] *= np.float32(s0)
        x[split:] *= np.float32(s1)
        yield x if spec.qtype == gguf.GGMLQuantizationType.F32 else \
            quantize(x, spec.qtype)
        return
    if len(spec.shape) == 1:
        yield (spec.scale * rng.standard_normal(spec.shape,
                                                dtype=np.float32))
        return
    rows, cols = int(np.prod(spec.shape[:-1])), spec.shape[-1]
    step = max(1, CHUNK_ELEMS // cols)
    for r in range(0, rows, step):
        n = min(step, rows - r)
        x = rng.standard_normal((n, cols), dtype=np.float32)
        x *= np.float32(spec.scale)
        if spec.qtype == gguf.GGMLQuantizationType.F32:
            yield x
        else:
            yield quantize(x, spec.qtype)


def add_moe_metadata(w, a, arch):
    w.add_uint32(arch + ".expert_count", a.experts)
    w.add_uint32(arch + ".expert_used_count", a.experts_used)
    if a.arch != "mixtral":
        w.add_uint32(arch + ".expert_feed_forward_length", a.expert_ff)
    if a.arch == "qwen2moe":
        w.add_uint32(arch + ".expert_shared_feed_forward_length",
                     a.shared_ff)
    if a.arch == "gpt-oss":
        w.add_string(arch + ".rope.scaling.type", "yarn")
        w.add_float32(arch + ".rope.scaling.factor", a.yarn)
        w.add_uint32(arch + ".rope.scaling.original_context_length",
                     max(1, a.ctx // 4))


def add_metadata(w, a, tok):
    arch = GGUF_ARCH.get(a.arch, a.arch)
    hd = a.embd // a.heads
    w.add_name("loom synthetic %s %dL %dE %s" % (a.arch, a.layers, a.embd,
                                                 a.type))
    w.add_file_type(FILE_TYPES[a.type])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_uint32(arch + ".context_length", a.ctx)
    w.add_uint32(arch + ".embedding_length", a.embd)
    w.add_uint32(arch + ".block_count", a.layers)
    w.add_uint32(arch + ".feed_forward_length", a.ff)
    w.add_uint32(arch + ".attention.head_count", a.heads)
    w.add_uint32(arch + ".attention.head_count_kv", a.kv_heads)
    w.add_float32(arch + ".attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32(arch + ".rope.freq_base", a.rope_base)
    w.add_uint32(arch + ".rope.dimension_count", hd)
    w.add_uint32(arch + ".vocab_size", a.vocab)
    if a.arch in MOE:
        add_moe_metadata(w, a, arch)
    if arch in ("gemma3", "gpt-oss") or (arch != "phi3" and a.window > 0):
        w.add_uint32(arch + ".attention.sliding_window", a.window)
    if arch in ("gemma2", "gemma3") and a.swa_pattern:
        w.add_uint32(arch + ".attention.sliding_window_pattern",
                     a.swa_pattern)
    if a.attn_softcap is not None:
        w.add_float32(arch + ".attn_logit_softcapping", a.attn_softcap)
    if a.final_softcap is not None:
        w.add_float32(arch + ".final_logit_softcapping", a.final_softcap)
    if a.rope_factors:
        orig = max(1, a.ctx // 32)
        w.add_uint32(arch + ".rope.scaling.original_context_length", orig)
        w.add_float32(arch + ".rope.scaling.attn_factor",
                      math.sqrt(1 + math.log(a.ctx / orig) / math.log(orig)))
    if a.rope_scale:
        w.add_string(arch + ".rope.scaling.type", "linear")
        w.add_float32(arch + ".rope.scaling.factor", a.rope_scale)
    tokens, types, merges, bos, eos = tok
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "default")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_uint32("tokenizer.ggml.bos_token_id", bos)
    w.add_uint32("tokenizer.ggml.eos_token_id", eos)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_bool("tokenizer.ggml.add_eos_token", False)


def check_args(ap, a):
    if a.arch not in ARCHS:
        ap.error("--arch must be one of " + ", ".join(ARCHS))
    if a.rope_factors and a.arch != "phi3":
        ap.error("--rope-factors is for phi3")
    if a.rope_llama3 is not None and (a.rope_freqs or a.rope_llama3 <= 0):
        ap.error("--rope-llama3 needs a positive context and no --rope-freqs")
    if a.window < 0 or (a.swa_pattern is not None and a.swa_pattern <= 0):
        ap.error("--window must be >= 0 and --swa-pattern positive")
    for k in ("layers", "embd", "ff", "heads", "kv_heads", "vocab", "ctx"):
        if getattr(a, k) <= 0:
            ap.error("--%s must be positive" % k.replace("_", "-"))
    if a.embd % a.heads or a.heads % a.kv_heads:
        ap.error("need embd % heads == 0 and heads % kv-heads == 0")
    if (a.embd // a.heads) % 2:
        ap.error("head size must be even (RoPE)")
    bs = gguf.GGML_QUANT_SIZES[TYPES[a.type]][0]
    if a.embd % bs or a.ff % bs:
        ap.error("embd and ff must be multiples of %d for %s" % (bs, a.type))
    if a.vocab < 258:
        ap.error("--vocab must be at least 258")
    if a.arch in MOE:
        if not 1 <= a.experts_used <= a.experts:
            ap.error("need 1 <= --experts-used <= --experts")
        if a.expert_ff <= 0 or a.shared_ff <= 0:
            ap.error("--expert-ff and --shared-ff must be positive")
        if a.expert_ff % bs or a.shared_ff % bs:
            ap.error("--expert-ff and --shared-ff must be multiples of %d "
                     "for %s" % (bs, a.type))
        if a.arch == "mixtral" and a.expert_ff != a.ff:
            ap.error("mixtral's experts are --ff wide (no --expert-ff)")
    if a.rope_scale is not None and a.rope_scale <= 0:
        ap.error("--rope-scale must be positive")


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--preset", choices=sorted(PRESETS))
    ap.add_argument("--arch", default="llama")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--ff", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--type", choices=sorted(TYPES), default="q4_0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tied", action="store_true",
                    help="no output.weight: the output reuses token_embd")
    ap.add_argument("--rope-scale", type=float, default=None,
                    help="linear RoPE scaling factor (positions / factor)")
    ap.add_argument("--rope-freqs", action="store_true",
                    help="write rope_freqs.weight (frequency divisors)")
    ap.add_argument("--rope-base", type=float, default=None,
                    help="default 10000 (gemma3: 1e6)")
    ap.add_argument("--window", type=int, default=None,
                    help="sliding window (gemma3: default 8; others: none)")
    ap.add_argument("--attn-softcap", type=float, default=None)
    ap.add_argument("--final-softcap", type=float, default=None)
    ap.add_argument("--rope-factors", action="store_true",
                    help="phi3: rope_factors_short/long + LongRoPE keys")
    ap.add_argument("--rope-llama3", type=int, default=None,
                    metavar="ORIG_CTX",
                    help="rope_freqs.weight from Llama 3.1's scaling rule")
    ap.add_argument("--swa-pattern", type=int, default=None,
                    help="gemma3: every P-th layer is global (metadata)")
    ap.add_argument("--experts", type=int, default=4,
                    help="mixtral/qwen3moe/qwen2moe: experts per layer")
    ap.add_argument("--experts-used", type=int, default=2,
                    help="experts routed per token")
    ap.add_argument("--expert-ff", type=int, default=None,
                    help="qwen3moe/qwen2moe: expert FFN size (default --ff)")
    ap.add_argument("--shared-ff", type=int, default=None,
                    help="qwen2moe: shared expert FFN size (default --ff)")
    ap.add_argument("--yarn", type=float, default=4.0,
                    help="gpt-oss: YaRN factor (rope.scaling.factor)")
    ap.add_argument("--clamp-gain", type=float, default=6.0,
                    help="gpt-oss: gain of the expert gate/up matrices")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.preset:
        for k, v in PRESETS[a.preset].items():
            setattr(a, k, v)
        a.rope_base = 500000.0
    if a.rope_base is None:
        a.rope_base = 1e6 if a.arch == "gemma3" else 10000.0
    if a.window is None:
        a.window = {"gemma3": 8, "gpt-oss": 4}.get(a.arch, 0)
    if a.expert_ff is None:
        a.expert_ff = a.ff
    if a.shared_ff is None:
        a.shared_ff = a.ff
    check_args(ap, a)
    return a


def main(argv=None):
    a = parse(argv)
    t0 = time.time()
    rng = np.random.default_rng(a.seed)
    tok = make_vocab(a.vocab)
    specs = tensor_specs(a)
    w = gguf.GGUFWriter(a.out, GGUF_ARCH.get(a.arch, a.arch))
    add_metadata(w, a, tok)
    for s in specs:
        w.add_tensor_info(s.name, s.byte_shape(), np.dtype(np.uint8),
                          s.nbytes(), raw_dtype=s.qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = sum(s.nbytes() for s in specs)
    done = 0
    for s in specs:
        parts = [np.ascontiguousarray(p).view(np.uint8).reshape(-1)
                 for p in tensor_data(s, rng)]
        # one tensor's stored bytes (quantized) are small next to its f32
        data = parts[0] if len(parts) == 1 else np.concatenate(parts)
        del parts
        w.write_tensor_data(data)
        done += s.nbytes()
        if not a.quiet and sys.stderr.isatty():
            sys.stderr.write("\r%5.1f%% %s" % (100.0 * done / total,
                                               s.name.ljust(32)))
    w.close()
    if not a.quiet:
        n_params = sum(int(np.prod(s.shape)) for s in specs)
        sys.stderr.write("\rwrote %s: %s, %d tensors, %.3g params, "
                         "%.1f MiB in %.1fs\n" %
                         (a.out, a.type, len(specs), n_params,
                          total / 2**20, time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
