"""The soak's ledger checker (soak.check_ledgers) against ledgers written by hand.

The soak runs prove the system; these prove the checker: each invariant it promises to watch
is broken once in a small ledger set and must be reported, a clean set must pass, and the
per-writer sharding (which keeps a 1-hour run's 16 M writes in bounded memory) must find a
notification in another worker's ledger.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak import check_ledgers  # noqa: E402


def write(tmp_path, worker: int, lines: list[tuple]) -> None:
    with open(tmp_path / f"ledger-w{worker}.log", "a", encoding="utf-8") as f:
        for fields in lines:
            f.write("\t".join(str(x) for x in fields) + "\n")


def clean(tmp_path) -> None:
    """Worker 0 (session 1) writes seq 1 and 2 to worker 1 (session 1), who sees both land."""
    write(tmp_path, 0, [("B", 1.0, 1),
                        ("W", 1.0, 1, 1, "s", 1, 1, 0, 4096),
                        ("W", 1.1, 1, 2, "s", 1, 1, 1, 100),
                        ("E", 1.2, 1, 1, "OK", 0.5),
                        ("E", 1.3, 1, 2, "OK", 0.7),
                        ("X", 2.0, 1, "exit")])
    write(tmp_path, 1, [("B", 1.0, 1),
                        ("R", 1.2, 1, 0, 1, 1, "ok"),
                        ("R", 1.3, 1, 0, 1, 2, "ok"),
                        ("X", 2.0, 1, "exit")])


def test_a_clean_ledger_passes_and_is_counted(tmp_path):
    clean(tmp_path)
    led = check_ledgers(str(tmp_path), {}, [])
    assert led["violations"] == {}
    st = led["stats"]
    assert (st["submitted"], st["ok"], st["ok_landed_seen"], st["notifications"]) == (2, 2, 2, 2)
    assert st["bytes_ok"] == 4196
    assert st["sessions"] == 2
    assert led["latency"]["run <=4KiB"]["n"] == 2
    # the shards are gone afterwards
    assert sorted(os.listdir(tmp_path)) == ["ledger-w0.log", "ledger-w1.log"]


@pytest.mark.parametrize("breakage, kind", [
    ([(0, ("E", 1.4, 1, 1, "TL_EPEER", 0.1))], "ended twice"),
    ([(1, ("R", 1.5, 1, 0, 1, 2, "ok"))], "notification twice"),
    ([(1, ("R", 1.5, 1, 0, 1, 1, "corrupt"))], "notification corrupt"),
    ([(1, ("R", 1.5, 1, 0, 1, 9, "ok"))], "notification of a write never submitted"),
    ([(0, ("W", 1.5, 1, 3, "s", 1, 1, 2, 64))], "never ended"),
    ([(0, ("W", 1.5, 1, 3, "s", 1, 1, 2, 64)), (0, ("E", 1.6, 1, 3, "OK", 0.2))],
     "OK write never notified"),
])
def test_each_broken_invariant_is_reported(tmp_path, breakage, kind):
    clean(tmp_path)
    for worker, line in breakage:
        # before the session's end line, as a live worker would have written it
        path = tmp_path / f"ledger-w{worker}.log"
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        lines.insert(len(lines) - 1, "\t".join(str(x) for x in line) + "\n")
        path.write_text("".join(lines), encoding="utf-8")
    led = check_ledgers(str(tmp_path), {}, [])
    assert list(led["violations"]) == [kind], led["violations"]


def test_an_ok_write_lost_by_a_crashed_sidecar_is_reported_unless_the_sweep_found_it(tmp_path):
    write(tmp_path, 0, [("B", 1.0, 1), ("W", 1.0, 1, 1, "s", 1, 1, 0, 4096),
                        ("E", 1.2, 1, 1, "OK", 0.5), ("X", 2.0, 1, "exit")])
    # the target's sidecar died: its session ended with econn before the notification came
    write(tmp_path, 1, [("B", 1.0, 1), ("X", 1.5, 1, "econn")])
    led = check_ledgers(str(tmp_path), {}, [])
    assert list(led["violations"]) == ["crash recovery: OK write not in place"]
    # the worker's sweep of the dead session's region found the bytes in place: no loss
    (tmp_path / "ledger-w1.log").unlink()
    write(tmp_path, 1, [("B", 1.0, 1), ("S", 1.4, 1, 0, 1, 1), ("X", 1.5, 1, "econn")])
    led = check_ledgers(str(tmp_path), {}, [])
    assert led["violations"] == {}
    assert led["stats"]["ok_found_by_sweep"] == 1


def test_a_landed_entry_of_a_failed_group_is_not_owed_a_notification(tmp_path):
    # The group's entries landed, then its end record was lost with the peer: the ticket
    # failed, the target was told the group failed (a failnote) and no OK notification came.
    write(tmp_path, 0, [("B", 1.0, 1), ("W", 1.0, 1, 1, "g", 1, 1, 0, 538),
                        ("W", 1.0, 1, 2, "g", 1, 1, 1, 3846),
                        ("E", 1.2, 1, 1, "TL_EPEER", 0.5, "landed"),
                        ("E", 1.2, 1, 2, "TL_EPEER", 0.5, "landed"), ("X", 2.0, 1, "exit")])
    write(tmp_path, 1, [("B", 1.0, 1), ("R", 1.3, 1, -1, -1, 7, "failnote:TL_EPEER"),
                        ("X", 2.0, 1, "exit")])
    led = check_ledgers(str(tmp_path), {}, [])
    assert led["violations"] == {}
    assert led["stats"]["group_failed_entry_landed"] == 2
    assert led["stats"]["failed"] == 2
    # The same entries with an OK ticket are owed their notification.
    (tmp_path / "ledger-w0.log").unlink()
    write(tmp_path, 0, [("B", 1.0, 1), ("W", 1.0, 1, 1, "g", 1, 1, 0, 538),
                        ("W", 1.0, 1, 2, "g", 1, 1, 1, 3846), ("E", 1.2, 1, 1, "OK", 0.5),
                        ("E", 1.2, 1, 2, "OK", 0.5), ("X", 2.0, 1, "exit")])
    led = check_ledgers(str(tmp_path), {}, [])
    assert list(led["violations"]) == ["OK write never notified"]


def test_a_line_cut_by_kill_is_ignored_and_a_killed_writer_is_not_a_loss(tmp_path):
    write(tmp_path, 0, [("B", 1.0, 1), ("W", 1.0, 1, 1, "s", 1, 1, 0, 4096)])
    with open(tmp_path / "ledger-w0.log", "a", encoding="utf-8") as f:
        f.write("E\t1.2\t1\t1\tO")  # kill -9 mid-line
    write(tmp_path, 1, [("B", 1.0, 1), ("X", 2.0, 1, "exit")])
    led = check_ledgers(str(tmp_path), {}, [])
    assert led["violations"] == {}
    assert led["stats"]["unended_writer_killed"] == 1


def test_a_sanitizer_report_anywhere_in_a_sidecars_log_is_found(tmp_path):
    from soak import Sidecar
    sc = Sidecar(name="tcp0", index=0, transport="tcp", ns="", address="", netdev="",
                 dir=str(tmp_path), binary="", simhca_dir="", mksysfs="")
    with open(sc.log_path, "w", encoding="utf-8") as f:
        f.write("[info] started\n" * 1000)
    assert sc.sanitizer_report() == ""
    with open(sc.log_path, "a", encoding="utf-8") as f:
        f.write("==123==ERROR: LeakSanitizer: detected memory leaks\n")
        f.write("[info] restarted\n" * 100000)  # a later incarnation's lines after it
    assert "LeakSanitizer" in sc.sanitizer_report()
