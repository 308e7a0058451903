#!/usr/bin/env python3
"""readme_tour.py - runs the README's one-minute tour and fails when its printed output or heatmap went stale.

Usage: readme_tour.py ATTN_CHECK PLANTED_PLUGIN REPO_ROOT WORKDIR. The README marks the tour's command with
<!-- tour-command --> (a ```sh block of one command), its output with <!-- tour-output --> (a ```text block) and
its heatmap with <!-- tour-heatmap --> (an image link). The command runs in an empty WORKDIR with the built
tool and plug-in in place of build/bin/attn-check and build/lib/libattnfuzz_planted_cpu.so; its output must
equal the README's block up to timings and the worker count, and the heatmap it writes must equal the image.
"""

import difflib
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

TOOL, PLUGIN = "build/bin/attn-check", "build/lib/libattnfuzz_planted_cpu.so"


def block_after(readme, marker, fence):
    m = re.search(re.escape(marker) + r"\s*```" + fence + r"\n(.*?)\n```", readme, re.S)
    if not m:
        sys.exit(f"readme_tour: README.md has no {marker} followed by a ```{fence} block")
    return m.group(1)


def normalise(text):
    text = re.sub(r"\(\d+ workers?,", "(N workers,", text)  # one worker per core
    text = re.sub(r"\b\d+ ms\)", "T ms)", text)
    text = re.sub(r" in \d+(\.\d+)? s:", " in T s:", text)
    return [line.rstrip() for line in text.strip("\n").split("\n")]


def main():
    attn_check, plugin, root, work = (os.path.abspath(a) for a in sys.argv[1:5])
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    command = block_after(readme, "<!-- tour-command -->", "sh").strip()
    expected = block_after(readme, "<!-- tour-output -->", "text")
    image = re.search(r"<!-- tour-heatmap -->\s*!\[[^\]]*\]\(([^)]+)\)", readme)
    if not image:
        sys.exit("readme_tour: README.md has no <!-- tour-heatmap --> image")
    argv = shlex.split(command)
    if argv[0] != TOOL:
        sys.exit(f"readme_tour: the tour command must start with {TOOL}: {command}")
    argv = [attn_check] + [plugin if a == PLUGIN else a for a in argv[1:]]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    p = subprocess.run(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    got = p.stdout.replace(plugin, PLUGIN)
    ok = True
    if p.returncode != 1:
        print(f"readme_tour: exit status {p.returncode}, the tour shows a failure (1)")
        ok = False
    diff = list(difflib.unified_diff(normalise(expected), normalise(got), "README.md tour output", "attn-check now",
                                     lineterm=""))
    if diff:
        print("readme_tour: the README's tour output is stale; update it from this run:\n" + "\n".join(diff))
        ok = False
    maps = glob.glob(os.path.join(work, "reports", "heatmap-*.svg"))
    want = open(os.path.join(root, image.group(1)), encoding="utf-8").read()
    if len(maps) != 1:
        print(f"readme_tour: expected one heatmap in reports/, found {len(maps)}")
        ok = False
    elif open(maps[0], encoding="utf-8").read() != want:
        print(f"readme_tour: {image.group(1)} is stale: copy {maps[0]} over it")
        ok = False
    print("readme_tour: " + ("the tour's output and heatmap match README.md" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
