#!/usr/bin/env python3
"""The README and docs/ as a reader of a fresh clone follows them (issue 24, point 8).

    docs_check.py --source DIR --build DIR --cli BIN --sidecar BIN

Checks: every relative link and every repository path written in backticks exists in the
clone (nothing outside it, such as ../shared/, is pointed at); the node's config has one name
(/etc/tensorlane/sidecar.toml, the systemd unit's); every command of the README's sh blocks
names a program the clone has, a `tensorlane` verb that exists, and only options that program's
--help lists.
"""

import argparse
import glob
import os
import re
import shlex
import subprocess
import sys

TOP = ("config/", "ipc/", "cuda/", "shim/", "sidecar/", "scripts/", "tests/", "docs/",
       "examples/", "cmake/", "build/")
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL " + msg)


def docs(src):
    return [os.path.join(src, "README.md")] + sorted(glob.glob(os.path.join(src, "docs", "*.md"))) + [
        os.path.join(src, "shim", "python", "README.md")]


def check_paths(src, build):
    for md in docs(src):
        rel_md = os.path.relpath(md, src)
        text = open(md).read()
        if "../shared/" in text:
            fail(f"{rel_md} points outside the repository (../shared/)")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://|#|mailto:", target):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(md), target.split("#")[0]))
            if not os.path.exists(path):
                fail(f"{rel_md}: link {target} does not exist")
        for token in re.findall(r"`([^`\s]+)`", text):
            token = token.rstrip(".,:;")
            if not token.startswith(TOP) or token.startswith("build/") or re.search(r"[<>*{}$]", token):
                continue
            path = token.split(":")[0].split("#")[0]
            part, _, rest = path.partition("/")
            # A part's public header and source files are named by the part's folder
            # (`ipc/layout.hpp`), a test program by its folder under the build tree.
            where = [os.path.join(src, path), os.path.join(src, part, "include", "tensorlane", part, rest),
                     os.path.join(src, part, "src", rest), os.path.join(build, path)]
            if not any(os.path.exists(w) for w in where):
                fail(f"{rel_md}: `{token}` is no file or folder of the repository")


def check_config_name(src):
    files = docs(src) + glob.glob(os.path.join(src, "scripts", "**", "*"), recursive=True) + glob.glob(
        os.path.join(src, "config", "examples", "*.toml"))
    for f in files:
        if not os.path.isfile(f):
            continue
        for m in re.finditer(r"/etc/tensorlane/([A-Za-z0-9_.-]+\.toml)", open(f, errors="replace").read()):
            if m.group(1) != "sidecar.toml":
                fail(f"{os.path.relpath(f, src)} names /etc/tensorlane/{m.group(1)}; the node's config "
                     "is /etc/tensorlane/sidecar.toml everywhere (the systemd unit's)")


def help_text(cmd):
    r = subprocess.run(cmd + ["--help"], capture_output=True, text=True)
    return r.stdout + r.stderr if r.returncode == 0 else None


def check_commands(src, cli, sidecar):
    text = open(os.path.join(src, "README.md")).read()
    verbs = help_text([cli]) or ""
    programs = {"tensorlane": cli, "tensorlane-sidecar": sidecar}
    checked = 0
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split("#")[0].strip()
            if not line:
                continue
            for cmd in re.split(r"&&|\|", line):
                try:
                    words = shlex.split(cmd)
                except ValueError:
                    continue
                words = [w for w in words if not re.fullmatch(r"[A-Z_]+=.*", w)]
                if not words:
                    continue
                prog = words[0]
                if prog.startswith("scripts/"):
                    checked += 1
                    if not os.access(os.path.join(src, prog), os.X_OK):
                        fail(f"README runs {prog}, which is no executable script of the repository")
                    continue
                name = os.path.basename(prog)
                if name not in programs:
                    continue
                checked += 1
                if prog.startswith("build/") and not prog.startswith("build/release/sidecar/"):
                    fail(f"README runs {prog}: the release preset builds it as build/release/sidecar/{name}")
                base = [programs[name]]
                args = words[1:]
                if name == "tensorlane" and args and not args[0].startswith("-"):
                    if not re.search(r"^\s+" + re.escape(args[0]) + r"\b", verbs, re.M):
                        fail(f"README runs `tensorlane {args[0]}`, which is no verb of tensorlane --help")
                        continue
                    base.append(args[0])
                h = help_text(base)
                if h is None:
                    fail(f"`{' '.join([name] + base[1:])} --help` fails")
                    continue
                for opt in re.findall(r"\[?(--[a-z][a-z0-9-]*)", " ".join(args)):
                    if not re.search(re.escape(opt) + r"\b", h):
                        fail(f"README: `{cmd.strip()}`: {opt} is not in `{' '.join([name] + base[1:])} --help`")
    if checked < 5:
        fail(f"only {checked} commands found in the README's sh blocks: the check reads nothing")
    print(f"{checked} README commands checked")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--sidecar", required=True)
    a = ap.parse_args()
    check_paths(a.source, a.build)
    check_config_name(a.source)
    check_commands(a.source, a.cli, a.sidecar)
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
