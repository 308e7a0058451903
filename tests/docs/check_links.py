#!/usr/bin/env python3
"""check_links.py - fails when a document or code comment of the repo points at a file the repo does not hold.

Usage: check_links.py REPO_ROOT. Looks at every text file git knows (tracked, or untracked and not ignored):
  1. Markdown links and images, [text](target) and <img src=...>: a relative target must exist (relative to the
     Markdown file), and a #fragment into a Markdown file must name one of its headings (GitHub's slugs).
  2. Citations of Markdown files in any text file (`oracle/README.md`, "check/README.md"): a path whose first
     folder is a folder of the repo must exist, from the repo root or from the citing file's folder.
  3. Mentions of DESIGN.md, STYLE.md or a shared/ folder: documents outside the repo, which a clone lacks.
Files under docs/history/ may cite anything (they record what was). Prints one line per problem; exit 1 if any.
"""

import os
import re
import subprocess
import sys
import urllib.parse

ALLOWED_PREFIXES = ("docs/history/",)
SELF = "tests/docs/check_links.py"
OUTSIDE = re.compile(r"\b(?:DESIGN|STYLE)\.md\b|(?<![\w/.$~-])shared/")
MD_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_SRC = re.compile(r"<(?:img|a)\s[^>]*(?:src|href)=\"([^\"]+)\"")
MD_CITE = re.compile(r"(?<![\w/.$<{~-])((?:[\w.-]+/)+[\w.-]+\.md)\b")


def repo_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True).stdout.decode()
        names = out.split("\0")
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but build trees
        names = []
        for d, subdirs, fs in os.walk(root):
            subdirs[:] = [s for s in subdirs if not (s.startswith(".") or s.startswith("build"))]
            names += [os.path.relpath(os.path.join(d, f), root) for f in fs]
    return sorted({f for f in names if f and os.path.isfile(os.path.join(root, f))})


def read_text(path):
    with open(path, "rb") as f:
        data = f.read()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def slugs(text):
    """GitHub's heading anchors of a Markdown text (duplicates get -1, -2, ...)."""
    seen, out = {}, set()
    in_code = False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        m = None if in_code else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
        for a in re.finditer(r"<a\s+(?:name|id)=\"([^\"]+)\"", line):
            out.add(a.group(1))
    return out


def strip_code_blocks(text):
    """Markdown without fenced code blocks (commands there are not links), line numbers kept."""
    lines, in_code = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            lines.append("")
            continue
        lines.append("" if in_code else line)
    return "\n".join(lines)


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    files = repo_files(root)
    present = set(files)
    present_dirs = {"."}
    for f in files:
        d = os.path.dirname(f)
        while d and d not in present_dirs:
            present_dirs.add(d)
            d = os.path.dirname(d)
    top_dirs = {f.split("/", 1)[0] for f in files if "/" in f}
    texts, slug_cache, problems = {}, {}, []

    def text_of(f):
        if f not in texts:
            texts[f] = read_text(os.path.join(root, f))
        return texts[f]

    def exists(rel):
        rel = os.path.normpath(rel)
        return rel in present or rel in present_dirs

    for f in files:
        if f.startswith(ALLOWED_PREFIXES) or f == SELF:
            continue
        text = text_of(f)
        if text is None:
            continue
        here = os.path.dirname(f)
        prose = strip_code_blocks(text) if f.endswith(".md") else text  # output shown in a block names outputs
        for m in OUTSIDE.finditer(text):
            problems.append(f"{f}:{line_of(text, m.start())}: cites {m.group(0)!r}, which is not in the repo "
                            "(point to a docs/ page instead)")
        for m in MD_CITE.finditer(prose):
            cited = m.group(1)
            if cited.split("/", 1)[0] not in top_dirs or "DESIGN.md" in cited or "STYLE.md" in cited:
                continue  # an output path (OUT/summary.md) or already reported
            if not exists(cited) and not exists(os.path.join(here, cited)):
                problems.append(f"{f}:{line_of(prose, m.start())}: cites {cited}, which does not exist")
        if not f.endswith(".md"):
            continue
        body = strip_code_blocks(text)
        for m in list(MD_LINK.finditer(body)) + list(HTML_SRC.finditer(body)):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            path, _, frag = target.partition("#")
            path = urllib.parse.unquote(path)
            dest = os.path.normpath(os.path.join(here, path)) if path else f
            where = f"{f}:{line_of(body, m.start())}"
            if dest.startswith(".."):
                problems.append(f"{where}: link {target} leaves the repo")
                continue
            if not exists(dest):
                problems.append(f"{where}: link {target}: {dest} does not exist")
                continue
            if frag and dest.endswith(".md"):
                if dest not in slug_cache:
                    slug_cache[dest] = slugs(text_of(dest) or "")
                if frag not in slug_cache[dest]:
                    problems.append(f"{where}: link {target}: {dest} has no heading #{frag}")
    for p in problems:
        print(p)
    print(f"check_links: {len(files)} files, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
