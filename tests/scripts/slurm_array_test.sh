#!/usr/bin/env bash
# slurm_array_test.sh - scripts/slurm on a real Slurm: a single-node cluster (munged, slurmctld, slurmd on
# localhost, 2 CPUs) started here, a 2-task array of short (ctest: 15 s) attn-fuzz campaigns over the planted plug-in syncing
# through one directory, then the merge as a dependent job (scripts/slurm/submit.sh).
#
# usage: slurm_array_test.sh ATTN_FUZZ PLANTED_PLUGIN [SECONDS]
# Asserts: both tasks ran (each campaign's report), corpus entries crossed (each campaign imported entries
# of the other and its workers ran some), and the merged summary lists each distinct failure once.
# Exit 77 (ctest SKIP) only where Slurm cannot start: not root, slurm-wlm / munge not installed, or the
# daemons do not come up (their logs are printed). Every daemon started here is stopped on any exit.
set -uo pipefail
ATTN_FUZZ=${1:?usage: slurm_array_test.sh ATTN_FUZZ PLANTED_PLUGIN [SECONDS]}
PLUGIN=${2:?usage: slurm_array_test.sh ATTN_FUZZ PLANTED_PLUGIN [SECONDS]}
SECS=${3:-30}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || skip "a single-node Slurm needs root (slurmd runs jobs as their user)"
for b in munged slurmctld slurmd sbatch squeue scontrol; do
  command -v "$b" >/dev/null || skip "$b not found: apt-get install slurm-wlm munge (scripts/install-deps.sh)"
done

T=$(mktemp -d /tmp/attnfuzz-slurm.XXXXXX)  # short: the munge socket path must fit in sun_path
chmod 755 "$T"
pids=()
cleanup() {
  local rc=$?
  if [ -f "$T/slurm.conf" ] && [ ${#pids[@]} -gt 1 ]; then
    SLURM_CONF=$T/slurm.conf timeout 10 scancel --quiet --user=root 2>/dev/null
    for _ in $(seq 20); do
      [ -z "$(SLURM_CONF=$T/slurm.conf timeout 5 squeue -h 2>/dev/null)" ] && break
      sleep 0.5
    done
    SLURM_CONF=$T/slurm.conf timeout 10 scontrol shutdown >/dev/null 2>&1
  fi
  # The daemons this test started, by pid (slurmd, slurmctld, munged), then whatever job step is left.
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for _ in $(seq 20); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive -eq 0 ] && break
    sleep 0.25
  done
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  # Whatever else this cluster started (job steps, their jobs): processes whose environment names this
  # cluster's slurm.conf (inherited from the daemons started below), never this shell.
  unset SLURM_CONF
  for e in $(grep -lsF "SLURM_CONF=$T/slurm.conf" /proc/[0-9]*/environ 2>/dev/null); do
    p=${e#/proc/}; p=${p%/environ}
    [ "$p" != $$ ] && kill -9 "$p" 2>/dev/null
  done
  [ "${KEEP:-0}" = 1 ] && echo "kept $T" || rm -rf "$T"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
CTLD_PORT=$(free_port); SLURMD_PORT=$(free_port)

# munge: its own key and socket (the system's munged, if any, is left alone).
dd if=/dev/urandom of="$T/munge.key" bs=1024 count=1 status=none && chmod 400 "$T/munge.key"
munged --force --key-file="$T/munge.key" --socket="$T/munge.sock" --pid-file="$T/munged.pid" \
  --log-file="$T/munged.log" --seed-file="$T/munge.seed" || skip "munged does not start: $(tail -3 "$T/munged.log" 2>/dev/null)"
for _ in $(seq 20); do [ -s "$T/munged.pid" ] && break; sleep 0.1; done
pids+=("$(cat "$T/munged.pid")")

mkdir -p "$T/state" "$T/spool" "$T/run"
cat > "$T/slurm.conf" <<CONF
ClusterName=attnfuzz-test
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$T/munge.sock
CredType=cred/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$T/slurm.conf
slurmctld -D -i -f "$SLURM_CONF" >"$T/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N localhost -f "$SLURM_CONF" >"$T/slurmd.out" 2>&1 &
pids+=($!)
up=0
for _ in $(seq 60); do
  sinfo -h -o %T 2>/dev/null | grep -Eq '^(idle|mixed|allocated)' && { up=1; break; }
  sleep 0.5
done
if [ $up -eq 0 ]; then
  tail -5 "$T/slurmctld.log" "$T/slurmd.log" "$T/slurmctld.out" "$T/slurmd.out" 2>/dev/null
  skip "the single-node Slurm did not come up in 30 s (logs above)"
fi
echo "slurm: $(sinfo -h -o '%P %T %c CPUs')"

# The array (2 campaigns, 1 CPU and 1 worker each, sync every 5 s) and the dependent merge.
RUN=$T/run
ATTNFUZZ_BIN=$ATTN_FUZZ ATTNFUZZ_SYNC_INTERVAL=5 "$SRC/scripts/slurm/submit.sh" -n 2 -t "$SECS" "$RUN" \
  --plugin "$PLUGIN" --kernel 'planted-*' --no-seeds --progress 10 --timeout 5 || fail "submit.sh failed"
for _ in $(seq $((SECS * 2 + 90))); do
  [ -z "$(squeue -h 2>/dev/null)" ] && break
  sleep 1
done
[ -z "$(squeue -h)" ] || { squeue; fail "jobs still queued or running $((SECS * 2 + 90)) s after submission"; }
for f in "$RUN"/attn-fuzz-*.out; do echo "== $f"; tail -25 "$f"; done

py() { /usr/bin/python3 - "$RUN" "$@"; }
py <<'PY' || fail "assertions above"
import json, os, sys, glob
run = sys.argv[1]
ok = True
def check(cond, what):
    global ok
    print(("ok   " if cond else "FAIL ") + what)
    ok = ok and cond
camps = {}
for t in ("task-0", "task-1"):
    p = os.path.join(run, t, "report.json")
    check(os.path.exists(p), f"{t} ran and wrote its summary")
    if os.path.exists(p):
        camps[t] = json.load(open(p))["campaign"]
        check(camps[t]["cases"] > 0, f"{t} checked {camps[t]['cases']} case(s)")
        check(camps[t]["name"] == t, f"{t} is named {camps[t]['name']}")
for a, b in (("task-0", "task-1"), ("task-1", "task-0")):
    if a in camps and b in camps:
        s = camps[a]["sync"]
        n = s["imported_corpus"].get(b, 0)
        check(s["published_corpus"] > 0, f"{a} published {s['published_corpus']} corpus entries")
        check(n > 0, f"{a} imported {n} corpus entries from {b}")
        # the imported entries are in a's corpus and are files b published
        mine = set(os.listdir(os.path.join(run, a, "fuzz-corpus")))
        theirs = set(os.listdir(os.path.join(run, "sync", b, "corpus")))
        check(len(mine & theirs) > 0, f"{len(mine & theirs)} of {b}'s published entries are in {a}'s corpus")
check(sum(c["sync"]["imported_inputs_run"] for c in camps.values()) > 0,
      "the workers ran imported entries: " + ", ".join(f"{k} {c['sync']['imported_inputs_run']}" for k, c in camps.items()))
# distinct failures over both campaigns: own failures and imported ones, by (kernel, class, signature)
keys = set()
for t in camps:
    for f in glob.glob(os.path.join(run, t, "failures", "*.json")) + glob.glob(os.path.join(run, t, "imported", "*", "*.json")):
        r = json.load(open(f))["results"][0]
        keys.add((r["kernel"], r["class"]))
mp = os.path.join(run, "merged", "report.json")
check(os.path.exists(mp), "the merge job wrote merged/report.json")
if os.path.exists(mp):
    m = json.load(open(mp))
    fl = m["merge"]["failures"]
    trip = [(f["kernel"], f["class"], f["signature"]) for f in fl]
    check(len(fl) > 0, f"the merged summary lists {len(fl)} distinct failure(s)")
    check(len(trip) == len(set(trip)), "each (kernel, class, signature) once in the merged summary")
    check(len(m["results"]) == len(fl), "report results = distinct failures")
    check({(k, c) for k, c, _ in trip} == keys, "the merged failures are exactly the campaigns' (kernel, class) set")
    check(sorted(c["name"] for c in m["merge"]["campaigns"]) == ["task-0", "task-1"], "per-campaign statistics of both")
    for f in fl:
        check(f["first_found_by"] in ("task-0", "task-1") and f["found_at"], f"{f['class']} {f['kernel']}: first found by {f['first_found_by']} at {f['found_at']}")
    junit = open(os.path.join(run, "merged", "junit.xml")).read()
    check(junit.count("<failure") == len(fl), "junit.xml has one <failure> per distinct failure")
    md = open(os.path.join(run, "merged", "summary.md")).read()
    check(all(f"| {f['first_found_by']} |" in md for f in fl), "summary.md names who found each failure first")
sys.exit(0 if ok else 1)
PY
echo "PASS"
