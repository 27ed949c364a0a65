"""``token_mask=s2t_random`` masks a resumed run exactly as an uninterrupted one: its seed is a function of
(``random_mask_seed``, global step, mini-batch index), not of a per-process counter. Two separate processes: one
that has trained 4 earlier mini-batches, one fresh (as after a restart)."""

import json
import subprocess
import sys
from pathlib import Path

from support.procs import child_env

JOB = Path(__file__).with_name("random_mask_job.py")


def _masks(mode):
    out = subprocess.run([sys.executable, str(JOB), mode], capture_output=True, text=True, timeout=300,
                         env=child_env())
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_resumed_process_masks_like_the_uninterrupted_one():
    continued, fresh = _masks("continued"), _masks("fresh")
    assert continued == fresh
    # the draw is random: the two mini-batches of step 2 hold different data, and masks do silence something
    assert all(any(not k for row in m for k in row) for m in continued)
