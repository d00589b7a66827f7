"""An in-tree PEP 517 build backend for the pure-Python tensorlane package.

Why not setuptools: with pip's build isolation, setuptools (and wheel) would have to come from
a package index, and the machines this runs on often have none. This backend needs nothing
but the standard library, so ``pip install ./shim/python`` works offline, with or without
``--no-build-isolation``, on Python 3.9+.

It builds a ``py3-none-any`` wheel of ``tensorlane/`` (sources, ``py.typed``, ``.pyi``
stubs), an sdist, and PEP 660 editable wheels (a ``.pth`` that puts this directory on
``sys.path``). With ``$TENSORLANE_WHEEL_LIBRARY`` set to a built ``libtensorlane.so``, the
library is copied into the wheel next to the package (found there first, after
``$TENSORLANE_LIBRARY``) and the wheel is tagged for this platform instead.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import platform
import re
import tarfile
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "tensorlane"


def _project() -> dict:
    """name, version, description, requires-python from pyproject.toml's [project]."""
    with open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    body = text.split("[project]", 1)[1].split("\n[", 1)[0]
    out = {}
    for key in ("name", "version", "description", "requires-python"):
        m = re.search(rf'^{re.escape(key)}\s*=\s*"([^"]*)"', body, re.M)
        if m:
            out[key] = m.group(1)
    return out


def _metadata() -> str:
    p = _project()
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {p['name']}",
        f"Version: {p['version']}",
        f"Summary: {p.get('description', '')}",
        f"Requires-Python: {p.get('requires-python', '>=3.9')}",
        "License: Apache-2.0",
        "Classifier: Programming Language :: Python :: 3",
        "Classifier: Operating System :: POSIX :: Linux",
        "Classifier: Typing :: Typed",
        "Provides-Extra: torch",
        "Requires-Dist: torch ; extra == 'torch'",
        "Provides-Extra: numpy",
        "Requires-Dist: numpy ; extra == 'numpy'",
        "Provides-Extra: test",
        "Requires-Dist: pytest ; extra == 'test'",
        "Requires-Dist: numpy ; extra == 'test'",
        "Description-Content-Type: text/markdown",
        "",
        readme,
    ]
    return "\n".join(lines)


def _tag(bundled: bool) -> str:
    if not bundled:
        return "py3-none-any"
    return f"py3-none-linux_{platform.machine()}"


def _package_files() -> list[tuple[str, str]]:
    """(path in the archive, path on disk) of the package's files."""
    root = os.path.join(HERE, PACKAGE)
    out = []
    for top, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")  # subpackages: tensorlane.vllm
        rel = os.path.relpath(top, HERE).replace(os.sep, "/")
        for name in sorted(names):
            if name.endswith((".py", ".pyi")) or name == "py.typed":
                out.append((f"{rel}/{name}", os.path.join(top, name)))
    lib = os.environ.get("TENSORLANE_WHEEL_LIBRARY")
    if lib:
        if not os.path.isabs(lib):
            # pip runs this hook in a copy or in the source directory, never where it was
            # started, so a relative path would silently mean something else.
            raise ValueError(f"TENSORLANE_WHEEL_LIBRARY must be an absolute path, not {lib!r}")
        out.append((f"{PACKAGE}/libtensorlane.so", os.path.realpath(lib)))
    return out


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory: str, files: list[tuple[str, bytes]], bundled: bool) -> str:
    p = _project()
    name, version = p["name"], p["version"]
    tag = _tag(bundled)
    dist_info = f"{name}-{version}.dist-info"
    files = list(files) + [
        (f"{dist_info}/METADATA", _metadata().encode()),
        (f"{dist_info}/WHEEL", (
            "Wheel-Version: 1.0\nGenerator: tensorlane_build\n"
            f"Root-Is-Purelib: {'false' if bundled else 'true'}\nTag: {tag}\n").encode()),
        (f"{dist_info}/top_level.txt", f"{PACKAGE}\n".encode()),
    ]
    record = [_record_line(a, d) for a, d in files] + [f"{dist_info}/RECORD,,"]
    filename = f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w",
                         zipfile.ZIP_DEFLATED) as z:
        for arcname, data in files:
            info = zipfile.ZipInfo(arcname, date_time=(2024, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if arcname.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
        z.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return filename


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# ---- PEP 517 hooks


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = [(a, _read(d)) for a, d in _package_files()]
    return _write_wheel(wheel_directory, files, bool(os.environ.get("TENSORLANE_WHEEL_LIBRARY")))


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # PEP 660: the wheel holds only a .pth that adds this directory to sys.path.
    return _write_wheel(wheel_directory, [(f"__editable__.{PACKAGE}.pth",
                                           (HERE + "\n").encode())], False)


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    base = f"{p['name']}-{p['version']}"
    filename = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz") as tar:
        for rel in ["pyproject.toml", "README.md", "_build/tensorlane_build.py"] + [
                a for a, _ in _package_files() if not a.endswith(".so")]:
            tar.add(os.path.join(HERE, rel), arcname=f"{base}/{rel}")
        pkg_info = _metadata().encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg_info)
        tar.addfile(info, io.BytesIO(pkg_info))
    return filename
