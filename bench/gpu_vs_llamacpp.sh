#!/bin/bash
# loom cuda.so against llama.cpp's CUDA backend on one GPU, in about 10 minutes of device time.
#
#   bash bench/gpu_vs_llamacpp.sh [BUNDLE]      (on the GPU machine, from the project root)
#
# BUNDLE (default .gpu-bundle) is what ../shared/gpu/make-bundle.sh builds here and the run tool
# carries: opt/loom (loom, cuda.so), lib/, mkgguf.py, the gguf wheel and lcsrc.tgz (llama.cpp from
# the llama-cpp-python 0.3.36 sdist). Logs to $OUT/gpu_vs_llamacpp.log (OUT default /tmp/gpuout).
#
# Order, most important first, each step skipped once the time budget (BUDGET_S, default 540 s)
# is spent:
#   0. llama.cpp's llama-bench and llama-batched-bench build in the background (sm_90, FlashAttention
#      kernels off: about 5 min on 16 cores);
#   1. random 1B-shaped models (tools/mkgguf.py --preset 1b): q4_0, q8_0, and Q4_K_M requantized from
#      the q4_0 file by `loom quantize --allow-requantize` (random weights: only the layout matters);
#   2. loom at batch 1, pp512 and tg128 on the three, with the decode bandwidth and its fraction of
#      the card's peak: bytes of weights a token reads (every tensor but an untied token_embd) x
#      tokens/s / peak;
#   3. loom at depth 4096, and 16 and 64 sequences at once (-npl); then A/B runs of the paths issue
#      30 added against what they replace (LOOM_GPU_MMQ_MAX_M=0: batches on f16 panels;
#      LOOM_GPU_MMA=0: batches on the int8 GEMM by dp4a instead of tensor-core MMA; =512: pp512 on
#      the int8 GEMM, MMA and dp4a, against the default pp512 row on cuBLAS f16 panels, which
#      decides the m bound, after checking that MMA and dp4a give the same logits on the card
#      (mma_same_bits); LOOM_DEVICE_GREEDY=0: greedy on the host; LOOM_GPU_FUSE=0: every
#      call its own launch, no GEMV groups, norm+quantize or add+norm kernels; LOOM_GPU_PACK=0:
#      q4_0/q8_0/q6_K weights in GGUF layout, not repacked at load), tagged [VAR=VALUE,...];
#   4. the 8B-shaped q4_0 and Q4_K_M: loom tg128 and pp512;
#   5. llama-bench (pp512, tg128 at depth 0 and 4096) and llama-batched-bench (-npl 1,16,64) on the
#      same files, then a summary table of both.
#
# Off the GPU machine: DRY=1 prints the plan's commands without running them; with
# BACKEND=gpuemu.so (or cpu.so) LOOM=build/tools/loom TINY=1 it runs every loom step on a tiny
# random model (2 layers) and skips llama.cpp unless LLAMA_BIN names a directory with llama-bench.
set -u
D=$(cd "${1:-.gpu-bundle}" 2>/dev/null && pwd || echo "${1:-.gpu-bundle}")
OUT=${OUT:-/tmp/gpuout}
W=${WORK:-/tmp/gpuwork}
BACKEND=${BACKEND:-cuda.so}
BUDGET_S=${BUDGET_S:-540}
DRY=${DRY:-0}
TINY=${TINY:-0}
LOOM=${LOOM:-$D/opt/loom/bin/loom}
LB=${LLAMA_BIN:-/tmp/lcsrc/b/bin}
T0=$(date +%s)
mkdir -p "$OUT" "$W"

log() { echo "== $(date +%T) +$(( $(date +%s) - T0 ))s $*"; }
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
# Runs a command (echoed first, to the log: fd 3) unless DRY=1; under a timeout of at most the
# budget left.
run() {
	local t=$1; shift
	echo "\$ $*" >&3
	[ "$DRY" = 1 ] && return 0
	local l; l=$(left)
	[ "$l" -lt 5 ] && { echo "(skipped: time budget spent)" >&3; return 1; }
	[ "$t" -gt "$l" ] && t=$l
	timeout "$t" "$@"
}
# True while at least $1 seconds of the budget are left (always in a dry run).
have() { [ "$DRY" = 1 ] || [ "$(left)" -ge "$1" ]; }

setup_env() {
	export LD_LIBRARY_PATH="$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
	if [ -d "$D/whl" ] && [ "$DRY" != 1 ]; then
		python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
			--target /tmp/site "$D"/whl/*.whl >/dev/null 2>&1
		export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
	fi
	MKGGUF=$D/mkgguf.py
	[ -f "$MKGGUF" ] || MKGGUF=tools/mkgguf.py
}

build_llama() {
	[ -x "$LB/llama-bench" ] && { log "llama.cpp: $LB already built"; return; }
	[ -f "$D/lcsrc.tgz" ] || { log "llama.cpp: no $D/lcsrc.tgz, its half is skipped"; return; }
	log "build llama.cpp CUDA in the background"
	[ "$DRY" = 1 ] && { echo "\$ tar xzf $D/lcsrc.tgz; cmake -B b -DGGML_CUDA=ON ...; cmake --build b"; return; }
	( cd /tmp && rm -rf lcsrc && tar xzf "$D/lcsrc.tgz" && cd lcsrc &&
	  cmake -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
		-DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=OFF \
		-DGGML_CUDA_NCCL=OFF -DGGML_CUDA_FA=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/lc_cmake.log 2>&1 &&
	  nice cmake --build b -j"$(nproc)" --target llama-bench llama-batched-bench > /tmp/lc_build.log 2>&1
	  echo "build rc=$?" > /tmp/lc_done ) &
}

# mkmodel NAME PRESET TYPE: $W/NAME.gguf (q4_0/q8_0 by mkgguf, Q4_K_M by requantizing NAME's q4_0).
mkmodel() {
	local name=$1 preset=$2 type=$3 f=$W/$1.gguf
	[ -s "$f" ] && [ "$DRY" != 1 ] && return 0
	local shape=(--preset "$preset")
	[ "$TINY" = 1 ] && shape=(--layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 --vocab 1024 --ctx 8192)
	case $type in
	Q4_K_M) run 300 "$LOOM" quantize --allow-requantize "$W/${name%k}.gguf" "$f" Q4_K_M | tail -1 ;;
	*) run 300 python3 "$MKGGUF" "$f" "${shape[@]}" --type "$type" -q ;;
	esac
}

# Bytes of weights one decode step reads (every tensor but token_embd unless it is the head).
decode_bytes() {
	[ "$DRY" = 1 ] && { echo 0; return; }
	python3 - "$1" <<'EOF' 2>/dev/null || echo 0
import sys
from gguf import GGUFReader
t = {x.name: int(x.n_bytes) for x in GGUFReader(sys.argv[1]).tensors}
print(sum(t.values()) - (t.get("token_embd.weight", 0) if "output.weight" in t else 0))
EOF
}

PEAK_GBS=${PEAK_GBS:-}
peak_gbs() {
	[ -n "$PEAK_GBS" ] && return
	local name; name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
	case $name in
	*H200*) PEAK_GBS=4800 ;; *"H100 NVL"*) PEAK_GBS=3900 ;; *"H100 PCIe"*) PEAK_GBS=2000 ;;
	*H100*) PEAK_GBS=3350 ;; *) PEAK_GBS=0 ;;
	esac
	log "device: ${name:-unknown}, peak ${PEAK_GBS} GB/s (PEAK_GBS= to set)"
}

# loom_bench NAME ARGS...: loom bench rows (| ... | test | t/s |), each kept in $OUT/rows.txt
# as "loom NAME TEST T/S"; decode rows get the bandwidth and its fraction of the peak.
loom_bench() {
	local name=$1; shift
	local f=$W/$name.gguf bytes out
	bytes=$(decode_bytes "$f")
	out=$(run 150 env ${BENCH_ENV:-} "$LOOM" bench --backend="$BACKEND" --model "$f" -r 3 "$@" 2>&1)
	echo "$out" | grep -E '^\| ' | grep -E 'pp|tg'
	echo "$out" | grep -E '^\| ' | grep -E 'pp|tg' | awk -F'|' -v n="$name" -v b="$bytes" \
		-v p="$PEAK_GBS" -v tag="${BENCH_ENV:+[${BENCH_ENV// /,}]}" '{ t = $5; gsub(/^ +| +$/, "", t); split($6, r, " ");
		line = "loom " n tag " " t " " r[1];
		if (t ~ /^tg/ && t !~ /np/ && b > 0) { gbs = b * r[1] / 1e9;
			line = line sprintf(" %.2fGB/s", gbs);
			if (p > 0) line = line sprintf(" %.1f%%", 100 * gbs / p) }
		print line }' | tee -a "$OUT/rows.txt"
}

# depth_ratio DEPTH MODELS...: decode at depth DEPTH over decode at depth 0 (issue 30's target:
# at least 0.8 at 4096), from the rows loom_bench kept.
depth_ratio() {
	local depth=$1; shift
	for m in "$@"; do
		awk -v n="$m" -v d="@ d$depth" '$1 == "loom" && $2 == n && $3 ~ /^tg/ {
			if ($4 == "@") { if ($4 " " $5 == d) deep = $6 } else if (!flat) flat = $4 }
			END { if (flat > 0 && deep > 0)
				printf "loom %s decode depth %s / depth 0: %.1f / %.1f t/s = %.2f (target >= 0.80)\n",
					n, substr(d, 4), deep, flat, deep / flat
			else printf "loom %s decode depth ratio: not measured\n", n }' "$OUT/rows.txt"
	done
}

# mma_same_bits NAME: the int8 GEMM's tensor-core MMA and dp4a must give the same bits on the card
# (docs/GPU.md): one 256-token chunk's logits with the int8 GEMM on every GEMM of the step
# (LOOM_GPU_MMQ_MAX_M=512), LOOM_GPU_MMA=1 against =0, compared byte for byte. A wrong fragment
# layout on the hardware, which the emulator cannot show, makes them differ.
mma_same_bits() {
	local f=$W/$1.gguf txt=$W/mma_text.txt
	[ "$DRY" = 1 ] || python3 -c "import random; r = random.Random(7); w = 'the of and to a in that is was he for it with as his on be at by'.split(); print(' '.join(r.choice(w) for _ in range(3000)))" > "$txt"
	for v in 1 0; do
		run 120 env LOOM_GPU_MMQ_MAX_M=512 LOOM_GPU_MMA=$v "$LOOM" perplexity --backend="$BACKEND" \
			--model "$f" -f "$txt" -c 256 --chunks 1 --save-logits "$W/mma$v.logits" --force 2>&1 | tail -1
	done
	[ "$DRY" = 1 ] && return
	if cmp -s "$W/mma1.logits" "$W/mma0.logits"; then
		echo "loom $1 int8 GEMM MMA vs dp4a: logits identical" | tee -a "$OUT/rows.txt"
	else
		echo "loom $1 int8 GEMM MMA vs dp4a: logits DIFFER" | tee -a "$OUT/rows.txt"
	fi
}

llama_bench() {
	local name=$1
	[ -x "$LB/llama-bench" ] || [ "$DRY" = 1 ] || { echo "(no llama-bench)"; return; }
	run 150 "$LB/llama-bench" -m "$W/$name.gguf" -p 512 -n 128 -d 0,4096 -ngl 99 -r 3 2>&1 |
		grep -E '^\|' | tee -a "$OUT/llama_rows.txt"
}

wait_llama() {
	[ "$DRY" = 1 ] || [ -x "$LB/llama-bench" ] || [ ! -f "$D/lcsrc.tgz" ] && return
	log "waiting for the llama.cpp build"
	while [ ! -f /tmp/lc_done ] && have 60; do sleep 2; done
	cat /tmp/lc_done 2>/dev/null || echo "build not done in the budget"
	tail -3 /tmp/lc_build.log 2>/dev/null; cp /tmp/lc_build.log "$OUT/" 2>/dev/null
}

main() {
	exec 3>&1
	: > "$OUT/rows.txt"; : > "$OUT/llama_rows.txt"; : > "$OUT/depth.txt"
	setup_env
	log "loom $BACKEND vs llama.cpp, budget ${BUDGET_S}s, models in $W"
	build_llama
	peak_gbs
	# batched: 128-token prompts, 64 decoded each, as llama-batched-bench below
	local P=512 N=128 DEPTH=4096 NPL="16 64" NPP=128 NTG=64
	[ "$TINY" = 1 ] && { P=64; N=16; DEPTH=256; NPL="4"; NPP=32; NTG=8; }
	log "1B-shaped models"
	mkmodel 1b 1b q4_0; mkmodel 1b8 1b q8_0; mkmodel 1bk 1b Q4_K_M
	log "loom batch 1: decode (the bandwidth figures) and prefill pp$P"
	for m in 1b 1bk 1b8; do have 30 && loom_bench $m -p $P -n $N; done
	# decode attention (one block per GQA group and split of 256 keys, K/V read once a group)
	# against depth 0: the ratio is issue 30's item 4 target
	log "loom at depth $DEPTH"
	for m in 1b 1bk; do have 60 && loom_bench $m -p $P -n $N -d $DEPTH; done
	depth_ratio $DEPTH 1b 1bk | tee -a "$OUT/depth.txt"
	log "loom batched decode (-npl)"
	for n in $NPL; do have 60 && loom_bench 1b -p $NPP -n $NTG -npl $n; done
	# the paths of issue 30 against what they replace, on the same file: batches past 16 rows on
	# dequantized f16 panels (cuBLAS) instead of the int8 GEMM; prefill on the int8 GEMM instead
	# of the panels; greedy picked on the host (full logits downloaded) instead of the device;
	# decode with each call its own launch (no fusion: compare with the tg rows of batch 1 and 16)
	log "loom A/B: int8 GEMM off for batches, by dp4a, on for prefill (MMA, dp4a); greedy on the host; unfused"
	local big=${NPL##* }
	have 60 && BENCH_ENV=LOOM_GPU_MMQ_MAX_M=0 loom_bench 1b -p $NPP -n $NTG -npl $big
	have 60 && BENCH_ENV=LOOM_GPU_MMA=0 loom_bench 1b -p $NPP -n $NTG -npl $big
	# pp512 with the int8 GEMM's bound at 512: tensor-core MMA, then dp4a; the pp512 rows of batch 1
	# above are cuBLAS f16 panels (the default bound, 256). MMA faster than the panels on both
	# files: raise MMQ_MAX_M (docs/GPU.md, "Batched GEMM in fast mode")
	for m in 1b 1bk; do have 30 && mma_same_bits $m; done
	for m in 1b 1bk; do
		have 40 && BENCH_ENV=LOOM_GPU_MMQ_MAX_M=512 loom_bench $m -p $P -n 1
		have 40 && BENCH_ENV="LOOM_GPU_MMQ_MAX_M=512 LOOM_GPU_MMA=0" loom_bench $m -p $P -n 1
	done
	have 40 && BENCH_ENV=LOOM_DEVICE_GREEDY=0 loom_bench 1b -p 16 -n $N
	for m in 1b 1bk; do have 40 && BENCH_ENV=LOOM_GPU_FUSE=0 loom_bench $m -p 16 -n $N; done
	have 60 && BENCH_ENV=LOOM_GPU_FUSE=0 loom_bench 1b -p $NPP -n $NTG -npl ${NPL%% *}
	# q4_0/q8_0/q6_K weights in GGUF layout (4-byte loads) instead of repacked (16-byte loads)
	for m in 1b 1b8 1bk; do have 40 && BENCH_ENV=LOOM_GPU_PACK=0 loom_bench $m -p 16 -n $N; done
	if have 240; then
		log "8B-shaped models"
		mkmodel 8b 8b q4_0 && mkmodel 8bk 8b Q4_K_M
		for m in 8b 8bk; do have 60 && loom_bench $m -p $P -n $N; done
	fi
	wait_llama
	log "llama.cpp: llama-bench"
	for m in 1b 1bk 1b8 8b 8bk; do
		[ -s "$W/$m.gguf" ] || [ "$DRY" = 1 ] || continue
		have 40 && llama_bench $m
	done
	if have 40 && { [ -x "$LB/llama-batched-bench" ] || [ "$DRY" = 1 ]; }; then
		log "llama.cpp: llama-batched-bench"
		run 120 "$LB/llama-batched-bench" -m "$W/1b.gguf" -ngl 99 -c 16384 -b 2048 -ub 512 \
			-npp 128 -ntg 64 -npl 1,16,64 2>&1 | grep -E '^\|'
	fi
	log "summary: loom (model test t/s [GB/s fraction-of-peak])"
	cat "$OUT/rows.txt"
	log "summary: decode at depth $DEPTH against depth 0"
	cat "$OUT/depth.txt" 2>/dev/null
	log "summary: llama.cpp llama-bench rows"
	cat "$OUT/llama_rows.txt"
	log "done"
}

main 2>&1 | tee "$OUT/gpu_vs_llamacpp.log"
