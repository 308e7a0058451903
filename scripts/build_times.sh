#!/usr/bin/env bash
# build_times.sh - where a build spends its time: the slowest translation units and links, and the compile time per
# target, read from ninja's log (BUILD/.ninja_log) of the last build of each output (issue 32 item 3); with --cpu LOG,
# from the CPU seconds (user + system) scripts/time_step.sh logged per step instead: wall times on a shared machine
# swell with its load, CPU times hardly do.
#   scripts/build_times.sh [--build DIR | --cpu LOG] [--top N]
# Build from clean first for a whole table (rm -rf build; cmake --preset default; cmake --build build -j2); with
# ccache, cache hits show as fast compiles (CCACHE_DISABLE=1 measures the compiler). CPU times, into a fresh DIR:
#   cmake --preset default -B DIR -DCMAKE_{C,CXX}_COMPILER_LAUNCHER=$PWD/scripts/time_step.sh \
#     -DCMAKE_{C,CXX}_LINKER_LAUNCHER=$PWD/scripts/time_step.sh   (gpu-compile: also CMAKE_{CUDA,HIP}_COMPILER_LAUNCHER)
#   ATTNFUZZ_TIME_LOG=$PWD/cpu.log cmake --build DIR -j2; scripts/build_times.sh --cpu cpu.log
set -euo pipefail
build=build top=20 cpu=
while [ $# -gt 0 ]; do
  case "$1" in
    --build) [ $# -ge 2 ] || { echo "build_times.sh: --build needs a directory" >&2; exit 2; }; build=$2; shift 2 ;;
    --cpu) [ $# -ge 2 ] || { echo "build_times.sh: --cpu needs a log written by scripts/time_step.sh" >&2; exit 2; }; cpu=$2; shift 2 ;;
    --top) [[ $# -ge 2 && $2 =~ ^[0-9]+$ ]] || { echo "build_times.sh: --top needs a count" >&2; exit 2; }; top=$2; shift 2 ;;
    *) echo "build_times.sh: unknown option $1 (usage: scripts/build_times.sh [--build DIR | --cpu LOG] [--top N])" >&2; exit 2 ;;
  esac
done
log=$build/.ninja_log
[ -n "$cpu" ] && log=$cpu
[ -f "$log" ] || { echo "build_times.sh: no $log (build with ninja first: cmake --preset default)" >&2; exit 2; }
python3 - "$log" "$top" "$cpu" <<'EOF'
import collections, re, signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # | head is fine
log, top, cpu = sys.argv[1], int(sys.argv[2]), sys.argv[3]
kind = lambda o: "compile" if o.endswith((".o", ".obj")) else "link" if re.search(r"(\.so|\.a)$|/bin/|^bin/|tests/[^/.]+$", o) else "other"

def ninja_steps(log):  # [(ms, output)] of the last build of each step, and the wall span in s
    last = {}  # output -> (start ms, end ms, command hash): a rebuilt output's last line wins
    for line in open(log, errors="replace"):
        if line.startswith("#"):
            continue
        f = line.rstrip("\n").split("\t")
        if len(f) < 4 or not f[0].isdigit() or not f[1].isdigit():
            continue
        last[f[3]] = (int(f[0]), int(f[1]), f[4] if len(f) > 4 else f[3])
    edges = {}  # one build step may write several outputs (same start, end and command): counted once
    for out, (start, end, h) in last.items():
        edges.setdefault((start, end, h), out)
    if not edges:
        sys.exit("build_times.sh: no build steps in " + log)
    span = (max(e for (_, e, _) in edges) - min(s for (s, _, _) in edges)) / 1000
    return [(end - start, out) for (start, end, _), out in edges.items()], span

def cpu_steps(log):  # [(ms, output)] from time_step.sh's "user system<TAB>output" lines; a rebuilt output's last wins
    last = {}
    for line in open(log, errors="replace"):
        m = re.match(r"([0-9.]+) ([0-9.]+)\t(.+)$", line.rstrip("\n"))
        if m:
            last[m.group(3)] = round((float(m.group(1)) + float(m.group(2))) * 1000)
    if not last:
        sys.exit("build_times.sh: no timed steps in " + log + " (lines of 'user system<TAB>output')")
    return [(ms, out) for out, ms in last.items()]

if cpu:
    steps = cpu_steps(log)
    head = f"steps={len(steps)} summed_cpu_s={sum(d for d, _ in steps) / 1000:.1f} (user + system, from {log})"
else:
    steps, span = ninja_steps(log)
    head = f"steps={len(steps)} summed_step_s={sum(d for d, _ in steps) / 1000:.1f} wall_s={span:.1f} (first start to last end)"
by_kind = collections.Counter()
for d, o in steps:
    by_kind[kind(o)] += d / 1000
print(head + " " + " ".join(f"{k}={v:.1f}" for k, v in sorted(by_kind.items())))
print(f"\n{top} slowest steps:")
for d, o in sorted(steps, reverse=True)[:top]:
    print(f"  {d / 1000:8.2f} s  {kind(o):7s}  {o}")
per = collections.defaultdict(lambda: [0.0, 0])
for d, o in steps:
    m = re.search(r"CMakeFiles/([^/]+)\.dir/", o)
    if m:
        per[m.group(1)][0] += d / 1000
        per[m.group(1)][1] += 1
print(f"\n{top} targets with the most compile time (sum of their translation units):")
for t, (s, n) in sorted(per.items(), key=lambda kv: -kv[1][0])[:top]:
    print(f"  {s:8.2f} s  {n:4d} files  {t}")
EOF
