#!/usr/bin/env bash
# Builds the streaming-read probe (bench/streamread.c) into DIR if it is
# missing or older than its source, and prints its path.
#
#   bench/streamread.sh DIR     then: "$(bench/streamread.sh DIR)" THREADS
#
# Streaming read of a 1 GiB buffer (64-byte vector loads, -march=native,
# software prefetch 8.5 KiB ahead as cpu.so's GEMVs do), the
# threads each summing their own part of every 64 MiB chunk, barriers around
# each chunk (timed from before the first to after the second, so a thread
# that starts early cannot flatter it). Six passes over the buffer, the first
# (after the pages are faulted in) not counted. Prints the best 64 MiB chunk
# and the best whole pass, in GB/s (1e9 bytes). The best chunk is the figure
# used: on a shared machine a whole pass (~40 ms) rarely runs without being
# descheduled, a chunk (~2 ms) often does, and each chunk is read once per
# 1 GiB pass, so it is still a stream from memory, not from cache.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: bench/streamread.sh DIR}
bin=$dir/streamread
if [ ! -x "$bin" ] || [ "$bin" -ot bench/streamread.c ]; then
	mkdir -p "$dir"
	cc -O2 -march=native -pthread -o "$bin.tmp" bench/streamread.c >&2
	mv "$bin.tmp" "$bin"
fi
echo "$bin"
