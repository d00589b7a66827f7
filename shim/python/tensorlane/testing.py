"""Real sidecars on loopback for tests and examples (no mocks): ``LocalCluster``.

Like ``tests/sidecar/harness.hpp`` and ``scripts/demo.sh``: a fresh temporary directory, a
fresh pre-shared key file (mode 0600), one TOML per node on free loopback ports with every
other node under ``[[peers]]``, and one ``tensorlane-sidecar`` process per node, each logging
to ``<dir>/<node>.log``. Everything is removed on ``stop()`` (or leaving the ``with`` block).

The sidecar binary is ``$TENSORLANE_SIDECAR``, else the build tree's
``<library dir>/../sidecar/tensorlane-sidecar`` (next to the loaded libtensorlane.so), else
``tensorlane-sidecar`` on ``PATH``.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import socket as socketlib
import subprocess
import tempfile
import time
from typing import Iterable, Mapping, Optional, Union

__all__ = ["LocalCluster", "Node", "find_sidecar", "free_port"]

TomlValue = Union[str, int, bool, list, dict]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socketlib.socket(socketlib.AF_INET, socketlib.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_sidecar() -> str:
    """The tensorlane-sidecar binary to run (see the module's docstring for the order)."""
    env = os.environ.get("TENSORLANE_SIDECAR")
    if env:
        return env
    try:
        from . import _lib

        lib_dir = os.path.dirname(os.path.realpath(_lib.library_path()))
        candidate = os.path.join(lib_dir, "..", "sidecar", "tensorlane-sidecar")
        if os.access(candidate, os.X_OK):
            return os.path.normpath(candidate)
    except ImportError:
        pass
    found = shutil.which("tensorlane-sidecar")
    if found:
        return found
    raise FileNotFoundError(
        "tensorlane-sidecar not found: set TENSORLANE_SIDECAR, or build it "
        "(cmake --build build/release --target tensorlane-sidecar)")


def _toml(v: TomlValue) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table
        return "{ " + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + " }"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _table(name: str, values: Mapping[str, TomlValue]) -> str:
    return f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in values.items())


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: a test runner killed with SIGKILL leaves no sidecar behind.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Node:
    """One sidecar process of a LocalCluster."""

    def __init__(self, cluster: "LocalCluster", name: str, port: int):
        self.cluster = cluster
        self.name = name
        self.port = port
        self.socket = os.path.join(cluster.dir, f"{name}.sock")
        self.config = os.path.join(cluster.dir, f"{name}.toml")
        self.log_path = os.path.join(cluster.dir, f"{name}.log")
        self.process: Optional[subprocess.Popen] = None

    @property
    def env(self) -> dict:
        """os.environ plus TENSORLANE_SOCKET for a worker of this node."""
        return {**os.environ, "TENSORLANE_SOCKET": self.socket}

    def log(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [self.cluster.sidecar, "--config", self.config, "--log-level",
                 self.cluster.log_level],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=_die_with_parent)

    def wait_ready(self, timeout: float) -> None:
        """Until a client can connect (the sidecar greets it), or raise with the log's tail."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"sidecar {self.name} exited with {self.process.returncode}:"
                                   f"\n{self.log()[-3000:]}")
            try:
                with socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_SEQPACKET) as s:
                    s.settimeout(max(0.1, deadline - time.monotonic()))
                    s.connect(self.socket)
                    if s.recv(4096):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"sidecar {self.name} not ready after {timeout} s:\n"
                                   f"{self.log()[-3000:]}")
            time.sleep(0.02)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Sends ``sig`` and reaps the process."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def stop(self) -> None:
        self.kill(signal.SIGTERM)

    def restart(self, timeout: float = 10.0) -> None:
        self.stop()
        self.start()
        self.wait_ready(timeout)


class LocalCluster:
    """Sidecars on loopback, one per name in ``nodes``, each peered with all the others.

    ``tcp``, ``limits``, ``ipc``, ``security``: extra keys of those TOML tables (e.g.
    ``tcp={"peer_timeout_ms": 1000}``); ``extra``: TOML text appended to every config.
    """

    def __init__(self, nodes: Iterable[str] = ("node-a", "node-b"), *,
                 sidecar: Optional[str] = None, workdir: Optional[str] = None,
                 poll_mode: str = "adaptive", ring_depth: int = 256,
                 tcp: Optional[Mapping[str, TomlValue]] = None,
                 limits: Optional[Mapping[str, TomlValue]] = None,
                 ipc: Optional[Mapping[str, TomlValue]] = None,
                 security: Optional[Mapping[str, TomlValue]] = None,
                 extra: str = "", log_level: str = "info", start_timeout: float = 20.0):
        self.names = list(nodes)
        self.sidecar = sidecar or find_sidecar()
        self._own_dir = workdir is None
        self.dir = workdir or tempfile.mkdtemp(prefix="tensorlane-py-")
        os.chmod(self.dir, 0o755)
        self.poll_mode = poll_mode
        self.ring_depth = ring_depth
        self.tcp = dict(tcp or {})
        self.limits = dict(limits or {})
        self.ipc = dict(ipc or {})
        self.security = dict(security or {})
        self.extra = extra
        self.log_level = log_level
        self.start_timeout = start_timeout
        self.key_file = os.path.join(self.dir, "peer.key")
        self.nodes: dict[str, Node] = {}

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def socket(self, name: str) -> str:
        return self.nodes[name].socket

    def toml(self, name: str) -> str:
        node = self.nodes[name]
        out = _table("node", {"name": name, "listen": f"127.0.0.1:{node.port}",
                              "socket": node.socket})
        out += _table("fabric", {"transport": "tcp"})
        out += _table("ipc", {"ring_depth": self.ring_depth, "poll_mode": self.poll_mode,
                              **self.ipc})
        out += _table("security", {"peer_key_file": self.key_file, **self.security})
        if self.tcp:
            out += _table("tcp", self.tcp)
        if self.limits:
            out += _table("limits", self.limits)
        for other in self.names:
            if other != name:
                out += _table("[peers]", {"name": other,
                                          "address": f"127.0.0.1:{self.nodes[other].port}"})
        return out + self.extra + "\n"

    def start(self) -> "LocalCluster":
        # A fresh key in the key file format (what `tensorlane keygen` writes), readable by its
        # owner only (the sidecar refuses looser modes and any other content).
        fd = os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("tensorlane-key-v1:" + secrets.token_hex(32) + "\n")
        for attempt in range(3):
            self.nodes = {n: Node(self, n, free_port()) for n in self.names}
            for n in self.names:
                with open(self.nodes[n].config, "w", encoding="utf-8") as f:
                    f.write(self.toml(n))
            for node in self.nodes.values():
                node.start()
            try:
                for node in self.nodes.values():
                    node.wait_ready(self.start_timeout)
                return self
            except RuntimeError:
                # A port taken between free_port() and the sidecar's bind: try new ones.
                logs = "".join(n.log() for n in self.nodes.values())
                for node in self.nodes.values():
                    node.kill()
                if attempt == 2 or "ddress already in use" not in logs:
                    raise
        return self

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
