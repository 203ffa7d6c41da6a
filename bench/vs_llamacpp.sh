#!/usr/bin/env bash
# loom vs llama.cpp, side by side on the same GGUF files (issue 12).
#
#   bench/vs_llamacpp.sh              build the anchor if needed, then measure
#   bench/vs_llamacpp.sh --setup      only build llama.cpp and prepare the models
#
# The anchor is llama.cpp as vendored in the PyPI sdist llama-cpp-python==0.3.36,
# built once (CPU only, -DGGML_NATIVE=ON) into a cache outside the repo, together
# with Q4_K_M and Q8_0 requantizations of the default SmolLM2-135M Q4_1 model
# (made with its llama-quantize --allow-requantize). A re-run finds them there.
#
# For each model and thread count it runs `loom bench` then `llama-bench`
# (same -p/-n/-t/-r), ROUNDS times over, interleaved, and prints medians over
# the rounds, the loom/llama.cpp ratios and the decode weight stream
# (weight bytes x tg t/s) as a fraction of the streaming-read bandwidth it
# measures with a small C program (bench/streamread.c) at the same thread
# count. The probe runs again right before each round's pair of runs, and
# a fraction is that round's decode against that round's probe (median
# over rounds): a shared host's bandwidth moves by tens of percent within
# minutes, so one probe at the start measured another machine.
#
# Environment:
#   LOOM          loom binary                 (default ./build/tools/loom)
#   LOOM_FLAGS    extra flags for loom bench  (e.g. "--exact")
#   LOOM_CACHE    model cache                 (default ~/.cache/loom)
#   CACHE         anchor cache                (default $LOOM_CACHE/llama.cpp-0.3.36)
#   MODEL         base GGUF                   (default $LOOM_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf)
#                 or 1b / 8b: a random Llama-3.2-1B- / Llama-3-8B-shaped
#                 f16 file made once by tools/mkgguf.py --preset (cached as
#                 $LOOM_CACHE/synthetic-1b.F16.gguf), requantized to QUANTS
#   QUANTS        formats to compare          (default "Q4_1 Q4_K_M Q8_0"; Q4_1 = MODEL as is)
#   THREADS       thread counts               (default "1 2")
#   ROUNDS        interleaved rounds          (default 3)
#   PP, TG, REPS  -p, -n and -r of both tools (default 128, 64, 3)
#   DEPTH         -d of both tools: tokens of context before the timed
#                 decode (default 0, llama-bench's default)
#   JOBS          parallel build jobs         (default nproc)
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "vs_llamacpp: error: $*" >&2; exit 1; }
log() { echo "vs_llamacpp: $*" >&2; }

. bench/anchor.sh
VERSION=$ANCHOR_VERSION
LOOM=${LOOM:-./build/tools/loom}
LOOM_FLAGS=${LOOM_FLAGS:-}
MODEL=${MODEL:-$LOOM_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf}
QUANTS=${QUANTS:-Q4_1 Q4_K_M Q8_0}
THREADS=${THREADS:-1 2}
ROUNDS=${ROUNDS:-3}
PP=${PP:-128}
TG=${TG:-64}
DEPTH=${DEPTH:-0}
# the decode test's name in both tools' tables
# (loom bench's -d delays only the decode; llama-bench's also the
# prefill, so with DEPTH > 0 only the tg columns compare like for like)
if [ "$DEPTH" -gt 0 ]; then
	TGLABEL="tg$TG @ d$DEPTH" LLAMA_PP="pp$PP @ d$DEPTH"
else
	TGLABEL="tg$TG" LLAMA_PP="pp$PP"
fi
REPS=${REPS:-3}
SETUP_ONLY=0
case "${1:-}" in
	--setup) SETUP_ONLY=1 ;;
	"") ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument '$1' (try --help)" ;;
esac

BIN=$ANCHOR_BIN
anchor_build llama-bench llama-perplexity llama-quantize

# ---------------------------------------------------------------- 2. models
case "$MODEL" in
1b|8b)
	f=$LOOM_CACHE/synthetic-$MODEL.F16.gguf
	if [ ! -s "$f" ]; then
		log "making $f (tools/mkgguf.py --preset $MODEL --type f16)"
		python3 tools/mkgguf.py --preset "$MODEL" --type f16 -q "$f.tmp" || die "mkgguf failed"
		mv "$f.tmp" "$f"
	fi
	MODEL=$f ;;
esac
[ -s "$MODEL" ] || die "no model at $MODEL (run scripts/setup.sh first)"
base=$(basename "$MODEL" .gguf)      # SmolLM2-135M-Instruct.Q4_1
stem=${base%.*}                      # SmolLM2-135M-Instruct
declare -A FILE
for q in $QUANTS; do
	if [ "$base" = "$stem.$q" ]; then
		FILE[$q]=$MODEL
		continue
	fi
	out=$CACHE/models/$stem.$q.gguf
	if [ ! -s "$out" ]; then
		mkdir -p "$CACHE/models"
		log "making $out with llama-quantize --allow-requantize"
		"$BIN/llama-quantize" --allow-requantize "$MODEL" "$out.tmp" "$q" \
			>"$CACHE/models/$stem.$q.log" 2>&1 ||
			die "llama-quantize to $q failed, see $CACHE/models/$stem.$q.log"
		mv "$out.tmp" "$out"
	fi
	FILE[$q]=$out
done

# ---------------------------------------------------------------- 3. bandwidth
# bench/streamread.c, built once into the cache (bench/streamread.sh)
STREAM=$(bench/streamread.sh "$CACHE") || die "cannot build the bandwidth probe"
[ "$SETUP_ONLY" = 1 ] && { log "setup done: tools in $BIN, models ${FILE[*]}"; exit 0; }

# ---------------------------------------------------------------- 4. runs
[ -x "$LOOM" ] || die "no loom binary at $LOOM (build with meson first, or set LOOM)"
OUTDIR=$(mktemp -d "${TMPDIR:-/tmp}/vs_llamacpp.XXXXXX")
log "raw outputs in $OUTDIR"

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
declare -A BW BWPASS
for t in $THREADS; do
	read -r BW[$t] BWPASS[$t] < <("$STREAM" "$t") && [ -n "${BWPASS[$t]}" ] || die "bandwidth probe failed"
	log "streaming read, $t thread(s): ${BW[$t]} GB/s (best 64 MiB chunk), ${BWPASS[$t]} GB/s (best 1 GiB pass)"
done

# loom bench / llama-bench both print a markdown table; the t/s column is
# "mean ± sd". Print "pp tg" means.
parse_loom() { # FILE [PP_LABEL]
	awk -F'|' -v pp="${2:-pp$PP}" -v tg="$TGLABEL" '
		{ for (i = 2; i < NF; i++) { f = $i; gsub(/^ +| +$/, "", f); if (f == pp) p = $(NF-1); if (f == tg) g = $(NF-1) } }
		END { split(p, a, " "); split(g, b, " "); if (a[1] == "" || b[1] == "") exit 1; print a[1], b[1] }' "$1"
}
parse_llama() { parse_loom "$1" "$LLAMA_PP"; }

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR+1)/2]; else print (v[NR/2] + v[NR/2+1]) / 2 }'; }

declare -A R
for r in $(seq 1 "$ROUNDS"); do
	for q in $QUANTS; do
		for t in $THREADS; do
			read -r bc bp < <("$STREAM" "$t") && [ -n "$bp" ] || die "bandwidth probe failed"
			R[$q,$t,bw]+=" $bc"; R[$q,$t,bwp]+=" $bp"
			f=$OUTDIR/loom.$q.t$t.r$r
			# shellcheck disable=SC2086
			"$LOOM" bench --model "${FILE[$q]}" -p "$PP" -n "$TG" -d "$DEPTH" -t "$t" -r "$REPS" $LOOM_FLAGS >"$f" 2>&1 ||
				die "loom bench failed on $q -t $t, see $f"
			read -r lp lt < <(parse_loom "$f") || die "cannot parse $f"
			f=$OUTDIR/llama.$q.t$t.r$r
			"$BIN/llama-bench" -m "${FILE[$q]}" -p "$PP" -n "$TG" -d "$DEPTH" -t "$t" -r "$REPS" >"$f" 2>&1 ||
				die "llama-bench failed on $q -t $t, see $f"
			read -r cp ct < <(parse_llama "$f") || die "cannot parse $f"
			R[$q,$t,lp]+=" $lp"; R[$q,$t,lt]+=" $lt"; R[$q,$t,cp]+=" $cp"; R[$q,$t,ct]+=" $ct"
			log "round $r $q -t $t: probe $bc GB/s | loom pp$PP $lp tg$TG $lt | llama.cpp pp$PP $cp tg$TG $ct"
		done
	done
done

# The median over rounds of weight bytes x tg t/s / probe bandwidth, each
# round's decode against the probe run just before it.
fractions() { # WEIGHT_BYTES "TG_RATES" "PROBE_RATES"
	local -a tg bw
	local i out=()
	read -r -a tg <<<"$2"; read -r -a bw <<<"$3"
	for i in "${!tg[@]}"; do
		out+=("$(awk -v w="$1" -v t="${tg[$i]}" -v b="${bw[$i]}" 'BEGIN { print w * t / 1e9 / b }')")
	done
	median "${out[@]}"
}

# Weight bytes streamed per decode token: the tensor data of the file (file
# size less the GGUF header and metadata is within a fraction of a percent).
wbytes() { python3 - "$1" <<'PY'
import sys
try:
    import gguf
    r = gguf.GGUFReader(sys.argv[1])
    print(sum(int(t.n_bytes) for t in r.tensors))
except Exception:
    import os
    print(os.path.getsize(sys.argv[1]))
PY
}

echo
echo "loom: $LOOM bench ${LOOM_FLAGS:-(default flags)}; llama.cpp $VERSION (PyPI llama-cpp-python sdist); $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
echo "t/s, medians of $ROUNDS interleaved rounds (each the mean of -r $REPS); ratio = loom / llama.cpp;"
echo "tg GB/s = weight bytes x tg t/s; (of BW): median over rounds of its fraction of the streaming-read"
echo "bandwidth (best 64 MiB chunk) probed right before that round; probe GB/s: median chunk / 1 GiB pass"
for t in $THREADS; do echo "  streaming read at the start, $t thread(s): ${BW[$t]} GB/s best 64 MiB chunk (${BWPASS[$t]} GB/s best 1 GiB pass)"; done
echo "  load average before the runs: $LOAD0; after: $(cut -d' ' -f1-3 /proc/loadavg)"
[ "$DEPTH" -gt 0 ] && echo "  tg after $DEPTH tokens of context; pp: loom on an empty cache, llama.cpp after $DEPTH tokens (compare tg only)"
echo
echo "| model ($stem) | weights MB | threads | loom pp$PP | llama.cpp pp$PP | ratio | loom tg$TG | llama.cpp tg$TG | ratio | probe GB/s | loom tg GB/s (of BW) | llama.cpp tg GB/s (of BW) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for q in $QUANTS; do
	wb=$(wbytes "${FILE[$q]}")
	for t in $THREADS; do
		# shellcheck disable=SC2086
		lp=$(median ${R[$q,$t,lp]}); lt=$(median ${R[$q,$t,lt]})
		# shellcheck disable=SC2086
		cp=$(median ${R[$q,$t,cp]}); ct=$(median ${R[$q,$t,ct]})
		# shellcheck disable=SC2086
		bw=$(median ${R[$q,$t,bw]}); bp=$(median ${R[$q,$t,bwp]})
		# shellcheck disable=SC2086
		lf=$(fractions "$wb" "${R[$q,$t,lt]}" "${R[$q,$t,bw]}")
		# shellcheck disable=SC2086
		cf=$(fractions "$wb" "${R[$q,$t,ct]}" "${R[$q,$t,bw]}")
		awk -v q="$q" -v t="$t" -v wb="$wb" -v bw="$bw" -v bp="$bp" -v lp="$lp" -v lt="$lt" \
			-v cp="$cp" -v ct="$ct" -v lf="$lf" -v cf="$cf" 'BEGIN {
			lg = wb * lt / 1e9; cg = wb * ct / 1e9
			printf "| %s | %.1f | %s | %.0f | %.0f | %.2f | %.1f | %.1f | %.2f | %.1f / %.1f | %.1f (%.0f %%) | %.1f (%.0f %%) |\n",
				q, wb / 1e6, t, lp, cp, lp / cp, lt, ct, lt / ct, bw, bp, lg, 100 * lf, cg, 100 * cf }'
	done
done
