#!/usr/bin/env bash
# test_times.sh - where `ctest --preset default` spends its time: the slowest tests and the time per test executable,
# read from the last ctest run's log (or from a fresh run with --run), against the budget in README.md.
#   scripts/test_times.sh [--run] [--build DIR] [--top N]
set -euo pipefail
build=build top=15 run=0
while [ $# -gt 0 ]; do
  case "$1" in
    --run) run=1; shift ;;
    --build) [ $# -ge 2 ] || { echo "test_times.sh: --build needs a directory" >&2; exit 2; }; build=$2; shift 2 ;;
    --top) [[ $# -ge 2 && $2 =~ ^[0-9]+$ ]] || { echo "test_times.sh: --top needs a count" >&2; exit 2; }; top=$2; shift 2 ;;
    *) echo "test_times.sh: unknown option $1 (usage: scripts/test_times.sh [--run] [--build DIR] [--top N])" >&2; exit 2 ;;
  esac
done
log=$build/Testing/Temporary/LastTest.log
if [ "$run" = 1 ]; then
  start=$(date +%s)
  ctest --test-dir "$build" -j 2 --timeout 900 >/dev/null || true  # failures are listed by ctest's own log
  echo "ctest -j 2 wall: $(( $(date +%s) - start )) s"
fi
[ -f "$log" ] || { echo "test_times.sh: no $log (run ctest first, or pass --run)" >&2; exit 2; }
python3 - "$log" "$top" <<'EOF'
import re, sys, os, collections, signal
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # | head is fine
log, top = sys.argv[1], int(sys.argv[2])
tests, name, exe = [], None, None
for line in open(log, errors="replace"):
    m = re.match(r"\d+/\d+ Test: (.+)$", line)
    if m: name, exe = m.group(1).strip(), None
    if line.startswith("Command: ") and name:  # the executable; for a script run by an interpreter, the script
        args = [os.path.basename(x) for x in re.findall(r'"([^"]*)"', line)]
        exe = args[1] if len(args) > 1 and args[0] in ("bash", "sh", "python3", "python", "env") else (args or ["?"])[0]
    m = re.match(r"Test time =\s*([0-9.]+) sec", line)
    if m and name:
        tests.append((float(m.group(1)), name, exe or "?"))
        name = None
if not tests: sys.exit("test_times.sh: no test times in " + log)
total = sum(t for t, _, _ in tests)
print(f"tests={len(tests)} summed_test_s={total:.1f} (wall with -j 2 is about half, plus the slowest chain)")
print(f"\n{top} slowest tests:")
for t, n, e in sorted(tests, reverse=True)[:top]:
    print(f"  {t:8.2f} s  {n}  [{e}]")
per = collections.defaultdict(lambda: [0.0, 0])
for t, _, e in tests:
    per[e][0] += t; per[e][1] += 1
print(f"\n{top} slowest executables (sum of their tests):")
for e, (t, n) in sorted(per.items(), key=lambda kv: -kv[1][0])[:top]:
    print(f"  {t:8.2f} s  {n:4d} tests  {e}")
EOF
