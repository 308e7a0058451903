#!/usr/bin/env bash
# test_times_test.sh - scripts/test_times.sh on a made-up ctest log: the slowest test first, times summed per
# executable, an old run beside a new one (--compare), and a bad option or a missing log gives one line and exit 2.
# Usage: test_times_test.sh SCRIPT WORKDIR
set -u
script=$1 work=$2
rm -rf "$work" && mkdir -p "$work/Testing/Temporary"
cat >"$work/Testing/Temporary/LastTest.log" <<'LOG'
1/3 Testing: A.Fast
1/3 Test: A.Fast
Command: "/x/tests/a_test" "--gtest_filter=A.Fast"
Test time =   0.50 sec
2/3 Testing: A.Slow
2/3 Test: A.Slow
Command: "/x/tests/a_test" "--gtest_filter=A.Slow"
Test time =  12.25 sec
3/3 Testing: tools/script
3/3 Test: tools/script
Command: "/usr/bin/bash" "/x/script.sh"
Test time =   3.00 sec
LOG
out=$(bash "$script" --build "$work" --top 2) || { echo "exit status $? on a good log"; exit 1; }
echo "$out"
grep -q "tests=3 summed_test_s=15.8" <<<"$out" || { echo "wrong count or sum"; exit 1; }
[ "$(grep -A1 'slowest tests' <<<"$out" | tail -1 | awk '{print $3}')" = A.Slow ] || { echo "A.Slow is not first"; exit 1; }
grep -q "12.75 s     2 tests  a_test" <<<"$out" || { echo "a_test's two tests not summed"; exit 1; }
grep -q "A.Fast" <<<"$out" && { echo "--top 2 printed a third test"; exit 1; }
# --compare: an old log where A.Slow took 24.5 s and tools/script did not run.
mkdir -p "$work/old/Testing/Temporary"
grep -v -e "tools/script" -e "script.sh" -e "3.00 sec" "$work/Testing/Temporary/LastTest.log" |
  sed 's/12.25 sec/24.50 sec/' >"$work/old/Testing/Temporary/LastTest.log"
cmp=$(bash "$script" --build "$work" --compare "$work/old" --top 3) || { echo "exit status $? with --compare"; exit 1; }
echo "$cmp"
grep -q "24.50     12.25    0.50  A.Slow" <<<"$cmp" || { echo "A.Slow's old and new times not side by side"; exit 1; }
grep -q "nan      3.00       -  tools/script" <<<"$cmp" || { echo "a test only in the new run not shown as such"; exit 1; }
grep -q "summed test time: old 25.0 s (2 tests), new 15.8 s (3 tests), new/old 0.63" <<<"$cmp" ||
  { echo "wrong totals"; exit 1; }
bash "$script" --build "$work" --compare "$work/none" >/dev/null 2>&1; [ $? -eq 2 ] || { echo "a missing old log does not exit 2"; exit 1; }
bash "$script" --bogus >/dev/null 2>&1; [ $? -eq 2 ] || { echo "a bad option does not exit 2"; exit 1; }
bash "$script" --build "$work/none" >/dev/null 2>&1; [ $? -eq 2 ] || { echo "a missing log does not exit 2"; exit 1; }
echo ok
