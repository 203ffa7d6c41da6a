#!/usr/bin/env bash
# Fast-mode quality, loom vs llama.cpp (issue 12): how far each engine's
# fast decode path moves the model's next-token distributions.
#
#   bench/kl_vs_llamacpp.sh
#
# Both engines are held to their own full-precision reference on the same
# text: an F32 copy of the model's weights (llama-quantize
# --allow-requantize F32, so the values are the quantized file's own,
# dequantized) run with an f32 KV cache gives the base logits (loom:
# --exact; llama.cpp: -ctk f32 -ctv f32); the quantized file run in each
# engine's default mode (8-bit activations, integer dot products, f16 KV
# cache in both) is compared with it. What remains is the error of the
# default path itself, which is what loom's exact/fast split promises to
# bound. (Until 2026-11-26 llama.cpp's base kept its default f16 cache, so
# its figure left out the cache's rounding that loom's included.)
#   loom:      loom perplexity -c CTX --exact --save-logits  /  --kl-base
#   llama.cpp: llama-perplexity -c CTX -ctk f32 -ctv f32 --kl-divergence-base
#              /  --kl-divergence
# Needs the anchor built by bench/vs_llamacpp.sh --setup.
#
# Environment: LOOM (./build/tools/loom), LOOM_CACHE (~/.cache/loom),
#   CACHE (anchor, $LOOM_CACHE/llama.cpp-0.3.36), MODEL (the Q4_1 GGUF),
#   TEXT (/usr/share/common-licenses/GPL-3), CTX (512), CHUNKS (8),
#   THREADS (2).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "kl_vs_llamacpp: error: $*" >&2; exit 1; }

LOOM_CACHE=${LOOM_CACHE:-$HOME/.cache/loom}
CACHE=${CACHE:-$LOOM_CACHE/llama.cpp-0.3.36}
LOOM=${LOOM:-./build/tools/loom}
MODEL=${MODEL:-$LOOM_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf}
TEXT=${TEXT:-/usr/share/common-licenses/GPL-3}
CTX=${CTX:-512}
CHUNKS=${CHUNKS:-8}
THREADS=${THREADS:-2}
BIN=$CACHE/build/bin

[ -x "$BIN/llama-perplexity" ] && [ -x "$BIN/llama-quantize" ] ||
	die "llama.cpp tools missing in $BIN: run bench/vs_llamacpp.sh --setup first"
[ -x "$LOOM" ] || die "$LOOM not built (bash scripts/setup.sh)"
[ -f "$MODEL" ] || die "$MODEL missing (bash scripts/setup.sh)"
[ -f "$TEXT" ] || die "$TEXT missing"

work=$LOOM_CACHE/kl
mkdir -p "$work"
f32=$work/$(basename "${MODEL%.gguf}").F32.gguf
if [ ! -s "$f32" ]; then
	"$BIN/llama-quantize" --allow-requantize "$MODEL" "$f32.tmp" F32 >"$work/quantize.log" 2>&1 ||
		die "llama-quantize to F32 failed (see $work/quantize.log)"
	mv "$f32.tmp" "$f32"
fi

# llama-perplexity scores its chunks the same way (second half of each)
# and needs the text to hold CHUNKS chunks; --chunks caps both.
loom_kl() { # MODEL FLAGS...
	"$LOOM" perplexity --model "$1" -f "$TEXT" -c "$CTX" --chunks "$CHUNKS" -t "$THREADS" "${@:2}"
}
echo "== loom: exact F32 base, then the Q4_1 file in fast and in exact mode"
loom_kl "$f32" --exact --save-logits "$work/loom.base" --force | tail -1
loom_fast=$(loom_kl "$MODEL" --kl-base "$work/loom.base")
loom_fast32=$(loom_kl "$MODEL" --kv-type f32 --kl-base "$work/loom.base")
loom_exact=$(loom_kl "$MODEL" --exact --kl-base "$work/loom.base")
echo "$loom_fast" | tail -4

echo "== llama.cpp: F32 base, then the Q4_1 file"
"$BIN/llama-perplexity" -m "$f32" -f "$TEXT" -c "$CTX" --chunks "$CHUNKS" -t "$THREADS" \
	-ctk f32 -ctv f32 --kl-divergence-base "$work/llama.base" >"$work/llama.base.log" 2>&1 ||
	die "llama-perplexity (base) failed: see $work/llama.base.log"
"$BIN/llama-perplexity" -m "$MODEL" -f "$TEXT" -c "$CTX" --chunks "$CHUNKS" -t "$THREADS" \
	--kl-divergence-base "$work/llama.base" --kl-divergence >"$work/llama.kl.log" 2>&1 ||
	die "llama-perplexity (kl) failed: see $work/llama.kl.log"
grep -E "Mean +KLD|99\.0% +KLD|Same top p|Mean PPL\(Q\)" "$work/llama.kl.log" || tail -20 "$work/llama.kl.log"

field() { echo "$1" | grep "^KL divergence" | sed -n "s/.*$2 \([0-9.e+-]*\).*/\1/p" | head -1; }
echo
echo "| engine, mode | mean KL vs own F32, f32 KV | 99th pct KL | top-1 agreement |"
echo "| --- | --- | --- | --- |"
echo "| loom fast (default) | $(field "$loom_fast" "mean") | $(field "$loom_fast" "percentile") | $(echo "$loom_fast" | sed -n 's/top-1 agreement: \([0-9.]*%\).*/\1/p') |"
echo "| loom fast, f32 KV cache | $(field "$loom_fast32" "mean") | $(field "$loom_fast32" "percentile") | $(echo "$loom_fast32" | sed -n 's/top-1 agreement: \([0-9.]*%\).*/\1/p') |"
echo "| loom --exact | $(field "$loom_exact" "mean") | $(field "$loom_exact" "percentile") | $(echo "$loom_exact" | sed -n 's/top-1 agreement: \([0-9.]*%\).*/\1/p') |"
echo "| llama.cpp (default) | $(sed -n 's/^Mean *KLD: *\([0-9.e+-]*\).*/\1/p' "$work/llama.kl.log") | $(sed -n 's/^99\.0% *KLD: *\([0-9.e+-]*\).*/\1/p' "$work/llama.kl.log") | $(sed -n 's/^Same top p: *\([0-9.]*\).*/\1%/p' "$work/llama.kl.log") |"
