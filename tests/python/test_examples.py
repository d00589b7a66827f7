"""The integration examples, run small, end to end (their launchers start real sidecars)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")


def run(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    start = time.monotonic()
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *args],
                         capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    out.seconds = time.monotonic() - start  # type: ignore[attr-defined]
    print(out.stdout[-4000:], out.stderr[-4000:], sep="\n")
    return out


def test_tensor_parallel_all_gather_matches_the_reference_and_torch_distributed():
    out = run("tensor_parallel.py", "--ranks", "4", "--steps", "10", "--warmup", "2",
              "--rounds", "1", "--shard-bytes", "65536")
    assert out.returncode == 0
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    assert result["ranks"] == 4 and result["backend"] == "gloo"
    assert result["verified_steps"] == 24  # every step of both methods checked
    assert result["tensorlane"]["steps"] == result["torch.distributed"]["steps"] == 10
    assert result["ratio_p50"] > 0
    assert "ratio tensorlane / torch.distributed (gloo), p50:" in out.stdout


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="CUDA unavailable (torch.cuda.is_available() is False): the NCCL "
                    "comparison runs on the GPU machine")
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2,
                    reason="NCCL needs a GPU per rank: two ranks need two GPUs")
def test_tensor_parallel_on_cuda_against_nccl():
    out = run("tensor_parallel.py", "--ranks", "2", "--steps", "10", "--warmup", "2",
              "--rounds", "1", "--shard-bytes", "65536", "--device", "cuda")
    if out.returncode == 77:
        pytest.skip("the C ABI refuses CUDA memory (TL_ECUDA): " +
                    (out.stdout + out.stderr).strip()[-300:])
    assert out.returncode == 0
    assert "ratio tensorlane / torch.distributed (nccl), p50:" in out.stdout


def test_prefill_decode_delivers_and_verifies_every_block():
    out = run("prefill_decode.py", "--requests", "3", "--blocks-per-request", "12",
              "--num-blocks", "64")
    assert out.returncode == 0
    assert out.stdout.count("arrived and verified") == 3
    assert "all 3 requests verified" in out.stdout


def test_a_prefill_killed_mid_transfer_is_a_clear_error_soon():
    # 16 blocks per request: request 0 completes, request 1 gets at most 8 before the kill.
    out = run("prefill_decode.py", "--requests", "3", "--blocks-per-request", "16",
              "--kill-prefill-after-blocks", "24", "--request-timeout", "30")
    assert out.returncode == 3
    assert "request 0: all 16 blocks arrived and verified" in out.stdout
    m = re.search(r"ERROR request 1: the prefill worker is gone: .*NotFoundError.*; "
                  r"(\d+) of 16 blocks did not come: \[([\d, ]+)\] \((\d+) arrived and verified",
                  out.stdout)
    assert m, out.stdout
    missing, listed, arrived = int(m.group(1)), m.group(2).split(", "), int(m.group(3))
    assert missing == len(listed) and missing + arrived == 16 and missing >= 8
    # Seen through the writer's liveness, long before the 30 s deadline.
    m = re.search(r"reported it (\d+) ms later", out.stdout)
    assert m and int(m.group(1)) < 5000, out.stdout
    assert out.seconds < 25


def test_a_stalled_prefill_ends_at_the_request_deadline():
    out = run("prefill_decode.py", "--requests", "2", "--blocks-per-request", "16",
              "--stall-prefill-after-blocks", "20", "--request-timeout", "1.5")
    assert out.returncode == 4
    assert re.search(r"ERROR request 1: deadline of 1.5 s passed; 12 of 16 blocks did not "
                     r"come: \[[\d, ]+\] \(the prefill worker answered a ping", out.stdout)
