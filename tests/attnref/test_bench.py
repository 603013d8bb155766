"""Benchmarks of the CPU reference: time of a 4k causal case, and peak memory of a 32k one.

The project runs pytest with ``--benchmark-disable``: each body then runs once, so every benchmark
here also checks its result (sampled rows against the float64 oracle) and stays a real test.
Run the timings with ``pytest tests/attnref/test_bench.py --benchmark-enable`` (add ``-m slow`` for
the 32k case, which takes minutes on 2 cores and is skipped otherwise, see ``conftest.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from oracle import oracle_attention

from attnref import AttnOptions, attention_varlen

REPO = Path(__file__).resolve().parents[2]
H, D = 8, 128


def _check_rows(q, k, v, out, lse, rows: list[int]) -> float:
    """Max error of sampled causal rows (sq == sk) against the oracle on the visible key prefix."""
    worst = 0.0
    for i in rows:
        # One query against keys [0, i]: bottom-right alignment makes that row i of the full case.
        want_out, want_lse = oracle_attention(q[i : i + 1], k[: i + 1], v[: i + 1], causal=True)
        worst = max(worst, (out[i : i + 1].double() - want_out).abs().max().item())
        worst = max(worst, (lse[:, i : i + 1].double() - want_lse).abs().max().item())
    return worst


def test_bench_causal_4k(benchmark) -> None:
    """(a) fp32 reference CPU time, one 4096 x 4096 causal sequence, 8 heads, d = 128."""
    s = 4096
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, H, D, generator=gen) for _ in range(3))
    cu = torch.tensor([0, s], dtype=torch.int32)
    options = AttnOptions(causal=True)
    res = benchmark.pedantic(lambda: attention_varlen(q, k, v, cu, cu, options=options), rounds=3, iterations=1)
    err = _check_rows(q, k, v, res.out, res.lse, [0, 1, 1000, s - 1])
    benchmark.extra_info.update(
        {"seqlen": s, "heads": H, "head_dim": D, "dtype": "float32", "max_err_sampled_rows": err}
    )
    assert err < 1e-4


# Runs in a fresh interpreter so that VmHWM (peak resident memory) starts from this case alone.
_PEAK_SCRIPT = r"""
import json, sys, time, torch
from attnref import AttnOptions, attention_varlen

def hwm():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))

s, h, d = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
gen = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(s, h, d, generator=gen) for _ in range(3))
cu = torch.tensor([0, s], dtype=torch.int32)
attention_varlen(q[:64], k[:64], v[:64], torch.tensor([0, 64]), torch.tensor([0, 64]))  # load kernels
base = hwm()
t0 = time.perf_counter()
res = attention_varlen(q, k, v, cu, cu, options=AttnOptions(causal=True))
seconds = time.perf_counter() - t0
peak = hwm() - base
# Last row sees every key: check it directly in float64.
i = s - 1
sc = torch.einsum("hd,shd->hs", q[i].double(), k.double()) / d ** 0.5
want = torch.einsum("hs,shd->hd", torch.softmax(sc, -1), v.double())
err_out = (res.out[i].double() - want).abs().max().item()
err_lse = (res.lse[:, i].double() - torch.logsumexp(sc, -1)).abs().max().item()
stats = {"seconds": seconds, "peak_growth_bytes": peak, "inputs_bytes": 3 * q.numel() * 4}
print(json.dumps(dict(stats, max_err_last_row=max(err_out, err_lse))))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc/self/status (Linux) for VmHWM")
def test_bench_peak_memory_32k(benchmark) -> None:
    """(b) one 32k-token causal sequence, 8 heads, d = 128: extra peak RSS stays far below the
    32 GiB an O(s^2) fp32 score matrix would take (the core tiles queries and keys)."""
    s = 32768

    def run() -> dict:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run(
            [sys.executable, "-c", _PEAK_SCRIPT, str(s), str(H), str(D)],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    t0 = time.perf_counter()
    stats = benchmark.pedantic(run, rounds=1, iterations=1)
    stats["wall_seconds_with_startup"] = time.perf_counter() - t0
    benchmark.extra_info.update(stats)
    score_matrix = s * s * H * 4
    assert score_matrix == 32 * 2**30
    assert stats["peak_growth_bytes"] < 2 * 2**30, stats
    assert stats["max_err_last_row"] < 1e-4, stats
