"""Waits block in C with the GIL released, in slices: other threads run, Ctrl-C and close()
are seen within a slice, several threads may wait on one client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import tensorlane
from tensorlane import _client


def test_other_threads_run_while_one_waits(client_a, monkeypatch):
    # One slice of a second: were the GIL held during the C call, the counting thread would
    # stall for all of it.
    monkeypatch.setattr(_client, "WAIT_SLICE", 1.0)

    def count(seconds: float) -> tuple[int, float]:
        n, last, worst = 0, time.monotonic(), 0.0
        end = last + seconds
        while (now := time.monotonic()) < end:
            worst = max(worst, now - last)
            last = now
            n += 1
        return n, worst

    alone, _ = count(0.3)
    result: list = []
    waiter = threading.Thread(target=lambda: result.append(_wait_quietly(client_a, 1.0)))
    waiter.start()
    time.sleep(0.05)  # the waiter is inside tl_wait_notification now
    during, worst_gap = count(0.6)
    waiter.join()
    assert result == ["timed out"]
    # A GIL-holding wait would allow no turn at all for a second (the window is 0.6 s). Twice the
    # time would give twice the turns on an idle machine; a quarter of `alone` leaves room for a
    # loaded one (under ctest -j2 the rate halved and `during > alone` failed). The gap is the
    # longest the counter ever stood still.
    assert during > alone // 4, (during, alone)
    assert worst_gap < 0.2, worst_gap


def _wait_quietly(client, timeout):
    try:
        client.wait_notification(timeout)
        return "notified"
    except TimeoutError:
        return "timed out"


def test_two_threads_wait_on_one_client(client_a, client_b, name):
    recv = client_b.alloc_host(4096)
    client_b.expose(recv, name)
    remote = client_a.lookup("node-b", name, timeout=5)
    got: list = []
    lock = threading.Lock()

    def waiter():
        note = client_b.wait_notification(10)
        with lock:
            got.append(note.imm)

    threads = [threading.Thread(target=waiter) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    src = client_a.alloc_host(4096)
    tickets = [client_a.write(src, remote, imm=i) for i in (1, 2)]
    for t in threads:
        t.join(10)
    assert sorted(got) == [1, 2]
    for t in tickets:
        t.wait(5)


def test_one_ticket_waited_by_two_threads(client_a, client_b, name):
    recv = client_b.alloc_host(1 << 20)
    client_b.expose(recv, name)
    remote = client_a.lookup("node-b", name, timeout=5)
    ticket = client_a.write(client_a.alloc_host(1 << 20), remote)
    errors: list = []

    def waiter():
        try:
            ticket.wait(10)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=waiter) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == [] and ticket.status == tensorlane.Status.OK
    client_b.wait_notification(5)


def test_close_waits_for_a_waiting_thread_which_then_stops(cluster):
    c = tensorlane.Client(cluster.socket("node-a"))
    caught: list = []

    def waiter():
        try:
            c.wait_notification()
        except BaseException as e:  # noqa: BLE001
            caught.append(e)

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.1)
    start = time.monotonic()
    c.close()
    took = time.monotonic() - start
    th.join(5)
    assert isinstance(caught[0], tensorlane.ClientClosedError)
    assert took < 0.5, took  # within about one slice


def test_ctrl_c_interrupts_a_wait_within_a_slice(cluster):
    script = textwrap.dedent(f"""
        import sys, time, tensorlane
        c = tensorlane.Client({cluster.socket("node-a")!r})
        print("waiting", flush=True)
        try:
            c.wait_notification()          # forever
        except KeyboardInterrupt:
            print("interrupted", time.monotonic(), flush=True)
            c.close()
            sys.exit(0)
        sys.exit(1)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env=os.environ.copy())
    try:
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.3)  # well inside the C call
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        line = proc.stdout.readline().split()
        assert proc.wait(10) == 0 and line[0] == "interrupted"
        latency = float(line[1]) - sent
        print(f"Ctrl-C seen after {latency * 1e3:.0f} ms (WAIT_SLICE {_client.WAIT_SLICE * 1e3:.0f} ms)")
        assert latency < _client.WAIT_SLICE + 0.15, latency
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_close_from_a_signal_handler_during_a_wait(cluster, client_b):
    # The handler runs on this thread between two slices of the wait: close() must neither
    # wait for itself nor pull the connection from under the call; the wait then stops.
    before = len(client_b.sidecar_status()["clients"])
    c = tensorlane.Client(cluster.socket("node-b"))
    old = signal.signal(signal.SIGALRM, lambda *_: c.close())
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        start = time.monotonic()
        with pytest.raises(tensorlane.ClientClosedError):
            c.wait_notification(timeout=10)
        assert time.monotonic() - start < 1.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert c.closed
    deadline = time.monotonic() + 5
    while len(client_b.sidecar_status()["clients"]) != before:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_exit_with_a_daemon_thread_blocked_in_a_wait_does_not_hang(cluster):
    script = textwrap.dedent(f"""
        import threading, time, tensorlane
        c = tensorlane.Client({cluster.socket("node-a")!r})
        threading.Thread(target=c.wait_notification, daemon=True).start()
        time.sleep(0.2)
        print("exiting", flush=True)
    """)
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=30, env=os.environ.copy())
    assert out.returncode == 0 and "exiting" in out.stdout, out.stderr
    assert time.monotonic() - start < 10
