#!/usr/bin/env bash
# The quantization table of docs/QUANTIZATION.md (issue 15): loom's
# strategies against llama.cpp's llama-quantize, with and without its
# importance matrix, on SmolLM2-135M.
#
#   bench/quant_table.sh
#
# Source: the shipped SmolLM2-135M-Instruct Q4_1 dequantized to F32 (`loom
# quantize --allow-requantize ... f32`; its values are the Q4_1 file's).
# Calibration text: Apache-2.0, MPL-2.0 and GFDL-1.3 from
# /usr/share/common-licenses, concatenated; evaluation text: GPL-3 then
# GPL-2 (a different text). Both engines calibrate on the same text with
# 256-token chunks: `loom imatrix --hessian -c 256` and `llama-imatrix -c
# 256`. Every file is then evaluated by the same program, `loom perplexity
# --exact -c 256 --chunks 20` on the evaluation text: perplexity, and the
# mean KL divergence of its next-token distributions from the F32 model's
# (saved once with --save-logits), and how often both put the same token
# on top. Results are cached in $WORK; delete a file there to redo it.
#
# llama.cpp is the anchor of bench/anchor.sh (llama-cpp-python==0.3.36's
# vendored copy, built once into ~/.cache/loom).
#
# Environment: LOOM (./build/tools/loom), LOOM_CACHE (~/.cache/loom),
#   MODEL (the Q4_1 GGUF), WORK ($LOOM_CACHE/quant_table), TYPES
#   ("Q4_K_M Q4_0 Q3_K_M"), STRATEGIES ("rtn imatrix awq gptq gptq_awq";
#   one whose .so is not built is left out), CTX (256), CHUNKS (20),
#   THREADS (2), NO_LLAMA (set: loom's rows only).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "quant_table: error: $*" >&2; exit 1; }
log() { echo "quant_table: $*" >&2; }

LOOM_CACHE=${LOOM_CACHE:-$HOME/.cache/loom}
LOOM=${LOOM:-./build/tools/loom}
MODEL=${MODEL:-$LOOM_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf}
WORK=${WORK:-$LOOM_CACHE/quant_table}
TYPES=${TYPES:-Q4_K_M Q4_0 Q3_K_M}
STRATEGIES=${STRATEGIES:-rtn imatrix awq gptq gptq_awq}
CTX=${CTX:-256}
CHUNKS=${CHUNKS:-20}
THREADS=${THREADS:-2}
LICENSES=/usr/share/common-licenses
CALIB_FILES="Apache-2.0 MPL-2.0 GFDL-1.3"
EVAL_FILES="GPL-3 GPL-2"

# llama.cpp's OpenMP threads spin while they wait; on a loaded machine
# that costs llama-imatrix several times its run time.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
. bench/anchor.sh
[ -x "$LOOM" ] || die "$LOOM not built (bash scripts/setup.sh)"
[ -s "$MODEL" ] || die "no model at $MODEL (bash scripts/setup.sh)"
mkdir -p "$WORK"

# ---------------------------------------------------------------- inputs
# text NAME FILES...: $WORK/NAME.txt, the licenses concatenated; replaced
# (atomically) only when it differs, as another run may be reading it.
text() {
	local out=$WORK/$1.txt f
	shift
	for f in "$@"; do cat "$LICENSES/$f" || die "$LICENSES/$f missing"; done >"$out.$$"
	if cmp -s "$out.$$" "$out"; then rm -f "$out.$$"; else mv "$out.$$" "$out"; fi
}
text calib $CALIB_FILES
text eval $EVAL_FILES
f32=$WORK/f32.gguf
if [ ! -s "$f32" ]; then
	log "F32 source from $MODEL"
	"$LOOM" quantize --allow-requantize "$MODEL" "$f32" f32 >/dev/null
fi
if [ ! -s "$WORK/loom.imatrix" ]; then
	log "loom imatrix --hessian on the calibration text"
	"$LOOM" imatrix --model "$f32" -f "$WORK/calib.txt" -o "$WORK/loom.imatrix.tmp" \
		-c "$CTX" --hessian -t "$THREADS" --exact >"$WORK/loom.imatrix.log" 2>&1 ||
		die "loom imatrix failed (see $WORK/loom.imatrix.log)"
	mv "$WORK/loom.imatrix.tmp" "$WORK/loom.imatrix"
fi
ppl() { # MODEL FLAGS...
	"$LOOM" perplexity --model "$1" -f "$WORK/eval.txt" -c "$CTX" --chunks "$CHUNKS" \
		-t "$THREADS" --exact "${@:2}"
}
if [ ! -s "$WORK/base.kld" ]; then
	log "F32 base logits on the evaluation text"
	ppl "$f32" --save-logits "$WORK/base.kld.tmp" >"$WORK/base.log" 2>&1 ||
		die "loom perplexity failed (see $WORK/base.log)"
	mv "$WORK/base.kld.tmp" "$WORK/base.kld"
fi

# ---------------------------------------------------------------- the table
# llama.cpp's tools and importance matrix, when its rows are first needed
# (the build waits for bench/anchor.sh's lock; loom's rows need none of it).
llama_ready() {
	anchor_build llama-quantize llama-imatrix
	if [ ! -s "$WORK/llama.imatrix" ]; then
		log "llama-imatrix on the calibration text"
		"$ANCHOR_BIN/llama-imatrix" -m "$f32" -f "$WORK/calib.txt" -o "$WORK/llama.imatrix.dat" \
			-c "$CTX" -t "$THREADS" >"$WORK/llama.imatrix.log" 2>&1 ||
			die "llama-imatrix failed (see $WORK/llama.imatrix.log)"
		mv "$WORK/llama.imatrix.dat" "$WORK/llama.imatrix"
	fi
}

# make_one NAME COMMAND...: runs COMMAND (which writes $WORK/NAME.gguf)
# unless the file exists, then evaluates it once into $WORK/NAME.ppl.
make_one() {
	local name=$1 out=$WORK/$1.gguf
	shift
	if [ ! -s "$out" ]; then
		log "making $name"
		"$@" >"$WORK/$name.log" 2>&1 || die "making $name failed (see $WORK/$name.log)"
	fi
	if [ ! -s "$WORK/$name.ppl" ]; then
		log "evaluating $name"
		ppl "$out" --kl-base "$WORK/base.kld" >"$WORK/$name.ppl.$$" 2>&1 ||
			die "evaluating $name failed (see $WORK/$name.ppl.$$)"
		mv "$WORK/$name.ppl.$$" "$WORK/$name.ppl"
	fi
}

# row TYPE LABEL NAME: one line of the table from $WORK/NAME.{gguf,ppl}.
row() {
	local f=$WORK/$3
	local mib ppl kl top
	mib=$(stat -c %s "$f.gguf" | awk '{printf "%.2f", $1 / 1048576}')
	ppl=$(sed -n 's/^perplexity: \([0-9.]*\).*/\1/p' "$f.ppl")
	kl=$(sed -n 's/^KL divergence: mean \([0-9.]*\).*/\1/p' "$f.ppl")
	top=$(sed -n 's/^top-1 agreement: \([0-9.]*\)%.*/\1/p' "$f.ppl")
	printf "| %s | %s | %s | %s | %s | %s |\n" "$1" "$2" "$mib" "$ppl" "$kl" "$top"
}

# Files first (loom's, then llama.cpp's), the table at the end.
for type in $TYPES; do
	for s in $STRATEGIES; do
		if [ ! -f "build/plugins/qstrategy/$s.so" ]; then
			log "no build/plugins/qstrategy/$s.so: $s left out"
			continue
		fi
		im=()
		[ "$s" = rtn ] || im=(--imatrix "$WORK/loom.imatrix")
		make_one "$type.loom_$s" "$LOOM" quantize "$f32" "$WORK/$type.loom_$s.gguf" "$type" \
			--strategy "$s" "${im[@]}" -t "$THREADS"
	done
done
[ -n "${NO_LLAMA:-}" ] || llama_ready
for type in $TYPES; do
	[ -z "${NO_LLAMA:-}" ] || break
	make_one "$type.llama" "$ANCHOR_BIN/llama-quantize" "$f32" "$WORK/$type.llama.gguf" \
		"$type" "$THREADS"
	make_one "$type.llama_imat" "$ANCHOR_BIN/llama-quantize" --imatrix "$WORK/llama.imatrix" \
		"$f32" "$WORK/$type.llama_imat.gguf" "$type" "$THREADS"
done

base_ppl=$(sed -n 's/^perplexity: \([0-9.]*\).*/\1/p' "$WORK/base.log")
echo "F32 source: $(stat -c %s "$f32" | awk '{printf "%.2f", $1 / 1048576}') MiB, perplexity $base_ppl"
echo
echo "| type | method | MiB | perplexity | mean KL | same top token % |"
echo "|---|---|---|---|---|---|"
for type in $TYPES; do
	for s in $STRATEGIES; do
		if [ -s "$WORK/$type.loom_$s.ppl" ]; then row "$type" "loom $s" "$type.loom_$s"; fi
	done
	if [ -s "$WORK/$type.llama.ppl" ]; then row "$type" "llama-quantize" "$type.llama"; fi
	if [ -s "$WORK/$type.llama_imat.ppl" ]; then
		row "$type" "llama-quantize --imatrix" "$type.llama_imat"
	fi
done
