#!/usr/bin/env bash
# test_times.sh - where `ctest --preset default` spends its time: the slowest tests and the time per test executable,
# read from the last ctest run's log (or from a fresh run with --run), against the budget in README.md. With
# --compare OLD_BUILD: the same tables for OLD_BUILD's last run beside this one (scripts/compare_test_times.sh).
#   scripts/test_times.sh [--run] [--build DIR] [--top N] [--compare OLD_BUILD]
set -euo pipefail
build=build top=15 run=0 old=
while [ $# -gt 0 ]; do
  case "$1" in
    --run) run=1; shift ;;
    --build) [ $# -ge 2 ] || { echo "test_times.sh: --build needs a directory" >&2; exit 2; }; build=$2; shift 2 ;;
    --top) [[ $# -ge 2 && $2 =~ ^[0-9]+$ ]] || { echo "test_times.sh: --top needs a count" >&2; exit 2; }; top=$2; shift 2 ;;
    --compare) [ $# -ge 2 ] || { echo "test_times.sh: --compare needs a build directory" >&2; exit 2; }; old=$2; shift 2 ;;
    *) echo "test_times.sh: unknown option $1 (usage: scripts/test_times.sh [--run] [--build DIR] [--top N] [--compare OLD_BUILD])" >&2; exit 2 ;;
  esac
done
log=$build/Testing/Temporary/LastTest.log
if [ "$run" = 1 ]; then
  start=$(date +%s)
  ctest --test-dir "$build" -j 2 --timeout 900 >/dev/null || true  # failures are listed by ctest's own log
  echo "ctest -j 2 wall: $(( $(date +%s) - start )) s"
fi
[ -f "$log" ] || { echo "test_times.sh: no $log (run ctest first, or pass --run)" >&2; exit 2; }
oldlog=
if [ -n "$old" ]; then
  oldlog=$old/Testing/Temporary/LastTest.log
  [ -f "$oldlog" ] || { echo "test_times.sh: no $oldlog (run ctest in $old first)" >&2; exit 2; }
fi
python3 - "$log" "$top" "$oldlog" <<'EOF'
import re, sys, os, collections, signal
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # | head is fine
log, top, oldlog = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def read(log):  # [(seconds, test, executable)] of one ctest log
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
    return tests

def per_exe(tests):
    per = collections.defaultdict(lambda: [0.0, 0])
    for t, _, e in tests:
        per[e][0] += t; per[e][1] += 1
    return per

tests = read(log)
if oldlog:  # old and new side by side, the biggest either way first
    old = read(oldlog)
    for title, a, b in (("tests", {n: t for t, n, _ in old}, {n: t for t, n, _ in tests}),
                        ("executables (sum of their tests)", {e: v[0] for e, v in per_exe(old).items()},
                         {e: v[0] for e, v in per_exe(tests).items()})):
        print(f"{top} slowest {title}: old s, new s, new/old")
        for k in sorted(set(a) | set(b), key=lambda k: -max(a.get(k, 0), b.get(k, 0)))[:top]:
            o, n = a.get(k), b.get(k)
            ratio = f"{n / o:6.2f}" if o and n is not None else "     -"
            print(f"  {o if o is not None else float('nan'):8.2f}  {n if n is not None else float('nan'):8.2f}  {ratio}  {k}")
        print()
    so, sn = sum(t for t, _, _ in old), sum(t for t, _, _ in tests)
    print(f"summed test time: old {so:.1f} s ({len(old)} tests), new {sn:.1f} s ({len(tests)} tests), new/old {sn / so:.2f}")
    sys.exit(0)
total = sum(t for t, _, _ in tests)
print(f"tests={len(tests)} summed_test_s={total:.1f} (wall with -j 2 is about half, plus the slowest chain)")
print(f"\n{top} slowest tests:")
for t, n, e in sorted(tests, reverse=True)[:top]:
    print(f"  {t:8.2f} s  {n}  [{e}]")
per = per_exe(tests)
print(f"\n{top} slowest executables (sum of their tests):")
for e, (t, n) in sorted(per.items(), key=lambda kv: -kv[1][0])[:top]:
    print(f"  {t:8.2f} s  {n:4d} tests  {e}")
EOF
