#!/usr/bin/env python3
"""The `cmake --install` tree and the systemd unit in it (cmake/TensorlaneInstall.cmake).

    check_install.py tree    --build DIR --cmake CMAKE
    check_install.py systemd --build DIR --cmake CMAKE

Each installs the build into a fresh temporary prefix with `cmake --install BUILD --prefix TMP`.
`tree` checks that every part is where a distribution puts it, that the installed binaries run
from there (no build tree, nothing of it on LD_LIBRARY_PATH), that the installed example and a key made by the
installed `tensorlane keygen` pass `--check-config`, and that a C and a C++ program build
against the installed headers and library through pkg-config and run. `systemd` runs
`systemd-analyze verify` on the installed unit (no output allowed: it reports most problems as
warnings and still exits 0) and checks its exposure score; it exits 77 (skipped) where
systemd-analyze is missing.
"""
import argparse
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

SKIP = 77
from checks import check, failures


BUILD_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(cmd, **kw):
    env = dict(os.environ)
    # Nothing from the source or build tree; directories of dependencies stay (a host that lacks
    # a package may carry it unpacked under a prefix on LD_LIBRARY_PATH, as the GPU machine does).
    kept = [d for d in env.pop("LD_LIBRARY_PATH", "").split(":")
            if d and not os.path.abspath(d).startswith(BUILD_ROOT + os.sep)]
    if kept:
        env["LD_LIBRARY_PATH"] = ":".join(kept)
    env.update(kw.pop("env", {}))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, **kw)


def install(cmake, build, prefix):
    r = run([cmake, "--install", build, "--prefix", prefix])
    if r.returncode != 0:
        sys.exit("cmake --install failed:\n" + r.stdout + r.stderr)


def libdir_of(prefix):
    """lib/ or lib/<multiarch>/: wherever libtensorlane.so.0 went."""
    for root, _dirs, files in os.walk(os.path.join(prefix, "lib")):
        if "libtensorlane.so.0" in files:
            return root
    return None


def check_tree(args):
    version = args.version
    with tempfile.TemporaryDirectory(prefix="tl-install-") as prefix:
        install(args.cmake, args.build, prefix)
        p = lambda *parts: os.path.join(prefix, *parts)  # noqa: E731

        for exe in ("tensorlane-sidecar", "tensorlane", "tensorlane-example-exchange"):
            mode = os.stat(p("bin", exe)).st_mode if os.path.exists(p("bin", exe)) else 0
            check(stat.S_ISREG(mode) and mode & 0o111, f"bin/{exe} is an executable")

        lib = libdir_of(prefix)
        check(lib is not None, "libtensorlane.so.0 is under lib/")
        if lib is None:
            return
        rel = os.path.relpath(lib, prefix)
        real = os.path.join(lib, f"libtensorlane.so.{version}")
        check(os.path.isfile(real) and not os.path.islink(real), f"{rel}/libtensorlane.so.{version}")
        check(os.readlink(os.path.join(lib, "libtensorlane.so.0")) == f"libtensorlane.so.{version}",
              f"{rel}/libtensorlane.so.0 -> libtensorlane.so.{version}")
        check(os.readlink(os.path.join(lib, "libtensorlane.so")) == "libtensorlane.so.0",
              f"{rel}/libtensorlane.so -> libtensorlane.so.0 (for linking)")
        dyn = run(["readelf", "-d", real]).stdout
        check("Library soname: [libtensorlane.so.0]" in dyn, "the library's SONAME is libtensorlane.so.0")
        # Only the C ABI is exported (libtensorlane.map).
        syms = run(["readelf", "--dyn-syms", "-W", real]).stdout
        exported = {ln.split()[-1].split("@")[0] for ln in syms.splitlines()
                    if " GLOBAL " in ln and " UND " not in ln and ln.split()[-1] != "Ndx"}
        check(exported and all(s.startswith("tl_") for s in exported),
              f"the library exports only tl_* ({len(exported)} symbols)")

        for h in ("tensorlane.h", "tensorlane.hpp"):
            check(os.path.isfile(p("include", "tensorlane", h)), f"include/tensorlane/{h}")
        check(os.path.isfile(os.path.join(lib, "pkgconfig", "tensorlane.pc")), f"{rel}/pkgconfig/tensorlane.pc")
        for f in ("tensorlaneConfig.cmake", "tensorlaneConfigVersion.cmake", "TensorlaneTargets.cmake"):
            check(os.path.isfile(os.path.join(lib, "cmake", "tensorlane", f)), f"{rel}/cmake/tensorlane/{f}")

        unit = p("lib", "systemd", "system", "tensorlane-sidecar.service")
        check(os.path.isfile(unit), "lib/systemd/system/tensorlane-sidecar.service")
        text = open(unit).read() if os.path.isfile(unit) else ""
        check(f"ExecStart={prefix}/bin/tensorlane-sidecar --config /etc/tensorlane/sidecar.toml" in text,
              "the unit runs the installed binary with /etc/tensorlane/sidecar.toml")
        check(re.search(r"@[A-Z_]+@", text) is None, "the unit has no unconfigured @VARIABLE@")
        check(open(p("lib", "sysusers.d", "tensorlane.conf")).read().count("\ng tensorlane -") == 1,
              "lib/sysusers.d/tensorlane.conf creates the group tensorlane")

        doc = p("share", "doc", "tensorlane")
        for f in ("deploy.md", "peers.md", "metrics.md", "examples/roce-pair-a.toml",
                  "examples/roce-pair-b.toml", "examples/two-node.toml", "examples/single-node.toml",
                  "kubernetes/tensorlane-sidecar.yaml", "kubernetes/vllm-worker.yaml"):
            check(os.path.isfile(os.path.join(doc, f)), f"share/doc/tensorlane/{f}")
        check(not os.path.exists(p("etc")), "nothing is installed under etc/ (the config is the operator's)")

        # The installed binaries run on their own.
        for exe in ("tensorlane-sidecar", "tensorlane", "tensorlane-example-exchange"):
            r = run([p("bin", exe), "--help"])
            check(r.returncode == 0 and "usage" in r.stdout.lower(),
                  f"installed {exe} --help runs (exit {r.returncode})")
        ldd = run(["ldd", p("bin", "tensorlane")]).stdout
        found = re.search(r"libtensorlane\.so\.0 => (\S+)", ldd)
        check(found is not None and os.path.realpath(found.group(1)) == os.path.realpath(real),
              "installed tensorlane loads the installed shim (RUNPATH $ORIGIN/../lib)")

        # keygen, then the installed example passes --check-config with that key.
        key = p("peer.key")
        r = run([p("bin", "tensorlane"), "keygen", key])
        check(r.returncode == 0 and stat.S_IMODE(os.stat(key).st_mode) == 0o600,
              "installed tensorlane keygen writes a 0600 key")
        check(re.fullmatch(r"tensorlane-key-v1:[0-9a-f]{64}\n", open(key).read()) is not None,
              "the key is one tensorlane-key-v1 line")
        toml = p("roce-pair-a.toml")
        with open(os.path.join(doc, "examples", "roce-pair-a.toml")) as src, open(toml, "w") as dst:
            dst.write(src.read().replace('"/etc/tensorlane/peer.key"', json.dumps(key)))
        r = run([p("bin", "tensorlane-sidecar"), "--check-config", toml, "--json"])
        check(r.returncode == 0 and json.loads(r.stdout)["derived"]["traffic_class"] == 106,
              "installed example roce-pair-a.toml passes --check-config (traffic class 106)"
              + ("" if r.returncode == 0 else ": " + r.stderr.strip()))

        # The Python package, importable from where it went, loading the installed library.
        pkgs = [root for root, dirs, _f in os.walk(p("lib")) if "dist-packages" in os.path.basename(root)]
        check(len(pkgs) == 1 and os.path.isfile(os.path.join(pkgs[0], "tensorlane", "__init__.py")),
              f"the Python package is under lib/.../dist-packages ({[os.path.relpath(x, prefix) for x in pkgs]})")
        if len(pkgs) == 1:
            # Issue 24: with no TENSORLANE_LIBRARY and nothing on the loader's path, the
            # install's record (tensorlane/_installed.py) names the library of this prefix.
            record = os.path.join(pkgs[0], "tensorlane", "_installed.py")
            check(os.path.isfile(record) and f'LIBDIR = "{lib}"' in open(record).read(),
                  f"the install's record names the installed library directory {lib}")
            r = run([sys.executable, "-c", "import tensorlane; tensorlane._lib.library(); print(tensorlane.library_path())"],
                    env={"PYTHONPATH": pkgs[0]})
            check(r.returncode == 0 and os.path.realpath(r.stdout.strip()) == os.path.realpath(real),
                  "the installed package imports and loads the installed library through the install's record"
                  + ("" if r.returncode == 0 else ": " + r.stderr.strip()[-300:]))

        # Build against the installed files only.
        pc_env = {"PKG_CONFIG_PATH": os.path.join(lib, "pkgconfig")}
        flags = run(["pkg-config", "--cflags", "--libs", "tensorlane"], env=pc_env)
        check(flags.returncode == 0 and f"-I{prefix}/include" in flags.stdout,
              f"pkg-config tensorlane: {flags.stdout.strip()}")
        c_src = p("use.c")
        with open(c_src, "w") as f:
            f.write('#include <tensorlane/tensorlane.h>\n#include <stdio.h>\n'
                    'int main(void) { puts(tl_status_str(TL_EPEER)); return 0; }\n')
        exe = p("use")
        r = run(["cc", "-std=c11", "-Wall", "-Werror", c_src, "-o", exe] + flags.stdout.split()
                + [f"-Wl,-rpath,{lib}"])
        check(r.returncode == 0, "a C program builds against the installed header and library" +
              ("" if r.returncode == 0 else ": " + r.stderr))
        if r.returncode == 0:
            out = run([exe])
            check(out.returncode == 0 and out.stdout.strip() != "", f"and runs: tl_status_str(TL_EPEER) = {out.stdout.strip()!r}")
        cpp_src = p("use.cpp")
        with open(cpp_src, "w") as f:
            f.write('#include <tensorlane/tensorlane.hpp>\nint main() { return 0; }\n')
        r = run(["c++", "-std=c++20", "-Wall", "-Werror", "-fsyntax-only", cpp_src]
                + [x for x in flags.stdout.split() if x.startswith("-I")])
        check(r.returncode == 0, "the C++ wrapper compiles from the installed headers" +
              ("" if r.returncode == 0 else ": " + r.stderr))
        r = run(["c++", "-std=c++17", "-fsyntax-only", cpp_src]
                + [x for x in flags.stdout.split() if x.startswith("-I")])
        check(r.returncode != 0 and "tensorlane.hpp needs C++20" in r.stderr
              and r.stderr.count(": error:") == 1,
              "under -std=c++17 the wrapper stops at once with its own #error (not a pile of span errors)"
              + ("" if r.returncode != 0 else ": it compiled"))
        # A CMake project that sets no standard of its own: find_package(tensorlane) and
        # tensorlane::shim must bring C++20 (the compiler's default is older).
        proj = p("consumer")
        os.makedirs(proj)
        with open(os.path.join(proj, "CMakeLists.txt"), "w") as f:
            f.write("cmake_minimum_required(VERSION 3.20)\nproject(consumer CXX)\n"
                    "find_package(tensorlane REQUIRED)\n"
                    "add_executable(use use.cpp)\ntarget_link_libraries(use PRIVATE tensorlane::shim)\n")
        shutil.copy(cpp_src, os.path.join(proj, "use.cpp"))
        r = run([args.cmake, "-S", proj, "-B", os.path.join(proj, "build"), f"-DCMAKE_PREFIX_PATH={prefix}"])
        if r.returncode == 0:
            r = run([args.cmake, "--build", os.path.join(proj, "build")])
        check(r.returncode == 0, "a CMake project linking tensorlane::shim builds the C++ wrapper "
              "without setting a standard (the target carries cxx_std_20)"
              + ("" if r.returncode == 0 else ": " + (r.stdout + r.stderr)[-600:]))


def check_systemd(args):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        print("skipped: systemd-analyze is not installed (apt-get install systemd)")
        sys.exit(SKIP)
    with tempfile.TemporaryDirectory(prefix="tl-install-") as prefix:
        install(args.cmake, args.build, prefix)
        unit = os.path.join(prefix, "lib", "systemd", "system", "tensorlane-sidecar.service")
        r = run([analyze, "verify", unit])
        out = (r.stdout + r.stderr).strip()
        check(r.returncode == 0 and out == "",
              "systemd-analyze verify: no errors or warnings" + ("" if not out else ":\n" + out))
        # The exposure score (0 fully locked down - 10 unprotected) of what the unit grants.
        r = run([analyze, "security", "--offline=yes", "--no-pager", unit])
        m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout + r.stderr)
        score = float(m.group(1)) if m else 99.0
        check(score <= args.max_exposure,
              f"systemd-analyze security: exposure {score} <= {args.max_exposure}")
        # docs/deploy.md gives the figure for the systemd release it names: what a reader
        # running the same command there sees.
        doc = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                                "deploy.md")).read()
        said = re.search(r"rates the installed unit ([0-9.]+) with systemd (\d+)", doc.replace("\n", " "))
        check(said is not None, "docs/deploy.md says what systemd-analyze security rates the unit")
        version = re.search(r"systemd (\d+)", run([analyze, "--version"]).stdout)
        if said and version and version.group(1) == said.group(2):
            check(float(said.group(1)) == score,
                  f"docs/deploy.md's rating {said.group(1)} is what systemd {said.group(2)} measures ({score})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["tree", "systemd"])
    ap.add_argument("--build", required=True)
    ap.add_argument("--cmake", default="cmake")
    ap.add_argument("--version", default="0.1.0")
    ap.add_argument("--max-exposure", type=float, default=3.0)
    args = ap.parse_args()
    {"tree": check_tree, "systemd": check_systemd}[args.what](args)
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
