#!/usr/bin/env bash
# Batched decode, loom vs llama.cpp, side by side on the same GGUF (issue 12:
# "the same for small-m GEMM (decode batches in serve, ...)", "threads that
# pay").
#
#   bench/batched_vs_llamacpp.sh
#
# N sequences decode together, as a server's steps do: `loom bench -npl N`
# against llama.cpp's llama-batched-bench -npl N (the anchor of
# bench/anchor.sh, built once outside the repo). Both count S_TG, the decode
# tokens of all N sequences per second once every prompt is in (each prompt is
# one token, then TG tokens each). For every model, N and thread count, ROUNDS
# interleaved rounds; it prints medians, the loom / llama.cpp ratio, each
# engine's gain over one sequence (N = 1) and each thread count's gain over
# the first.
#
# Environment:
#   LOOM        loom binary                 (default ./build/tools/loom)
#   LOOM_FLAGS  extra flags for loom bench  (e.g. "--exact")
#   LOOM_CACHE  model cache                 (default ~/.cache/loom)
#   MODELS      GGUF files                  (default the SmolLM2-135M Q4_1 file)
#   NPL         sequences decoding together (default "1 4 8"; 1 comes first)
#   THREADS     thread counts               (default "1 2"; the first is the base)
#   ROUNDS      interleaved rounds          (default 3)
#   TG          decode tokens per sequence  (default 64)
#   REPS        loom bench -r               (default 2; llama-batched-bench runs once)
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "batched_vs_llamacpp: error: $*" >&2; exit 1; }
log() { echo "batched_vs_llamacpp: $*" >&2; }

. bench/anchor.sh
LOOM=${LOOM:-./build/tools/loom}
LOOM_FLAGS=${LOOM_FLAGS:-}
MODELS=${MODELS:-$LOOM_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf}
NPL=${NPL:-1 4 8}
THREADS=${THREADS:-1 2}
ROUNDS=${ROUNDS:-3}
TG=${TG:-64}
REPS=${REPS:-2}
case "${1:-}" in
	"") ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument '$1' (try --help)" ;;
esac
[ "${NPL%% *}" = 1 ] || die "NPL must start with 1 (the single-sequence base)"
[ -x "$LOOM" ] || die "no loom binary at $LOOM (build with meson first, or set LOOM)"
for m in $MODELS; do [ -s "$m" ] || die "no model at $m"; done
anchor_build llama-batched-bench

OUTDIR=$(mktemp -d "${TMPDIR:-/tmp}/batched_vs_llamacpp.XXXXXX")
log "raw outputs in $OUTDIR"
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

# loom bench: the "tgTG npN" row's mean (N = 1: "tgTG")
parse_loom() { # FILE N
	local label="tg$TG"
	[ "$2" -gt 1 ] && label="tg$TG np$2"
	awk -F'|' -v want="$label" '
		NF >= 4 { f = $(NF-2); gsub(/^ +| +$/, "", f); if (f == want) { split($(NF-1), a, " "); v = a[1] } }
		END { if (v == "") exit 1; print v }' "$1"
}
# llama-batched-bench: the S_TG column of the row with B = N
parse_llama() { # FILE N
	awk -F'|' -v n="$2" '
		/^\|/ { for (i = 2; i < NF; i++) { f = $i; gsub(/ /, "", f); h[i] = f }
			if (!col) { for (i = 2; i < NF; i++) if (h[i] == "S_TGt/s") col = i; next }
			if (h[4] == n && h[3] != "") v = h[col] }
		END { if (v == "") exit 1; print v }' "$1"
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR+1)/2]; else print (v[NR/2] + v[NR/2+1]) / 2 }'; }

declare -A R
for r in $(seq 1 "$ROUNDS"); do
	for m in $MODELS; do
		for n in $NPL; do
			for t in $THREADS; do
				b=$(basename "$m" .gguf)
				f=$OUTDIR/loom.$b.np$n.t$t.r$r
				# shellcheck disable=SC2086
				"$LOOM" bench --model "$m" -p 1 -n "$TG" -t "$t" -r "$REPS" -npl "$n" $LOOM_FLAGS >"$f" 2>&1 ||
					die "loom bench failed, see $f"
				lt=$(parse_loom "$f" "$n") || die "cannot parse $f"
				f=$OUTDIR/llama.$b.np$n.t$t.r$r
				"$ANCHOR_BIN/llama-batched-bench" -m "$m" -npp 1 -ntg "$TG" -npl "$n" -t "$t" -tb "$t" \
					-c $((n * (TG + 8))) >"$f" 2>&1 || die "llama-batched-bench failed, see $f"
				ct=$(parse_llama "$f" "$n") || die "cannot parse $f"
				R[$m,$n,$t,l]+=" $lt"; R[$m,$n,$t,c]+=" $ct"
				log "round $r $b -npl $n -t $t: loom $lt | llama.cpp $ct t/s"
			done
		done
	done
done

t0=${THREADS%% *}
echo
echo "loom: $LOOM bench -p 1 -n $TG -npl N ${LOOM_FLAGS:-(default flags)}; llama.cpp $ANCHOR_VERSION llama-batched-bench -npp 1 -ntg $TG -npl N"
echo "$(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p' | head -1); load average before: $LOAD0; after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "decode t/s of all N sequences together, medians of $ROUNDS interleaved rounds; ratio = loom / llama.cpp;"
echo "x N=1: the rate over one sequence's at the same threads; x t$t0: over $t0 thread(s) at the same N"
echo
echo "| model | N | threads | loom t/s | llama.cpp t/s | ratio | loom x N=1 | llama.cpp x N=1 | loom x t$t0 | llama.cpp x t$t0 |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for m in $MODELS; do
	for n in $NPL; do
		for t in $THREADS; do
			# shellcheck disable=SC2086
			l=$(median ${R[$m,$n,$t,l]}); c=$(median ${R[$m,$n,$t,c]})
			# shellcheck disable=SC2086
			l1=$(median ${R[$m,1,$t,l]}); c1=$(median ${R[$m,1,$t,c]})
			# shellcheck disable=SC2086
			lb=$(median ${R[$m,$n,$t0,l]}); cb=$(median ${R[$m,$n,$t0,c]})
			awk -v m="$(basename "$m" .gguf)" -v n="$n" -v t="$t" -v l="$l" -v c="$c" -v l1="$l1" \
				-v c1="$c1" -v lb="$lb" -v cb="$cb" 'BEGIN {
				printf "| %s | %s | %s | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
					m, n, t, l, c, l / c, l / l1, c / c1, l / lb, c / cb }'
		done
	done
done
