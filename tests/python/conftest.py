"""Fixtures: real tensorlane-sidecar processes on loopback (tensorlane.testing.LocalCluster).

Run from CTest (which sets PYTHONPATH to the build tree's package, TENSORLANE_SIDECAR and the
build's libtensorlane) or directly: ``/usr/bin/python3 -m pytest tests/python`` after
``cmake --build build/release``; then the package comes from shim/python and the library and
sidecar from $TENSORLANE_BUILD_DIR (default build/release).
"""

from __future__ import annotations

import itertools
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("TENSORLANE_BUILD_DIR", os.path.join(ROOT, "build", "release"))

try:
    import tensorlane  # noqa: F401  (the build tree's package when CTest runs us)
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "shim", "python"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.join(ROOT, "shim", "python"), os.environ.get("PYTHONPATH")) if p)

import tensorlane  # noqa: E402
from tensorlane import _lib  # noqa: E402
from tensorlane.testing import LocalCluster  # noqa: E402

if "TENSORLANE_LIBRARY" not in os.environ:
    try:
        _lib.library()
    except tensorlane.LibraryError:
        os.environ["TENSORLANE_LIBRARY"] = os.path.join(BUILD, "shim", "libtensorlane.so")
if "TENSORLANE_SIDECAR" not in os.environ:
    candidate = os.path.join(BUILD, "sidecar", "tensorlane-sidecar")
    if os.access(candidate, os.X_OK):
        os.environ["TENSORLANE_SIDECAR"] = candidate

#: Peer timeouts short enough that failure tests end in seconds (defaults are 2 s / 5 s).
FAST_TCP = {"connect_timeout_ms": 300, "peer_timeout_ms": 1500, "keepalive_ms": 100,
            "reconnect_min_ms": 50, "reconnect_max_ms": 200}

_names = itertools.count()


@pytest.fixture(scope="session")
def cluster():
    """Two nodes (node-a, node-b) shared by the tests that do not break them."""
    with LocalCluster(("node-a", "node-b"), tcp=FAST_TCP) as c:
        yield c


@pytest.fixture
def make_cluster():
    """Fresh clusters for tests that kill, stop or reconfigure sidecars."""
    made = []

    def make(nodes=("node-a", "node-b"), **kw):
        kw.setdefault("tcp", FAST_TCP)
        c = LocalCluster(nodes, **kw).start()
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


@pytest.fixture
def client_a(cluster):
    with tensorlane.Client(cluster.socket("node-a")) as c:
        yield c


@pytest.fixture
def client_b(cluster):
    with tensorlane.Client(cluster.socket("node-b")) as c:
        yield c


@pytest.fixture
def name(request):
    """An exposed name no other test uses."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"t{next(_names)}-{request.node.name}")[:63]


def pytest_report_header(config):
    try:
        lib = _lib.library_path()
    except tensorlane.LibraryError as e:
        lib = f"not found ({e})"
    return [f"tensorlane: package {os.path.dirname(tensorlane.__file__)}", f"libtensorlane: {lib}",
            f"sidecar: {os.environ.get('TENSORLANE_SIDECAR', 'from PATH')}"]
