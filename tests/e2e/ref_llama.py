#!/usr/bin/env python3
"""Independent NumPy reference of the llama forward pass, read from a GGUF.

This is the oracle the end-to-end test holds loom to, so it shares no code
with loom: the file is read here with struct and a NumPy memmap (the GGUF
layout, read_gguf below), weights are dequantized by the `gguf` package
(gguf.quants.dequantize) and every step is plain NumPy.

Precision: weights are dequantized by the gguf package (to float32) and then
widened; by default all arithmetic runs in float64, so the reference is
accurate to far below loom's float32 rounding and any difference seen by the
test is loom's. `--dtype float32` runs the same code in float32.

Model (llama family, as llama.cpp defines it for GGUF):
  x = token_embd[ids]
  per layer:
    h = rmsnorm(x) * attn_norm
    q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)
    rope(q), rope(k)     llama: adjacent pairs (x[2i], x[2i+1]), because the
                         GGUF converter permutes Q/K rows per head;
                         qwen2: halves (x[i], x[i + n_rot/2]), no permutation.
                         theta_i = (pos / linear_factor) * base^(-2i/n_rot)
                                   / rope_freqs[i]
    causal softmax(q k^T / sqrt(head_dim)) v, GQA: head h uses kv head
    h // (n_head / n_head_kv)
    x += attn_output(o)
    h = rmsnorm(x) * ffn_norm
    x += ffn_down(silu(ffn_gate h) * ffn_up h)
  logits = rmsnorm(x) * output_norm @ W_out^T   (W_out = token_embd if no
                                                 output.weight: tied)
A GGUF tensor of shape [ne0, ne1] is a NumPy array (ne1, ne0): ne1 rows of
ne0, so y = x @ W.T for a weight of gguf shape [n_in, n_out].

Gemma 3 (arch "gemma3"), as llama.cpp runs it (its converter stores Gemma's
(1 + w) norm weights as 1 + w already, so every norm is rmsnorm(x) * w):
  x = token_embd[ids] * sqrt(n_embd)
  per layer:
    h = rmsnorm(x) * attn_norm
    q, k, v = h Wq^T, h Wk^T, h Wv^T
    q = rmsnorm(q per head) * attn_q_norm, k likewise with attn_k_norm
    rope(q), rope(k) on halves; local layers base 10000 (or
        gemma3.rope.freq_base_swa) and no scaling, global layers the file's
    softmax(q k^T * scale) v, scale = gemma3.attention.scale or
        1/sqrt(head_dim); a local layer's query at p sees keys in
        (p - window, p], window = gemma3.attention.sliding_window
    layer i is global when (i + 1) % pattern == 0 (pattern from
        gemma3.attention.sliding_window_pattern, else 6)
    x += rmsnorm(attn_output(o)) * post_attention_norm
    h = rmsnorm(x) * ffn_norm
    x += rmsnorm(ffn_down(gelu_tanh(ffn_gate h) * ffn_up h)) * post_ffw_norm
  logits = rmsnorm(x) * output_norm @ W_out^T

Qwen 3 (arch "qwen3"): the llama pass with rope on halves, no biases, and
Gemma 3's QK-norm (q = rmsnorm(q per head) * attn_q_norm, k likewise,
before rope).

Gemma 2 (arch "gemma2"): Gemma 3 without QK-norm, plus soft-capping
(Gemma 2 paper; HF Gemma2 modelling):
    scores = c_a * tanh((q k^T * scale) / c_a), before the causal mask,
        c_a = gemma2.attn_logit_softcapping (default 50)
    logits = c_f * tanh(logits / c_f), c_f = gemma2.final_logit_softcapping
        (default 30)
  every other layer is local, layer 0 first (layer i global when
  (i + 1) % 2 == 0), window gemma2.attention.sliding_window (default
  4096); local layers keep the global RoPE base (Gemma 2 has one). The
  scale is head_dim^-0.5 (query_pre_attn_scalar = head_dim for 2B and 9B;
  27B, 46 layers, uses n_embd / n_head; GGUF records neither).

Mistral (arch "llama" or "mistral" with <arch>.attention.sliding_window):
every layer attends to the window only; RoPE unchanged.

Phi-3 (arch "phi3", HF Phi3ForCausalLM): llama with rope on halves and
fused weights: attn_qkv holds [Wq; Wk; Wv] by rows, ffn_up [Wgate; Wup]
(gate first: HF's gate_up_proj output chunked in two, act on the first).
LongRoPE: theta_i = pos * base^(-2i/n_rot) / factor[i], with the long
factors when the context the engine runs with (loom's default: 4096, or
the trained context if smaller) is above
phi3.rope.scaling.original_context_length and the short ones otherwise
(llama.cpp's rule: it goes by the configured context, not the position),
and cos/sin multiplied by phi3.rope.scaling.attn_factor.

Llama 3.1: rope_freqs.weight divisors, as for any llama file.

Mixture of experts (llama.cpp's build_moe_ffn with softmax gating): the
FFN of each layer is replaced by
    p = softmax(h Wrouter^T)                 (ffn_gate_inp, [n_expert])
    E = the n_used experts of largest p (ties: lower id first)
    w_e = p_e, and with normalisation w_e /= max(sum_E w, 2^-14)
    x += sum_{e in E} w_e * down_e(silu(gate_e h) * up_e h)
with ffn_{gate,up,down}_exps holding one matrix per expert (GGUF
[cols, rows, n_expert]). Families:
  Mixtral (arch "llama" with llama.expert_count > 0): llama's attention,
      experts feed_forward_length wide, normalised (llama.cpp: norm_w);
  qwen3moe: qwen3's attention (QK-norm, halves), experts
      qwen3moe.expert_feed_forward_length wide, normalised;
  qwen2moe: qwen2's attention (biases, halves), not normalised, plus a
      shared expert added to every row:
      x += sigmoid(h . ffn_gate_inp_shexp) * down_s(silu(gate_s h) * up_s h)
  <arch>.expert_weights_norm, when present, overrides the normalisation.

gpt-oss (arch "gpt-oss", llama.cpp's openai-moe graph; OpenAI's reference
for the formulas): the MoE pass with rope on halves and
  q, k, v, attn_output with biases; the FFN norm is post_attention_norm
  attention sinks: per head h a learned logit s_h (attn_sinks) joins the
      softmax's denominator: p_t = exp(sc_t - m) / (sum_t exp(sc_t - m) +
      exp(s_h - m)), m = max(max_t sc_t, s_h); it carries no value
  layer i local (window gpt-oss.attention.sliding_window) when i is even,
      every layer with the global RoPE
  YaRN (rope.scaling.type "yarn", factor f, original context C, beta_fast
      32, beta_slow 1), as ggml's rope_yarn: theta_extrap = pos *
      base^(-2i/n_rot), theta_interp = theta_extrap / f, ramp r_i = 1 -
      clamp((i - lo) / max(0.001, hi - lo), 0, 1) with lo = max(0,
      floor(d(32))), hi = min(n_rot - 1, ceil(d(1))), d(b) = n_rot *
      ln(C / (2 pi b)) / (2 ln base); theta = theta_interp (1 - r) +
      theta_extrap r, and cos, sin times 1 + 0.1 ln f
  router: l = h Wrouter^T + b_router; E = the n_used largest l (ties:
      lower id); w = softmax(l[E])
  experts: g = h Wg_e^T + bg_e, u = h Wu_e^T + bu_e, g = min(g, 7),
      u = clamp(u, -7, 7), a = g * sigmoid(1.702 g) * (u + 1),
      d = a Wd_e^T + bd_e;  x += sum_E w_e d_e

CLI:
  ref_llama.py MODEL --tokens "1 2 3" -n 32 --logits-out F.npy \
      --tokens-out F.txt
writes the float32 logits of the last prompt position and the greedy
continuation (argmax, ties -> lowest id), space-separated.
"""

import argparse
import math
import os
import struct
import sys
import time

# Matrix-vector products dominate and are memory-bound; one BLAS thread is as
# fast and does not collapse when the machine is busy (OpenBLAS threads spin).
# Only effective if numpy is not imported yet.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402
import gguf  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

# Rope variants by architecture (llama.cpp's rope type per arch).
ROPE_NORM = "norm"
ROPE_NEOX = "neox"
ARCH_ROPE = {"llama": ROPE_NORM, "mistral": ROPE_NORM, "qwen2": ROPE_NEOX,
             "qwen3": ROPE_NEOX, "phi3": ROPE_NEOX, "gemma2": ROPE_NEOX,
             "gemma3": ROPE_NEOX, "qwen3moe": ROPE_NEOX,
             "qwen2moe": ROPE_NEOX, "gpt-oss": ROPE_NEOX}
GEMMA = ("gemma2", "gemma3")
QK_NORM = ("gemma3", "qwen3", "qwen3moe")
MOE_ARCHS = ("qwen3moe", "qwen2moe", "gpt-oss")  # and llama with experts
OSS = "gpt-oss"


# GGUF metadata value types: struct formats of the scalars; 8 is a string,
# 9 an array (element type, count, elements)
GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f",
                7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
GGUF_STRING, GGUF_ARRAY = 8, 9


class GGUFTensor:
    """A tensor of the file: shape in GGUF order [ne0, ne1, ...], its
    GGMLQuantizationType, and its bytes (a memmap slice)."""

    def __init__(self, name, shape, tensor_type, data):
        self.name, self.shape, self.tensor_type, self.data = name, shape, tensor_type, data


class _Cursor:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v if len(v) > 1 else v[0]

    def string(self):
        n = self.take("<Q")
        v = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return v

    def value(self, vt):
        if vt == GGUF_STRING:
            return self.string()
        if vt != GGUF_ARRAY:
            return self.take(GGUF_SCALARS[vt])
        et, n = self.take("<IQ")
        if et in GGUF_SCALARS:   # numbers: one NumPy read
            dt = np.dtype(GGUF_SCALARS[et])
            v = np.frombuffer(self.buf, dt, n, self.pos).tolist()
            self.pos += n * dt.itemsize
            return v
        return [self.value(et) for _ in range(n)]


def read_gguf(path):
    """(metadata {key: value}, tensors {name: GGUFTensor}) of a GGUF v2/v3
    file. gguf.GGUFReader gives the same, but builds NumPy views of every
    part of every vocabulary string: 18 s for Gemma 3's 262k tokens."""
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    c = _Cursor(mm)
    magic, version = c.take("<4sI")
    if magic != b"GGUF" or version not in (2, 3):
        raise ValueError("%s: not a GGUF v2/v3 file" % path)
    n_tensors, n_kv = c.take("<QQ")
    fields = {}
    for _ in range(n_kv):
        key = c.string()
        fields[key] = c.value(c.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        nd = c.take("<I")
        ne = list(struct.unpack_from("<%dQ" % nd, mm, c.pos))
        c.pos += 8 * nd
        ty, off = c.take("<IQ")
        infos.append((name, ne, gguf.GGMLQuantizationType(ty), off))
    align = int(fields.get("general.alignment", 32))
    start = (c.pos + align - 1) // align * align
    tensors = {}
    for name, ne, ty, off in infos:
        block, block_bytes = gguf.GGML_QUANT_SIZES[ty]
        n = int(np.prod(ne, dtype=np.int64)) // block * block_bytes
        if start + off + n > len(mm):
            raise ValueError("%s: tensor %s runs past the end of the file" % (path, name))
        tensors[name] = GGUFTensor(name, ne, ty, mm[start + off:start + off + n])
    return fields, tensors


class Model:
    def __init__(self, path, dtype=np.float64):
        self.dtype = np.dtype(dtype)
        self.fields, self.tensors = read_gguf(path)
        self.arch = self.meta("general.architecture")
        if self.arch not in ARCH_ROPE:
            raise ValueError("unsupported architecture %r" % self.arch)
        self.rope_mode = ARCH_ROPE[self.arch]
        self._read_hparams()
        self._load_weights()

    def meta(self, key, default=None):
        if key not in self.fields:
            if default is None:
                raise KeyError("missing GGUF key %s" % key)
            return default
        return self.fields[key]

    def _read_hparams(self):
        a = self.arch
        self.n_embd = int(self.meta(a + ".embedding_length"))
        self.n_layer = int(self.meta(a + ".block_count"))
        self.n_head = int(self.meta(a + ".attention.head_count"))
        self.n_head_kv = int(self.meta(a + ".attention.head_count_kv",
                                       self.n_head))
        self.head_dim = int(self.meta(a + ".attention.key_length",
                                      self.n_embd // self.n_head))
        self.eps = float(self.meta(a + ".attention.layer_norm_rms_epsilon"))
        self.rope_base = float(self.meta(a + ".rope.freq_base", 10000.0))
        self.n_rot = int(self.meta(a + ".rope.dimension_count",
                                   self.head_dim))
        stype = self.meta(a + ".rope.scaling.type", "none")
        factor = float(self.meta(a + ".rope.scaling.factor", 0.0))
        if stype not in ("none", "linear", "yarn"):
            raise ValueError("rope scaling %r not supported" % stype)
        self.rope_factor = factor if stype == "linear" and factor > 0 else 1.0
        self.yarn = factor if stype == "yarn" else 0.0   # 0: no YaRN
        self.yarn_orig = int(self.meta(
            a + ".rope.scaling.original_context_length",
            self.meta(a + ".context_length", 4096)))
        qk_dim = self.head_dim
        if a == "gemma2" and self.n_layer == 46:     # Gemma 2 27B
            qk_dim = self.n_embd // self.n_head
        self.scale = float(self.meta(a + ".attention.scale",
                                     1.0 / math.sqrt(qk_dim)))
        gemma = a in GEMMA
        # family switches, each a plain attribute so a test can turn one off
        self.embd_scale = math.sqrt(self.n_embd) if gemma else 1.0
        self.act = "gelu_tanh" if gemma else "silu"
        window_default = {"gemma2": 4096, "gemma3": 0, "llama": 0,
                          "mistral": 0, OSS: None}
        self.window = int(self.meta(a + ".attention.sliding_window",
                                    window_default.get(a))) \
            if a in window_default else 0
        if self.window == 0:
            self.window = window_default.get(a) or 0
        # None: every layer local (Mistral); else layer i global when
        # (i + 1) % pattern == 0
        self.pattern = int(self.meta(a + ".attention.sliding_window_pattern",
                                     2 if a in ("gemma2", OSS) else 6)) \
            if gemma or a == OSS else None
        self.oss = a == OSS
        self.sinks = self.oss          # switches a test may turn off
        self.oss_clamp = self.oss
        self.local_base = float(self.meta(
            a + ".rope.freq_base_swa",
            10000.0 if a == "gemma3" else self.rope_base))
        caps = (50.0, 30.0) if a == "gemma2" else (0.0, 0.0)
        self.attn_softcap = float(self.meta(a + ".attn_logit_softcapping",
                                            caps[0]))
        self.final_softcap = float(self.meta(a + ".final_logit_softcapping",
                                             caps[1]))
        self.rope_attn_factor = float(self.meta(
            a + ".rope.scaling.attn_factor", 1.0))
        self._read_moe()
        if self.n_head % self.n_head_kv or self.n_rot % 2 or \
           self.n_rot > self.head_dim:
            raise ValueError("inconsistent attention hyperparameters")

    def _read_moe(self):
        """Expert counts and routing switches (plain attributes, so a test
        can change the top-k or the normalisation)."""
        a = self.arch
        self.n_expert = int(self.meta(a + ".expert_count", 0))
        self.moe = self.n_expert > 0 and (a in MOE_ARCHS or a == "llama")
        if a in MOE_ARCHS and not self.moe:
            raise KeyError("missing GGUF key %s.expert_count" % a)
        if not self.moe:
            return
        self.n_expert_used = int(self.meta(a + ".expert_used_count"))
        self.expert_norm = bool(self.meta(a + ".expert_weights_norm",
                                          a != "qwen2moe"))
        self.topk_softmax = a == OSS     # softmax over the chosen logits
        self.shared_expert = a == "qwen2moe"
        self.shared_gate = True       # sigmoid gate on the shared expert
        if not 1 <= self.n_expert_used <= self.n_expert:
            raise ValueError("bad expert_used_count")

    def weight(self, name, required=True):
        t = self.tensors.get(name)
        if t is None:
            if required:
                raise KeyError("missing tensor %s" % name)
            return None
        w = dequantize(t.data, t.tensor_type)
        # gguf shape [ne0, ne1, ...] -> numpy (..., ne1, ne0)
        shape = tuple(int(n) for n in reversed(list(t.shape)))
        return np.ascontiguousarray(w.reshape(shape), dtype=self.dtype)

    def _load_weights(self):
        w = self.weight
        self.tok_embd = w("token_embd.weight")
        self.out_norm = w("output_norm.weight")
        out = w("output.weight", False)
        self.output = self.tok_embd if out is None else out
        phi3 = self.arch == "phi3"
        self.rope_freqs = w("rope_freqs.weight", False)
        if phi3:
            ctx = min(4096, int(self.meta(self.arch + ".context_length", 4096)))
            orig = int(self.meta(self.arch +
                                 ".rope.scaling.original_context_length", 0))
            self.rope_freqs = w("rope_factors_long.weight" if 0 < orig < ctx
                                else "rope_factors_short.weight", False)
        dq = self.n_head * self.head_dim
        dkv = self.n_head_kv * self.head_dim
        self.layers = []
        for i in range(self.n_layer):
            p = "blk.%d." % i
            L = {}
            names = ["attn_norm", "attn_output", "ffn_norm", "ffn_down"]
            if phi3:
                qkv = w(p + "attn_qkv.weight")
                if qkv.shape[0] != dq + 2 * dkv:
                    raise ValueError("attn_qkv has %d rows" % qkv.shape[0])
                L["attn_q"], L["attn_k"], L["attn_v"] = \
                    qkv[:dq], qkv[dq:dq + dkv], qkv[dq + dkv:]
                up = w(p + "ffn_up.weight")
                half = up.shape[0] // 2
                L["ffn_gate"], L["ffn_up"] = up[:half], up[half:]
            elif self.moe:
                names = ["attn_norm", "attn_output", "attn_q",
                         "attn_k", "attn_v", "ffn_gate_inp", "ffn_gate_exps",
                         "ffn_up_exps", "ffn_down_exps"]
                names.append("post_attention_norm" if self.oss else
                             "ffn_norm")
                if self.shared_expert:
                    names += ["ffn_gate_inp_shexp", "ffn_gate_shexp",
                              "ffn_up_shexp", "ffn_down_shexp"]
            else:
                names += ["attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"]
            for n in names:
                L[n] = w(p + n + ".weight")
            if self.moe and L["ffn_gate_exps"].shape[0] != self.n_expert:
                raise ValueError("expert tensors hold %d experts" %
                                 L["ffn_gate_exps"].shape[0])
            for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
                L[n + ".bias"] = w(p + n + ".bias", False)
            for n in ("attn_q_norm", "attn_k_norm"):
                L[n] = w(p + n + ".weight", self.arch in QK_NORM)
            if self.oss:      # gpt-oss: the FFN norm, sinks, MoE biases
                L["ffn_norm"] = L.pop("post_attention_norm")
                L["attn_sinks"] = w(p + "attn_sinks.weight")
                for n in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps",
                          "ffn_down_exps"):
                    L[n + ".bias"] = w(p + n + ".bias")
            for n in ("post_attention_norm", "post_ffw_norm"):
                L[n] = w(p + n + ".weight", self.arch in GEMMA) \
                    if self.arch in GEMMA else None
            self.layers.append(L)
        self.n_vocab = self.output.shape[0]

    # ---- forward pass ----

    def rmsnorm(self, x, w):
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(ms + self.eps) * w

    def is_local(self, il):
        """Whether layer il attends to a sliding window only."""
        if self.window <= 0:
            return False
        return self.pattern is None or (il + 1) % self.pattern != 0

    def rope(self, x, pos, local=False):
        """x: (T, heads, head_dim); rotates the first n_rot dims."""
        n_rot = self.n_rot
        i = np.arange(0, n_rot, 2, dtype=np.float64)
        # a periodic family's local layers have their own base and no
        # scaling; Mistral's all-local layers keep the global RoPE
        own = local and self.pattern is not None and not self.oss
        base = self.local_base if local and self.pattern is not None \
            else self.rope_base
        freq = base ** (-i / n_rot)
        if self.rope_freqs is not None:
            freq = freq / self.rope_freqs.astype(np.float64)
        factor = 1.0 if own else self.rope_factor
        p = np.asarray(pos, dtype=np.float64) / factor
        theta = p[:, None] * freq[None, :]           # (T, n_rot/2)
        mscale = self.rope_attn_factor
        if self.yarn > 0:
            theta, mscale = self.yarn_theta(theta, base)
        c = (mscale * np.cos(theta))[:, None, :].astype(self.dtype)
        s = (mscale * np.sin(theta))[:, None, :].astype(self.dtype)
        y = x.copy()
        if self.rope_mode == ROPE_NORM:
            a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
            y[..., 0:n_rot:2] = a * c - b * s
            y[..., 1:n_rot:2] = a * s + b * c
        else:
            h = n_rot // 2
            a, b = x[..., :h], x[..., h:n_rot]
            y[..., :h] = a * c - b * s
            y[..., h:n_rot] = a * s + b * c
        return y

    def yarn_theta(self, theta_extrap, base):
        """YaRN (ggml's rope_yarn, ext_factor 1): the angles and the
        cos/sin magnitude."""
        n_rot, f = self.n_rot, self.yarn

        def corr(b):
            return n_rot * math.log(self.yarn_orig / (b * 2 * math.pi)) / \
                (2 * math.log(base))
        lo = max(0.0, math.floor(corr(32.0)))
        hi = min(n_rot - 1.0, math.ceil(corr(1.0)))
        i = np.arange(n_rot // 2, dtype=np.float64)
        y = (i - lo) / max(0.001, hi - lo)
        r = 1.0 - np.clip(y, 0.0, 1.0)
        theta = theta_extrap / f * (1.0 - r) + theta_extrap * r
        return theta, self.rope_attn_factor * (1.0 + 0.1 * math.log(f))

    @staticmethod
    def linear(x, w, b=None):
        y = x @ w.T
        return y if b is None else y + b

    def attention(self, L, h, pos, cache, il=0):
        T = h.shape[0]
        hd, nh, nkv = self.head_dim, self.n_head, self.n_head_kv
        g = nh // nkv
        local = self.is_local(il)
        q = self.linear(h, L["attn_q"], L["attn_q.bias"]).reshape(T, nh, hd)
        k = self.linear(h, L["attn_k"], L["attn_k.bias"]).reshape(T, nkv, hd)
        v = self.linear(h, L["attn_v"], L["attn_v.bias"]).reshape(T, nkv, hd)
        if L["attn_q_norm"] is not None:           # QK-norm, per head
            q = self.rmsnorm(q, L["attn_q_norm"])
            k = self.rmsnorm(k, L["attn_k_norm"])
        q = self.rope(q, pos, local)
        k = self.rope(k, pos, local)
        cache["k"] = k if cache["k"] is None else \
            np.concatenate([cache["k"], k])
        cache["v"] = v if cache["v"] is None else \
            np.concatenate([cache["v"], v])
        K, V = cache["k"], cache["v"]                # (S, nkv, hd)
        S = K.shape[0]
        # query head h = kv * g + j uses kv head kv = h // g
        qg = q.reshape(T, nkv, g, hd)
        sc = np.einsum("tkjd,skd->kjts", qg, K) * self.scale
        if self.attn_softcap > 0:
            sc = self.attn_softcap * np.tanh(sc / self.attn_softcap)
        key_pos = np.arange(S)
        qpos = np.asarray(pos)[:, None]
        mask = key_pos[None, :] > qpos                       # (T, S)
        if local:
            mask |= key_pos[None, :] <= qpos - self.window
        sc = np.where(mask[None, None], -np.inf, sc)
        if self.sinks:      # one more logit per head, without a value
            sink = L["attn_sinks"].reshape(nkv, g, 1, 1)
            m = np.maximum(sc.max(axis=-1, keepdims=True), sink)
            p = np.exp(sc - m)
            p = p / (p.sum(axis=-1, keepdims=True) + np.exp(sink - m))
        else:
            sc = sc - sc.max(axis=-1, keepdims=True)
            p = np.exp(sc)
            p = p / p.sum(axis=-1, keepdims=True)
        o = np.einsum("kjts,skd->tkjd", p, V).reshape(T, nh * hd)
        o = self.linear(o, L["attn_output"], L["attn_output.bias"])
        if L["post_attention_norm"] is not None:
            o = self.rmsnorm(o, L["post_attention_norm"])
        return o

    @staticmethod
    def swiglu(h, gate_w, up_w, down_w):
        gate = h @ gate_w.T
        return (gate / (1.0 + np.exp(-gate)) * (h @ up_w.T)) @ down_w.T

    def route(self, logits):
        """(ids, weights) of one row's experts: softmax over all, the
        n_expert_used largest (stable: ties go to the lower id), then
        normalised when expert_norm; gpt-oss: the largest logits, then a
        softmax over them."""
        if self.topk_softmax:
            ids = np.argsort(-logits, kind="stable")[:self.n_expert_used]
            z = np.exp(logits[ids] - logits[ids].max())
            return ids, z / z.sum()
        z = logits - logits.max()
        p = np.exp(z) / np.exp(z).sum()
        ids = np.argsort(-p, kind="stable")[:self.n_expert_used]
        w = p[ids]
        if self.expert_norm:
            w = w / max(w.sum(), 6.103515625e-5)
        return ids, w

    def oss_expert(self, L, h, e):
        """gpt-oss's expert e: biases and the clamped SwiGLU."""
        g = h @ L["ffn_gate_exps"][e].T + L["ffn_gate_exps.bias"][e]
        u = h @ L["ffn_up_exps"][e].T + L["ffn_up_exps.bias"][e]
        if self.oss_clamp:
            g = np.minimum(g, 7.0)
            u = np.clip(u, -7.0, 7.0)
        act = g / (1.0 + np.exp(-1.702 * g)) * (u + 1.0)
        return act @ L["ffn_down_exps"][e].T + L["ffn_down_exps.bias"][e]

    def moe_ffn(self, L, h):
        logits = h @ L["ffn_gate_inp"].T                  # (T, n_expert)
        if L.get("ffn_gate_inp.bias") is not None:
            logits = logits + L["ffn_gate_inp.bias"]
        y = np.zeros_like(h)
        for t in range(h.shape[0]):
            ids, w = self.route(logits[t])
            for e, we in zip(ids, w):
                if self.oss:
                    y[t] += we * self.oss_expert(L, h[t], e)
                    continue
                y[t] += we * self.swiglu(h[t], L["ffn_gate_exps"][e],
                                         L["ffn_up_exps"][e],
                                         L["ffn_down_exps"][e])
        if self.shared_expert:
            s = self.swiglu(h, L["ffn_gate_shexp"], L["ffn_up_shexp"],
                            L["ffn_down_shexp"])
            if self.shared_gate:
                g = h @ L["ffn_gate_inp_shexp"]
                s = s * (1.0 / (1.0 + np.exp(-g)))[:, None]
            y = y + s
        return y

    def ffn(self, L, h):
        if self.moe:
            return self.moe_ffn(L, h)
        gate = self.linear(h, L["ffn_gate"])
        up = self.linear(h, L["ffn_up"])
        if self.act == "gelu_tanh":
            c = math.sqrt(2.0 / math.pi)
            act = 0.5 * gate * (1.0 + np.tanh(c * (gate + 0.044715 *
                                                   gate ** 3))) * up
        else:
            act = gate / (1.0 + np.exp(-gate)) * up  # silu(gate) * up
        y = self.linear(act, L["ffn_down"])
        if L["post_ffw_norm"] is not None:
            y = self.rmsnorm(y, L["post_ffw_norm"])
        return y

    def new_cache(self):
        return [{"k": None, "v": None} for _ in range(self.n_layer)]

    def forward(self, ids, start, cache):
        """Logits (T, n_vocab) for tokens ids at positions start.."""
        logits = self.hidden(ids, start, cache) @ self.output.T
        if self.final_softcap > 0:
            logits = self.final_softcap * np.tanh(logits / self.final_softcap)
        return logits

    def hidden(self, ids, start, cache):
        """The final normed hidden states (T, n_embd) for tokens ids at
        positions start..: what the output layer reads (embeddings)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.min() < 0 or ids.max() >= self.tok_embd.shape[0]:
            raise ValueError("token id out of range")
        pos = np.arange(start, start + len(ids))
        x = self.tok_embd[ids] * self.embd_scale
        for il, (L, c) in enumerate(zip(self.layers, cache)):
            x = x + self.attention(L, self.rmsnorm(x, L["attn_norm"]),
                                   pos, c, il)
            x = x + self.ffn(L, self.rmsnorm(x, L["ffn_norm"]))
        return self.rmsnorm(x, self.out_norm)

    def generate(self, prompt, n, forced=None):
        """Greedy decode n tokens after prompt.

        Returns (last prompt logits, generated ids, per-step logits).
        With forced (a list of ids) the model is fed those ids instead of its
        own choices (teacher forcing), to score another engine's path.
        """
        cache = self.new_cache()
        logits = self.forward(prompt, 0, cache)[-1]
        first = logits
        out, steps = [], []
        for i in range(n):
            steps.append(logits)
            tok = int(np.argmax(logits))   # first maximum: lowest id
            out.append(tok)
            feed = forced[i] if forced is not None and i < len(forced) \
                else tok
            if i + 1 < n:
                logits = self.forward([feed], len(prompt) + i, cache)[-1]
        return first, out, steps

    # ---- vocabulary, for reports ----

    def vocab(self):
        return self.meta("tokenizer.ggml.tokens")

    def detokenize(self, ids):
        toks = self.vocab()
        model = self.meta("tokenizer.ggml.model", "gpt2")
        if model == "gpt2":
            inv = {u: b for b, u in byte_unicode_map().items()}
            data = bytearray()
            for t in ids:
                for ch in toks[t]:
                    if ch in inv:
                        data.append(inv[ch])
                    else:
                        data += ch.encode("utf-8")
            return data.decode("utf-8", errors="replace")
        text = "".join(toks[t] for t in ids)
        return text.replace("\u2581", " ")


def byte_unicode_map():
    """GPT-2 byte-level BPE: each byte is shown as one printable character.

    Bytes that are printable Latin-1 ('!'..'~', '\xa1'..'\xac',
    '\xae'..'\xff') stand for themselves; the other 68 bytes map, in order,
    to U+0100, U+0101, ...
    """
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True,
                    help="prompt token ids, space-separated")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--logits-out")
    ap.add_argument("--tokens-out")
    ap.add_argument("--dtype", choices=("float64", "float32"),
                    default="float64")
    ap.add_argument("--top", type=int, default=5,
                    help="print this many top tokens (decoded)")
    args = ap.parse_args(argv)

    prompt = [int(t) for t in args.tokens.split()]
    if not prompt or args.n < 1:
        ap.error("need at least one prompt token and n >= 1")
    t0 = time.time()
    m = Model(args.model, args.dtype)
    t1 = time.time()
    first, out, _ = m.generate(prompt, args.n)
    t2 = time.time()
    if args.logits_out:
        np.save(args.logits_out, first.astype(np.float32))
    if args.tokens_out:
        with open(args.tokens_out, "w") as f:
            f.write(" ".join(str(t) for t in out) + "\n")
    vocab = m.vocab()
    order = np.argsort(-first, kind="stable")[:args.top]
    print("load %.2fs, %d prompt + %d generated tokens %.2fs (%s)" %
          (t1 - t0, len(prompt), args.n, t2 - t1, args.dtype))
    for t in order:
        print("  top %6d %10.4f %r" % (t, first[t], m.detokenize([t])))
    print("prompt:       %r" % m.detokenize(prompt))
    print("continuation: %r" % m.detokenize(out))
    print("ids: %s" % " ".join(str(t) for t in out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
