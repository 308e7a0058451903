#!/usr/bin/env bash
# misbehaving_campaign.sh - benchmark: does a campaign keep its pace, its deadline and name every misbehaving kernel?
#   bench/misbehaving_campaign.sh [SECONDS] [WORKERS]        (default 60 s, nproc/2 workers per campaign)
# Runs two cpu campaigns side by side, at once, same length and workers: "plain" over the built-in kernels,
# "bad" over the built-in kernels plus the misbehaving test plug-in (lib/libattnfuzz_test_misbehaving.so:
# far out-of-bounds writes, a leak, a spin, a segfault, an abort). Prints name=value lines: cases/s of the
# healthy (built-in) kernels in each and their ratio, how long after --max-time each attn-fuzz ended, and for
# each misbehaving kernel what named it (the classes of its saved failures, or "quarantined").
# Exit 1 unless bad/plain >= 0.80, both end within 5 s of --max-time, and every misbehaving kernel is named.
# The issue-12 acceptance run (16 cores: two campaigns of 8 workers, 10 minutes):
#   bench/misbehaving_campaign.sh 600 8
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$here/build}
bin=$build/bin
plugin=${PLUGIN:-$build/lib/libattnfuzz_test_misbehaving.so}
secs=${1:-60}
workers=${2:-$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))}
py=${PYTHON:-/usr/bin/python3}
[ -r "$plugin" ] || { echo "misbehaving_campaign: $plugin missing (build target attnfuzz_test_misbehaving)" >&2; exit 2; }
tmp=${KEEP:-$(mktemp -d)}
[ -n "${KEEP:-}" ] || trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"
rm -rf "$tmp/plain" "$tmp/bad"  # fresh campaigns (KEEP=DIR keeps their OUT directories for a look afterwards)
# The misbehaving kernels: those the plug-in adds to the list.
comm -13 <("$bin/attn-fuzz" --list | awk '{print $1}' | sort) \
         <("$bin/attn-fuzz" --list --plugin "$plugin" | awk '{print $1}' | sort) > "$tmp/bad-kernels"
common=(--backend cpu --max-time "$secs" --workers "$workers")
campaign() {  # campaign NAME [args...]: runs attn-fuzz, writes NAME.secs (wall seconds of the process)
  local name=$1; shift
  local t0; t0=$(date +%s.%N)
  "$bin/attn-fuzz" "${common[@]}" --out "$tmp/$name" "$@" > "$tmp/$name.log" 2>&1
  local rc=$?
  echo "$rc $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')" > "$tmp/$name.secs"
}
campaign plain &
pa=$!
campaign bad --plugin "$plugin" &
pb=$!
wait $pa $pb
"$py" - "$tmp" "$secs" "$workers" <<'PY'
import json, os, sys
tmp, secs, workers = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
bad = [l.strip() for l in open(os.path.join(tmp, "bad-kernels")) if l.strip()]
ok = True
print("seconds=%g workers_per_campaign=%d misbehaving_kernels=%d" % (secs, workers, len(bad)))
rate = {}
for name in ("plain", "bad"):
    rc, wall = open(os.path.join(tmp, name + ".secs")).read().split()
    try:
        rep = json.load(open(os.path.join(tmp, name, "report.json")))
    except (OSError, ValueError) as e:
        print("%s_report=missing (%s; exit %s); log tail:" % (name, e, rc))
        print(open(os.path.join(tmp, name + ".log")).read()[-2000:])
        sys.exit(1)
    c = rep["campaign"]
    healthy = sum(n for k, v in c["per_kernel"].items() if k not in bad
                  for verdict, n in v.items() if verdict not in ("unsupported", "quarantined"))
    rate[name] = healthy / c["wall_s"] if c["wall_s"] > 0 else 0.0
    delay = float(wall) - secs
    print("%s_exit=%s" % (name, rc))
    print("%s_healthy_cases=%d" % (name, healthy))
    print("%s_healthy_cases_per_s=%.1f" % (name, rate[name]))
    print("%s_end_delay_s=%.2f" % (name, delay))
    print("%s_worker_crashes=%d %s_worker_hangs=%d" % (name, c["worker_crashes"], name, c["worker_hangs"]))
    if delay > 5:
        print("FAIL: %s ended %.1f s after --max-time (limit 5 s)" % (name, delay)); ok = False
    if name == "plain" and c["failing_checks"]:
        print("FAIL: the built-in kernels failed %d checks (false positives)" % c["failing_checks"]); ok = False
    if name == "bad":
        classes = {}
        for r in rep.get("results", []):
            if r.get("class"):
                classes.setdefault(r["kernel"], set()).add(r["class"])
        healthy_failed = sorted(k for k in classes if k not in bad)
        if healthy_failed:
            print("FAIL: built-in kernels failed beside the misbehaving ones: %s" % ", ".join(healthy_failed)); ok = False
        for k in bad:
            how = sorted(classes.get(k, ()))
            if k in c.get("quarantined", []):
                how.append("quarantined")
            print("named_%s=%s" % (k, ",".join(how) if how else "NO"))
            if not how:
                print("FAIL: %s was not named" % k); ok = False
# Informative, not a criterion: the pace over the second half of the run, from the progress lines (cases minus
# failing checks: the built-in kernels fail none, the misbehaving ones fail every check), i.e. without the
# start-up (libFuzzer's initial seed merge runs in one process, and a spinning kernel holds it for a timeout).
import re
late = {}
for name in ("plain", "bad"):
    pts = [(float(m.group(1)), int(m.group(2)) - int(m.group(3))) for m in
           re.finditer(r"attn-fuzz \[\s*(\d+)s\] cases (\d+) \(\d+/s\)\s+failing (\d+)", open(os.path.join(tmp, name + ".log")).read())]
    pts = [p for p in pts if secs / 2 <= p[0] <= secs - 3]
    if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
        late[name] = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
        print("%s_healthy_cases_per_s_second_half=%.1f" % (name, late[name]))
if len(late) == 2 and late["plain"]:
    print("healthy_cases_per_s_ratio_second_half=%.3f" % (late["bad"] / late["plain"]))
ratio = rate["bad"] / rate["plain"] if rate["plain"] else float("nan")
print("healthy_cases_per_s_ratio=%.3f" % ratio)
if not ratio >= 0.8:
    print("FAIL: the healthy kernels kept %.0f %% of their pace (need 80 %%)" % (100 * ratio)); ok = False
print("result=%s" % ("pass" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
