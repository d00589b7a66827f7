"""Who may write an exposed region: the default (the owner's uid, root and the peers),
``expose(..., uids=, gids=, any_local=, peers=)``, reserved name prefixes, and the writer's uid
in every notification. Other uids are real processes (setuid in a subprocess)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

import tensorlane

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run another uid")


def _readable_by_nobody(path: str) -> bool:
    path = os.path.realpath(path)
    while path != "/":
        st = os.stat(path)
        if not st.st_mode & (0o005 if os.path.isdir(path) else 0o004):
            return False
        path = os.path.dirname(path)
    return True


def run_as(uid: int, code: str, tmp_path) -> subprocess.CompletedProcess:
    """Runs ``code`` in a python3 that has become ``uid`` (with a readable copy of the
    package and library)."""
    pkg = os.path.dirname(tensorlane.__file__)
    dst = tmp_path / "pkg"
    if not dst.exists():
        shutil.copytree(pkg, dst / "tensorlane", symlinks=False)
    os.chmod(tmp_path, 0o755)
    for root, _, files in os.walk(dst):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    lib = tensorlane.library_path()
    if not _readable_by_nobody(lib):
        libcopy = dst / "tensorlane" / "libtensorlane.so"
        shutil.copy(lib, libcopy)
        os.chmod(libcopy, 0o755)
        lib = str(libcopy)
    prelude = f"import os, tensorlane\nos.setgroups([]); os.setgid({uid}); os.setuid({uid})\n"
    env = {**os.environ, "PYTHONPATH": str(dst), "TENSORLANE_LIBRARY": lib}
    return subprocess.run([sys.executable, "-c", prelude + code], env=env, capture_output=True,
                          text=True, timeout=60, cwd=str(tmp_path))


def write_code(sock: str, name: str, imm: int) -> str:
    return (
        f"c = tensorlane.Client({sock!r})\n"
        "src = c.alloc_host(4096)\n"
        "src.view()[:] = bytes([7]) * 4096\n"
        "try:\n"
        f"    r = c.lookup(c.node_name, {name!r})\n"
        "except tensorlane.PermissionDeniedError as e:\n"
        "    assert e.status == tensorlane.Status.EPERM\n"
        "    print('refused:', e.detail)\n"
        "    raise SystemExit(0)\n"
        f"c.write(src, r, imm={imm}).wait(10)\n"
        "print('wrote')\n")


@needs_root
def test_default_expose_refuses_another_uid(make_cluster, tmp_path):
    cl = make_cluster(("node-a",), security={"allowed_uids": [NOBODY]})
    with tensorlane.Client(cl.socket("node-a")) as owner:
        inbox = owner.alloc_host(4096)
        inbox.view()[:] = bytes(4096)
        owner.expose(inbox, "py.default")
        out = run_as(NOBODY, write_code(cl.socket("node-a"), "py.default", 1), tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "refused:" in out.stdout and "tl_expose_access" in out.stdout, out.stdout
        assert bytes(inbox.view()) == bytes(4096)
        with pytest.raises(tensorlane.TimedOutError):
            owner.wait_notification(timeout=0.2)


@needs_root
def test_a_listed_uid_writes_and_is_named_in_the_notification(make_cluster, tmp_path):
    cl = make_cluster(("node-a",), security={"allowed_uids": [NOBODY]})
    with tensorlane.Client(cl.socket("node-a")) as owner:
        inbox = owner.alloc_host(4096)
        inbox.expose("py.listed", uids=[NOBODY])
        out = run_as(NOBODY, write_code(cl.socket("node-a"), "py.listed", 5), tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "wrote" in out.stdout, out.stdout
        note = owner.wait_notification(timeout=10)
        assert (note.imm, note.writer_uid, note.dropped) == (5, NOBODY, 0)
        assert bytes(inbox.view()) == bytes([7]) * 4096
        # The owner's own write says its own uid.
        src = owner.alloc_host(4096)
        owner.write(src, owner.lookup(owner.node_name, "py.listed"), imm=6).wait(10)
        note = owner.wait_notification(timeout=10)
        assert (note.imm, note.writer_uid) == (6, os.geteuid())


@needs_root
def test_any_local_lets_every_client_write(make_cluster, tmp_path):
    cl = make_cluster(("node-a",), security={"allowed_uids": [NOBODY]})
    with tensorlane.Client(cl.socket("node-a")) as owner:
        inbox = owner.alloc_host(4096)
        inbox.expose("py.any", any_local=True)
        out = run_as(NOBODY, write_code(cl.socket("node-a"), "py.any", 9), tmp_path)
        assert "wrote" in out.stdout, out.stdout + out.stderr
        assert owner.wait_notification(timeout=10).writer_uid == NOBODY


@needs_root
def test_a_reserved_prefix_cannot_be_squatted(make_cluster, tmp_path):
    cl = make_cluster(("node-a",), security={
        "allowed_uids": [NOBODY],
        "reserved_names": [{"prefix": "kv.", "uids": [1000], "gids": []}]})
    code = (f"c = tensorlane.Client({cl.socket('node-a')!r})\n"
            "try:\n"
            "    c.alloc_host(4096).expose('kv.layer0')\n"
            "except tensorlane.PermissionDeniedError as e:\n"
            "    print('refused:', e.detail)\n")
    out = run_as(NOBODY, code, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "refused:" in out.stdout and "'kv.'" in out.stdout and "reserved_names" in out.stdout
    with tensorlane.Client(cl.socket("node-a")) as root:  # root may
        root.alloc_host(4096).expose("kv.layer0")


def test_peer_writes_say_uid_peer_and_local_only_names_stay_home(client_a, client_b):
    hidden = client_b.alloc_host(4096)
    hidden.expose("py.home", peers=False)
    inbox = client_b.alloc_host(4096)
    inbox.expose("py.offered")
    remote = client_a.lookup("node-b", "py.offered", timeout=20)
    with pytest.raises(tensorlane.NotFoundError):
        client_a.lookup("node-b", "py.home")
    src = client_a.alloc_host(4096)
    client_a.write(src, remote, imm=77).wait(10)
    note = client_b.wait_notification(timeout=10)
    while note.imm != 77:  # the shared cluster may carry other tests' notifications
        note = client_b.wait_notification(timeout=10)
    assert note.writer_uid == tensorlane.UID_PEER and note.peer == "node-a"


def test_bad_access_lists_are_invalid(client_a):
    r = client_a.alloc_host(4096)
    with pytest.raises(tensorlane.InvalidArgumentError, match="at most 64"):
        r.expose("py.many", uids=range(1000, 1065))
    with pytest.raises(tensorlane.InvalidArgumentError):
        r.expose("py.neg", gids=[-1])
