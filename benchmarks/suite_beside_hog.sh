#!/usr/bin/env bash
# `make test` on a fresh clone with one CPU hog beside it (issue 48): the result, the wall time and the CPU the
# hog got, appended to LOG. Run alone on the machine (anything else running is a second hog).
#   benchmarks/suite_beside_hog.sh [REPO (default: this checkout)] [LOG (default: /tmp/suite-beside-hog.log)]
set -u
REPO=${1:-$(cd "$(dirname "$0")/.." && pwd)}
LOG=${2:-/tmp/suite-beside-hog.log}
DIR=$(mktemp -d /tmp/suite-beside-hog.XXXXXX)
git clone -q "$REPO" "$DIR/clone" && cd "$DIR/clone" || exit 2
echo "commit $(git rev-parse --short HEAD) start $(date -u +%FT%TZ) cpu $(lscpu | sed -n 's/^Model name: *//p')" >> "$LOG"
python3 -c 'while True: pass' & HOG=$!
START=$(date +%s)
./.ci/run > "$DIR/ci.log" 2>&1; RC=$?
END=$(date +%s)
HOG_S=$(( $(awk '{print $14 + $15}' /proc/$HOG/stat) / $(getconf CLK_TCK) ))
kill $HOG
grep -E "[0-9]+ passed|^FAILED|^ERROR" "$DIR/ci.log" >> "$LOG"
echo "rc=$RC wall_s=$((END - START)) hog_cpu_s=$HOG_S hog_cores=$(awk -v h=$HOG_S -v w=$((END - START)) 'BEGIN{printf "%.2f", h/w}') full log: $DIR/ci.log" >> "$LOG"
