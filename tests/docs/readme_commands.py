#!/usr/bin/env python3
"""readme_commands.py - runs every command the README shows (its ```sh blocks) and fails when one exits wrong.

Usage: readme_commands.py BUILD_DIR REPO_ROOT WORKDIR [PYTHON]. PYTHON (a python3 with numpy) is the one the
README's `python3` means (its directory goes first on PATH). Commands run in order from WORKDIR, a scratch copy of the
paths they read (build/ is BUILD_DIR, the rest is REPO_ROOT), so a README example that calls a correct kernel
a failure, or that does not run at all, fails this test. A command naming a planted plug-in must exit 1 (it
finds the planted bug); every other one must exit 0. Left out, each for a reason printed in the log: the
set-up and test commands themselves (scripts/setup.sh is this build, ctest runs this test), commands for a
GPU backend, and the tour's command and output (tests/docs/readme_tour.py checks those). Campaign lengths
(--max-time) are cut to 5 s; nothing else is changed.
"""

import os
import re
import shutil
import subprocess
import sys
import time


def sh_blocks(readme):
    return re.findall(r"```sh\n(.*?)\n```", readme, re.S)


def commands(readme):
    out = []
    for block in sh_blocks(readme):
        for line in block.split("\n"):
            line = re.sub(r"\s+#.*$", "", line).strip()  # trailing comments
            if line and not line.startswith("#"):
                out.append(line)
    return out


def skip_reason(cmd):
    if cmd.startswith("bash scripts/setup.sh"):
        return "the set-up command (this build is its result)"
    if cmd.startswith("ctest"):
        return "the test command (it runs this test)"
    if re.search(r"--backend (nvidia|amd)|--mps\b", cmd):
        return "a GPU backend"
    return None


def main():
    build, root, work = (os.path.abspath(a) for a in sys.argv[1:4])
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    tour = re.search(r"<!-- tour-command -->\s*```sh\n(.*?)\n```", readme, re.S)
    tour_cmd = tour.group(1).strip() if tour else None
    shutil.rmtree(work, ignore_errors=True)  # a fresh scratch copy: an earlier run's reports/ would be resumed
    os.makedirs(work)
    for name in ("python", "examples", "corpus", "kernels", "include", "scripts"):
        link = os.path.join(work, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(root, name), link)
    if not os.path.lexists(os.path.join(work, "build")):
        os.symlink(build, os.path.join(work, "build"))
    env = dict(os.environ)
    if len(sys.argv) > 4 and os.path.isabs(sys.argv[4]):
        env["PATH"] = os.path.dirname(sys.argv[4]) + os.pathsep + env.get("PATH", "")
    failures, ran = [], 0
    for cmd in commands(readme):
        if cmd == tour_cmd or "reports/corpus/" in cmd:
            print(f"skip: {cmd}\n      (the tour: tests/docs/readme_tour.py)")
            continue
        why = skip_reason(cmd)
        if why:
            print(f"skip: {cmd}\n      ({why})")
            continue
        m = re.match(r"export (\w+)=(.*)$", cmd)
        if m:  # PYTHONPATH=$PWD/python: the scratch copy's python/
            env[m.group(1)] = os.path.expandvars(m.group(2).replace("$PWD", work))
            continue
        run = re.sub(r"--max-time \d+", "--max-time 5", cmd)
        want = 1 if "planted" in cmd else 0
        t0 = time.time()
        p = subprocess.run(run, shell=True, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, errors="replace")
        ran += 1
        print(f"exit {p.returncode} (want {want}) in {time.time() - t0:.1f} s: {run}")
        if p.returncode != want:
            tail = "\n".join(p.stdout.strip().split("\n")[-15:])
            failures.append(f"{run}: exit {p.returncode}, want {want}\n{tail}")
    if not ran:
        sys.exit("readme_commands: README.md shows no command to run")
    if failures:
        print("\n\n".join(failures))
        sys.exit(f"readme_commands: {len(failures)} README command(s) exited wrong")
    print(f"readme_commands: {ran} README command(s) ran as documented")


if __name__ == "__main__":
    main()
