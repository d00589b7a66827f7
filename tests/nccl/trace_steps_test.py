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
            sys.argv = ["trace_steps.py", "--timeline", "5", prefix]
            out = io.StringIO()
            with redirect_stdout(out):
                self.assertEqual(trace_steps.main(), 0)
            text = out.getvalue()
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

    def test_no_files_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            sys.argv = ["trace_steps.py", os.path.join(d, "none")]
            self.assertEqual(trace_steps.main(), 1)


if __name__ == "__main__":
    unittest.main()
