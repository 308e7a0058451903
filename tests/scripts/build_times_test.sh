#!/usr/bin/env bash
# build_times_test.sh - scripts/build_times.sh on a made-up .ninja_log: the slowest step first, a rebuilt output
# counted once (its last build), compile time summed per target, and a bad option or a missing log gives one line
# and exit 2; scripts/time_step.sh logs a step's CPU time and exit status, and --cpu sums that log.
# Usage: build_times_test.sh SCRIPT WORKDIR
set -u
script=$1 work=$2
stepper=$(dirname "$script")/time_step.sh
rm -rf "$work" && mkdir -p "$work"
printf '# ninja log v5\n' >"$work/.ninja_log"
printf '%s\t%s\t%s\t%s\t%s\n' \
  0 9000 1 core/CMakeFiles/attnfuzz_core.dir/case.cpp.o h1 \
  0 2000 1 core/CMakeFiles/attnfuzz_core.dir/corpus.cpp.o h2 \
  2000 3500 1 core/CMakeFiles/attnfuzz_core.dir/corpus.cpp.o h2 \
  9000 9500 1 core/libattnfuzz_core.a h3 \
  3500 8000 1 tests/CMakeFiles/a_test.dir/a_test.cpp.o h4 \
  9500 10000 1 tests/a_test h5 \
  9500 10000 1 tests/a_test.extra h5 >>"$work/.ninja_log"
out=$(bash "$script" --build "$work" --top 2) || { echo "exit status $? on a good log"; exit 1; }
echo "$out"
grep -q "steps=5 summed_step_s=16.0 wall_s=10.0" <<<"$out" || { echo "wrong count, sum or wall"; exit 1; }
grep -q "compile=15.0 link=1.0" <<<"$out" || { echo "compile and link not told apart"; exit 1; }
[ "$(grep -A1 'slowest steps' <<<"$out" | tail -1 | awk '{print $4}')" = core/CMakeFiles/attnfuzz_core.dir/case.cpp.o ] ||
  { echo "case.cpp.o is not first"; exit 1; }
grep -q "10.50 s     2 files  attnfuzz_core" <<<"$out" || { echo "attnfuzz_core's two files not summed (rebuild once)"; exit 1; }
bash "$script" --bogus >/dev/null 2>&1; [ $? -eq 2 ] || { echo "a bad option does not exit 2"; exit 1; }
bash "$script" --build "$work/none" >/dev/null 2>&1; [ $? -eq 2 ] || { echo "a missing log does not exit 2"; exit 1; }
# time_step.sh: the step runs, its status is kept, and one line names its -o output; unset log: just the step.
ATTNFUZZ_TIME_LOG=$work/cpu.log bash "$stepper" bash -c 'for ((i = 0; i < 200000; i++)); do :; done' -o x/burn.o ||
  { echo "time_step.sh failed a good step"; exit 1; }
ATTNFUZZ_TIME_LOG=$work/cpu.log bash "$stepper" false -o x/fails.o; [ $? -eq 1 ] || { echo "time_step.sh lost a step's status"; exit 1; }
bash "$stepper" true -o x/untimed.o || { echo "time_step.sh without a log failed"; exit 1; }
[ "$(wc -l <"$work/cpu.log")" -eq 2 ] && grep -qP '^[0-9.]+ [0-9.]+\tx/burn.o$' "$work/cpu.log" ||
  { echo "time_step.sh's log is wrong:"; cat "$work/cpu.log"; exit 1; }
printf '1.50 0.50\tcore/CMakeFiles/attnfuzz_core.dir/case.cpp.o\n9.00 1.00\tcore/CMakeFiles/attnfuzz_core.dir/corpus.cpp.o\n' \
  >"$work/made.log"
printf '3.00 1.00\tcore/CMakeFiles/attnfuzz_core.dir/corpus.cpp.o\n0.25 0.25\tbin/attn-check\n' >>"$work/made.log"
out=$(bash "$script" --cpu "$work/made.log" --top 3) || { echo "exit status $? on a good CPU log"; exit 1; }
echo "$out"
grep -q "steps=3 summed_cpu_s=6.5 .* compile=6.0 link=0.5" <<<"$out" || { echo "wrong CPU sum (a rebuilt step counts once)"; exit 1; }
grep -q "6.00 s     2 files  attnfuzz_core" <<<"$out" || { echo "attnfuzz_core's CPU time not summed per target"; exit 1; }
bash "$script" --cpu "$work/cpu.log.none" >/dev/null 2>&1; [ $? -eq 2 ] || { echo "a missing CPU log does not exit 2"; exit 1; }
echo ok
