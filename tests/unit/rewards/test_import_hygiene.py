"""Importing the reward, data and eval tools pulls in neither verl nor torch (a reward worker must not pay for
``import verl``, about 5 s); the heavy libraries they use are imported where used."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("verl", "torch", "transformers", "ray")
#: module → heavy libraries it must not import either (imported where they are used)
LAZY = {
    "stapo_verl.rewards": ("math_verify", "sympy", "pebble", "pyarrow"),
    "stapo_verl.data": ("pyarrow", "datasets"),
    "stapo_verl.data.prepare": ("pyarrow", "datasets"),
    "stapo_verl.eval": ("pyarrow", "math_verify"),
    "stapo_verl.eval.__main__": ("pyarrow", "math_verify"),
    "stapo_verl.eval.generate_vllm": ("vllm", "pyarrow"),
}


@pytest.mark.parametrize("module", sorted(LAZY))
def test_import_is_light(module):
    banned = HEAVY + LAZY[module]
    code = (f"import sys, {module}\n"
            f"loaded = [m for m in {banned!r} if m in sys.modules]\n"
            "print(loaded)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"{module} imports {out.stdout.strip()}"
