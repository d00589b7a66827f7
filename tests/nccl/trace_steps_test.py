#!/usr/bin/env python3
"""trace_steps.py joins two ranks' trace files into the right per-message times."""
import io
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace_steps  # noqa: E402


class TraceSteps(unittest.TestCase):
    def run_on(self, *args):
        """trace_steps.py's output for `args`, which it must accept."""
        sys.argv = ["trace_steps.py", *args]
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(trace_steps.main(), 0)
        return out.getvalue()

    def test_a_message_is_timed_from_its_isend_to_its_landing_across_ranks(self):
        with tempfile.TemporaryDirectory() as d:
            prefix = os.path.join(d, "t")
            # Rank 100 sends comm S2 -> the other's R3; rank 200 posts, its CTS reaches rank 100
            # 40 us later, the isend follows 10 us after that, the bytes land 250 us later.
            with open(prefix + ".200", "w") as f:
                f.write("1000.000100 comm R3 irecv slot 0 gen 1 n 1 size0 1048576 tag0 7 seq0 5 "
                        "(0 already here eagerly)\n")
                f.write("1000.000400 comm R3 slot 0 entry 0 landed 131072 bytes\n")
                f.write("1000.000430 comm R3 recv done slot 0 gen 1\n")
            with open(prefix + ".100", "w") as f:
                f.write("1000.000140 comm S2 CTS from R3 slot 0 gen 1 n 1 (0 stale) size0 1048576 "
                        "tag0 7 seq0 5 credit 0\n")
                f.write("1000.000150 comm S2 isend slot 0 size 131072 tag 7 seq 5 into its CTS, "
                        "entry 0 ticket 9\n")
                f.write("1000.000420 comm S2 send done slot 0 ticket 9\n")
                f.write("# 3 more lines did not fit\n")
            text = self.run_on("--timeline", "5", prefix)
            self.assertIn("6 steps from 2 processes", text)
            self.assertIn("size    131072:     1 messages, 0 eager", text)
            self.assertIn("send->land    250.0", text)
            self.assertIn("post->cts     40.0", text)
            self.assertIn("cts-send    -10.0", text)
            self.assertIn("send->done    270.0", text)
            self.assertIn("land->rdone     30.0", text)
            # The timeline: times relative to the isend (posted -50, CTS -10, landed 250,
            # receive done 280, send done 270).
            self.assertIn("   -50.0       0.0     -10.0     250.0     280.0     270.0", text)

    def test_a_send_is_split_into_its_stages_through_both_sidecars(self):
        with tempfile.TemporaryDirectory() as d:
            prefix = os.path.join(d, "t")
            # Rank 100 (node-a) sends 131072 bytes to rank 200 (node-b); node-a's sidecar (pid
            # 300) posts it as its write 9 (a CTS message, write 8, of the same size is not it),
            # node-b's (pid 400) receives it.
            with open(prefix + ".100", "w") as f:
                f.write("1000.000000 plugin node node-a\n")
                f.write("1000.000140 comm S2 CTS from R3 slot 0 gen 1 n 1 (0 stale) size0 1048576 "
                        "tag0 7 seq0 5 credit 0\n")
                f.write("1000.000150 comm S2 isend slot 0 size 131072 tag 7 seq 5 into its CTS, "
                        "entry 0 ticket 9\n")
                f.write("1000.000600 comm S2 send done slot 0 ticket 9\n")
            with open(prefix + ".200", "w") as f:
                f.write("1000.000000 plugin node node-b\n")
                f.write("1000.000100 comm R3 irecv slot 0 gen 1 n 1 size0 1048576 tag0 7 seq0 5 "
                        "(0 already here eagerly)\n")
                f.write("1000.000500 comm R3 slot 0 entry 0 landed 131072 bytes\n")
            with open(prefix + ".300", "w") as f:
                f.write("1000.000000 sidecar node node-a\n")
                f.write("1000.000145 out node-b seq 8 post bytes 131072 message\n")
                f.write("1000.000148 out node-b seq 9 post bytes 131072\n")
                f.write("1000.000155 out node-b seq 9 chunk at 0 len 65536 conn 0\n")
                f.write("1000.000160 out node-b seq 9 chunk at 65536 len 65536 conn 1\n")
                f.write("1000.000170 out node-b seq 9 chunk sent conn 0\n")
                f.write("1000.000200 out node-b seq 9 chunk sent conn 1\n")
                f.write("1000.000560 out node-b seq 9 acked code 0\n")
            with open(prefix + ".400", "w") as f:
                f.write("1000.000000 sidecar node node-b\n")
                f.write("1000.000210 in node-a seq 9 chunk begun at 0 len 65536\n")
                f.write("1000.000260 in node-a seq 9 chunk begun at 65536 len 65536\n")
                f.write("1000.000300 in node-a seq 9 chunk checked len 65536\n")
                f.write("1000.000320 in node-a seq 9 chunk checked len 65536\n")
                f.write("1000.000330 in node-a seq 9 delivered code 0\n")
            text = self.run_on(prefix)
            self.assertIn("size    131072:     1 sends through the sidecars", text)
            for stage, us in (("isend->post", -2.0), ("post->queued", 7.0),
                              ("queued->sent", 45.0), ("sent->begun", 60.0),
                              ("begun->checked", 60.0), ("checked->deliv", 10.0),
                              ("deliv->land", 170.0), ("deliv->acked", 230.0),
                              ("acked->sdone", 40.0)):
                self.assertRegex(text, rf"{stage} +{us:.1f} /")
            # The sidecars' table of every write: write 9 alone (8 is a message).
            _, _, table = text.partition("size    131072:     1 sidecar writes (every one, "
                                         "eager sends' too)\n")
            self.assertTrue(table, text)
            for stage, us in (("post->queued", 7.0), ("queued->sent", 45.0),
                              ("sent->begun", 60.0), ("begun->checked", 60.0),
                              ("checked->deliv", 10.0), ("deliv->acked", 230.0)):
                self.assertRegex(table, rf"^(    .*\n)*    {stage} +{us:.1f} /")

    def test_a_sidecars_time_is_summed_by_turn_phase_and_worker_job(self):
        with tempfile.TemporaryDirectory() as d:
            prefix = os.path.join(d, "t")
            # node-a's traffic runs from its post (1000.000100) to its ACK (1000.001100): 1000 us.
            # Two long turns (300 us: slept 100, drain 50, transports 150), one long tcp
            # progress (120 us: events 100, deliver 20), one outside the window (not counted),
            # two verify jobs and one send job, one wait of the engine for a worker.
            with open(prefix + ".300", "w") as f:
                f.write("1000.000000 sidecar node node-a\n")
                f.write("1000.000050 turn us 999 slept 999\n")
                f.write("1000.000100 out node-b seq 9 post bytes 131072\n")
                f.write("1000.000101 out node-b seq 9 chunk at 0 len 131072 conn 0\n")
                f.write("1000.000102 out node-b seq 10 post bytes 64 message\n")
                f.write("1000.000103 out node-b seq 11 post bytes 131072\n")
                for at in range(0, 131072, 32768):
                    f.write(f"1000.000104 out node-b seq 11 chunk at {at} len 32768 conn 1\n")
                f.write("1000.000200 turn us 100 slept 100 poll 0 drain 0 transports 0\n")
                f.write("1000.000300 tcp us 120 held 0 events 100 tags 0 deliver 20\n")
                f.write("1000.000400 turn us 200 poll 0 drain 50 transports 150 queues 0\n")
                f.write("1000.000500 tag verify len 32768 waited 4 ran 10 read\n")
                f.write("1000.000600 tag verify len 32768 waited 6 ran 30 read\n")
                f.write("1000.000700 tag send len 32768 waited 2 ran 20 write\n")
                f.write("1000.000800 tag wait us 15\n")
                f.write("1000.001100 out node-b seq 9 acked code 0\n")
            text = self.run_on(prefix)
            self.assertIn("sidecar node-a (300): 1000 us of traffic; 2 engine turns of 20 us or "
                          "more, 30% of it", text)
            self.assertIn("turns: transports 15%, slept 10%, drain 5%", text)
            self.assertIn("tcp progress of 15 us or more (1): events 10%, deliver 2%", text)
            self.assertRegex(text, r"tag verify-read +2 jobs, waited +5.0 / +6.0 us, "
                                   r"ran +20.0 / +30.0 us, 4% of a worker")
            self.assertRegex(text, r"tag send-write +1 jobs")
            self.assertIn("the engine waited for a worker 1 times, 1.5% of the window", text)
            self.assertIn("writes: 1 messages; 131072 B x2 (1 in 1 chunk, 1 in 4 chunks)", text)

    def test_no_files_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            sys.argv = ["trace_steps.py", os.path.join(d, "none")]
            self.assertEqual(trace_steps.main(), 1)


if __name__ == "__main__":
    unittest.main()
