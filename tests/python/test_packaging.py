"""`pip install ./shim/python` works (offline), the library is found in the documented order,
and the type stubs match the runtime."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

import tensorlane

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG_SRC = os.path.join(ROOT, "shim", "python")
HERE = os.path.dirname(os.path.abspath(__file__))

SHOW = "import tensorlane; print(tensorlane.library_path()); print(tensorlane.__file__)"


def python(code: str, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("TENSORLANE_LIBRARY", "PYTHONPATH", "LD_LIBRARY_PATH")}
    clean.update({k: v for k, v in env.items() if v is not None})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=clean, timeout=60, cwd="/")


@pytest.fixture(scope="module")
def built_library() -> str:
    return os.path.realpath(tensorlane.library_path())


@pytest.fixture(scope="module")
def installed(tmp_path_factory, built_library):
    """The package pip-installed into a directory, with the library bundled next to it."""
    if importlib.util.find_spec("pip") is None:
        pytest.skip("pip is not installed for this Python (Debian: python3-pip)")
    target = tmp_path_factory.mktemp("site")
    env = {**os.environ, "TENSORLANE_WHEEL_LIBRARY": built_library, "PIP_NO_INDEX": "1"}
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet",
                          "--target", str(target), PKG_SRC], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return target


def test_pip_install_bundles_the_library_next_to_the_package(installed):
    files = sorted(os.listdir(installed / "tensorlane"))
    assert {"__init__.py", "__init__.pyi", "py.typed", "libtensorlane.so", "vllm"} <= set(files)
    assert {"__init__.py", "_plan.py", "_connector.py"} <= set(
        os.listdir(installed / "tensorlane" / "vllm"))  # subpackages go along
    out = python(SHOW, PYTHONPATH=str(installed))
    assert out.returncode == 0, out.stderr
    lib, pkg = out.stdout.split()
    assert lib == str(installed / "tensorlane" / "libtensorlane.so")
    assert pkg.startswith(str(installed))


def test_tensorlane_library_wins_over_the_bundled_copy(installed, built_library):
    out = python(SHOW, PYTHONPATH=str(installed), TENSORLANE_LIBRARY=built_library)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == built_library


def test_a_wrong_tensorlane_library_is_an_error_not_a_fallback(installed, tmp_path):
    bogus = str(tmp_path / "libnothing.so")
    out = python("import tensorlane\ntry:\n    tensorlane.Client()\n"
                 "except tensorlane.LibraryError as e:\n    print(e)\n",
                 PYTHONPATH=str(installed), TENSORLANE_LIBRARY=bogus)
    assert out.returncode == 0, out.stderr
    assert "$TENSORLANE_LIBRARY" in out.stdout and bogus in out.stdout
    assert "(next to the package)" not in out.stdout  # nothing else was tried
    assert "(the loader path)" not in out.stdout


def test_the_loader_path_is_the_last_resort(built_library):
    out = python(SHOW, PYTHONPATH=PKG_SRC, LD_LIBRARY_PATH=os.path.dirname(built_library))
    assert out.returncode == 0, out.stderr
    assert os.path.realpath(out.stdout.split()[0]) == built_library
    out = python("import tensorlane\ntry:\n    tensorlane.library_path()\n"
                 "except ImportError as e:\n    print('missing:', e)\n", PYTHONPATH=PKG_SRC)
    assert "missing:" in out.stdout and "TENSORLANE_LIBRARY" in out.stdout


@pytest.fixture(scope="module")
def prefix_install(tmp_path_factory):
    """`pip install --prefix P ./shim/python` without TENSORLANE_WHEEL_LIBRARY: no library in
    the wheel. Returns (P, the site directory the package went to)."""
    if importlib.util.find_spec("pip") is None:
        pytest.skip("pip is not installed for this Python (Debian: python3-pip)")
    prefix = tmp_path_factory.mktemp("prefix")
    env = {k: v for k, v in os.environ.items() if k != "TENSORLANE_WHEEL_LIBRARY"}
    env["PIP_NO_INDEX"] = "1"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet",
                          "--prefix", str(prefix), PKG_SRC], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    sites = [root for root, _dirs, files in os.walk(prefix)
             if os.path.basename(root) == "tensorlane" and "__init__.py" in files]
    assert len(sites) == 1, sites
    assert not any(f.startswith("libtensorlane") for f in os.listdir(sites[0]))
    return prefix, os.path.dirname(sites[0])


def _as_prefix(prefix) -> str:
    """Code that runs as under a Python whose prefix is `prefix` (a venv there)."""
    return f"import sys\nsys.prefix = sys.base_prefix = {str(prefix)!r}\n"


def test_a_wheel_without_the_library_finds_it_in_its_prefix(prefix_install, built_library):
    # Issue 24: such a package could not find a library that `cmake --install` put into the
    # same prefix (the loader does not look in <prefix>/lib before ldconfig, if ever).
    prefix, site = prefix_install
    libdir = prefix / "lib"
    libdir.mkdir(exist_ok=True)
    placed = libdir / "libtensorlane.so.0"
    placed.write_bytes(open(built_library, "rb").read())
    try:
        out = python(_as_prefix(prefix) + SHOW, PYTHONPATH=site)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[0] == str(placed)
    finally:
        placed.unlink()


def test_when_nothing_is_found_the_error_lists_every_place(prefix_install):
    prefix, site = prefix_install
    out = python(_as_prefix(prefix) + "import tensorlane\ntry:\n    tensorlane.library_path()\n"
                 "except tensorlane.LibraryError as e:\n    print(e)\n", PYTHONPATH=site)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert f"{prefix}/lib/libtensorlane.so.0 (the prefix's library directory): not there" in text
    assert "/usr/local/lib/libtensorlane.so.0 (the prefix's library directory)" in text
    assert "(the loader path)" in text and "TENSORLANE_WHEEL_LIBRARY" in text


def test_the_install_record_names_the_library_directory(prefix_install, built_library, tmp_path):
    # What `cmake --install` writes next to the package it installs (tests/deploy checks the
    # real install); here a copy of the pip-installed package with such a record.
    import shutil

    _prefix, site = prefix_install
    pkg = tmp_path / "site" / "tensorlane"
    shutil.copytree(os.path.join(site, "tensorlane"), pkg)
    libdir = tmp_path / "somewhere" / "lib"
    libdir.mkdir(parents=True)
    (libdir / "libtensorlane.so.0").write_bytes(open(built_library, "rb").read())
    (pkg / "_installed.py").write_text(f'LIBDIR = "{libdir}"\n')
    out = python(SHOW, PYTHONPATH=str(tmp_path / "site"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == str(libdir / "libtensorlane.so.0")


def test_import_needs_neither_the_library_nor_torch():
    out = python("import sys, tensorlane, tensorlane.testing\n"
                 "assert 'torch' not in sys.modules and 'numpy' not in sys.modules\n"
                 "print(tensorlane.__version__)", PYTHONPATH=PKG_SRC)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == tensorlane.__version__


def _mypy_env() -> dict:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (Debian: mypy)")
    cache = os.path.join(os.environ.get("TENSORLANE_BUILD_DIR",
                                        os.path.join(ROOT, "build", "release")), "mypy-cache")
    return {**os.environ, "MYPY_CACHE_DIR": cache, "MYPYPATH": PKG_SRC}


def test_the_type_stubs_match_the_runtime(tmp_path):
    env = _mypy_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PKG_SRC, env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-m", "mypy.stubtest", "tensorlane", "--concise",
                          "--mypy-config-file", os.path.join(HERE, "stubtest.ini"),
                          "--allowlist", os.path.join(HERE, "stubtest_allowlist.txt")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_examples_type_check_against_the_stubs(tmp_path):
    env = _mypy_env()
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                          os.path.join(HERE, "stubtest.ini"), os.path.join(ROOT, "examples")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
