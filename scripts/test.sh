#!/usr/bin/env bash
# Sets everything up, test-only packages included (scripts/setup.sh --test),
# and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
set +e
meson test -C build --print-errorlogs --num-processes 2 --timeout-multiplier 3
rc=$?
set -e
# A plain summary line for readers that do not parse meson's output.
log=build/meson-logs/testlog.json
if [ -f "$log" ]; then
	python3 - "$log" <<'PY'
import json, sys
res = [json.loads(l)["result"] for l in open(sys.argv[1]) if l.strip()]
ok = sum(r in ("OK", "EXPECTEDFAIL") for r in res)
skip = sum(r == "SKIP" for r in res)
print(f"{ok} passed, {len(res) - ok - skip} failed, {skip} skipped")
PY
fi
exit $rc
