#!/usr/bin/env bash
# Mixture-of-experts files against the llama.cpp anchor (issue 34). Builds
# nothing: it runs only when the anchor's llama-simple and llama-bench are
# already cached (`. bench/anchor.sh; anchor_build llama-simple
# llama-bench` builds them), and otherwise says so and exits 77.
#
#   1. Greedy text: random Mixtral (llama + llama.expert_count), Qwen3-MoE,
#      Qwen2-MoE and gpt-oss files from tools/mkgguf.py (f16 weights), the
#      same prompt through `loom run --exact --temp 0` and llama.cpp's
#      `llama-simple` (greedy; it echoes the prompt, which is cut off
#      first): the generated texts must be equal. (This llama.cpp's
#      llama-cli is chat-only, and llama-completion prints through an
#      asynchronous log that loses a random tail of the text at exit:
#      its common/log.cpp says so.) Both decode
#      the same vocabulary, so equal text is equal tokens up to a token
#      boundary that spells the same bytes.
#   2. Speed: `loom bench` and `llama-bench` on MODEL (by default the
#      Qwen3-30B-A3B-shaped file of docs/BENCHMARKS.md, "Mixture of
#      experts"), -p PP -n TG -r REPS at each of THREADS, one after the
#      other; the tables as the tools print them.
#
# Environment: LOOM (./build/tools/loom), MODEL, THREADS ("1 2"), PP (64),
# TG (32), REPS (3), N_GEN (16), LOOM_CACHE / CACHE (bench/anchor.sh).
#
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "moe_vs_llamacpp: error: $*" >&2; exit 1; }
log() { echo "moe_vs_llamacpp: $*" >&2; }

. bench/anchor.sh
LOOM=${LOOM:-./build/tools/loom}
MODEL=${MODEL:-/tmp/h34bench/q3moe-8L.gguf}
THREADS=${THREADS:-1 2}
PP=${PP:-64}
TG=${TG:-32}
REPS=${REPS:-3}
N_GEN=${N_GEN:-16}
PROMPT="the quick brown fox jumps over the lazy dog"

if ! anchor_have llama-simple llama-bench; then
	echo "SKIP: llama.cpp $ANCHOR_VERSION's llama-simple and llama-bench are not in $ANCHOR_BIN (anchor_build in bench/anchor.sh builds them; this script never does)"
	exit 77
fi
[ -x "$LOOM" ] || die "no loom binary at $LOOM (ninja -C build)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
small=(--layers 2 --heads 4 --kv-heads 2 --embd 64 --vocab 300 --ctx 256 --type f16 -q)
bad=0
# Bytes that are not UTF-8 as U+FFFD: loom ends a text whose last token
# leaves a character unfinished with U+FFFD, llama.cpp with the raw bytes.
as_utf8() { python3 -c 'import sys; sys.stdout.write(sys.stdin.buffer.read().decode("utf-8", "replace"))'; }
for fam in mixtral qwen3moe qwen2moe gpt-oss; do
	f=$tmp/$fam.gguf
	case $fam in
	mixtral) sizes=(--ff 64) ;;
	gpt-oss) sizes=(--ff 128 --expert-ff 64) ;;
	*) sizes=(--ff 128 --expert-ff 64 --shared-ff 96) ;;
	esac
	python3 tools/mkgguf.py "$f" --arch "$fam" "${sizes[@]}" --experts 8 --experts-used 2 \
		"${small[@]}"
	ours=$("$LOOM" run --model "$f" -p "$PROMPT" -n "$N_GEN" --temp 0 --exact \
		--no-progress 2>/dev/null | as_utf8)
	theirs=$("$ANCHOR_BIN/llama-simple" -m "$f" -n "$N_GEN" "$PROMPT" 2>/dev/null | as_utf8)
	theirs=${theirs#*"$PROMPT"} # the echoed prompt (after its BOS text)
	if [ "$ours" = "$theirs" ]; then
		log "$fam: greedy text equal ($N_GEN tokens)"
	else
		log "$fam: greedy text differs: loom $(printf %q "$ours") llama.cpp $(printf %q "$theirs")"
		bad=1
	fi
done

if [ -s "$MODEL" ]; then
	for t in $THREADS; do
		"$LOOM" bench --model "$MODEL" -p "$PP" -n "$TG" -t "$t" -r "$REPS"
		"$ANCHOR_BIN/llama-bench" -m "$MODEL" -p "$PP" -n "$TG" -t "$t" -r "$REPS"
	done
else
	log "no $MODEL: speed comparison skipped (docs/BENCHMARKS.md says how to make it)"
fi
exit $bad
