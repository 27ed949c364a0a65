"""End to end: the "Writing your own mask" example of docs/token_masks.md, run as written through the tiny recipe.

The section's Python block is written, as it stands, to the file its first line names (``# my_masks.py``) in a
temporary directory; its bash block is run, as it stands, from the repository root with ``MASKS_DIR`` set to that
directory, plus the test's own trailing Hydra overrides (one small step, no validation, no checkpoint). So the doc's
registration mechanism (``VERL_USE_EXTERNAL_MODULES`` on ``PYTHONPATH``) must reach the driver and the Ray workers,
the plugin's config must accept the user's mask behind ``loss_mode=vanilla``, and the recipe must not turn on the
S2T-only token dump for it.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from support.procs import REPO
from support.runs import SMALL, failure_text, metrics_by_step, run_config

DOC = REPO / "docs" / "token_masks.md"
SECTION = "## Writing your own mask"
#: the test's trailing overrides: one step of the small batch, no validation, no checkpoint
SHORT = [*SMALL, "trainer.total_training_steps=1", "trainer.test_freq=-1", "trainer.save_freq=-1"]


def doc_blocks(text: str, section: str) -> dict[str, str]:
    """The first ``python`` and the first ``bash`` fenced block of ``section`` (up to the next ``## ``), by language.

    Raises:
        AssertionError: the section or one of the two blocks is missing.
    """
    assert section in text, f"{DOC.name} has no section {section!r}"
    body = text.split(section, 1)[1].split("\n## ", 1)[0]
    blocks: dict[str, str] = {}
    for lang, code in re.findall(r"```(\w+)\n(.*?)```", body, flags=re.S):
        blocks.setdefault(lang, code)
    assert {"python", "bash"} <= set(blocks), f"{section}: fenced blocks {sorted(blocks)}, need python and bash"
    return blocks


def test_doc_blocks_parse():
    blocks = doc_blocks(DOC.read_text(encoding="utf-8"), SECTION)
    assert blocks["python"].splitlines()[0] == "# my_masks.py"
    assert "register_policy_token_mask(\"drop_rare\"" in blocks["python"]
    assert "recipes/tiny_cpu_stapo.sh" in blocks["bash"] and "token_mask=drop_rare" in blocks["bash"]


def test_own_mask_from_the_docs_trains_through_the_tiny_recipe(tmp_path):
    blocks = doc_blocks(DOC.read_text(encoding="utf-8"), SECTION)
    module = re.fullmatch(r"# (\w+\.py)", blocks["python"].splitlines()[0]).group(1)
    masks_dir = tmp_path / "masks"
    masks_dir.mkdir()
    (masks_dir / module).write_text(blocks["python"], encoding="utf-8")
    run_dir = tmp_path / "run"
    command = blocks["bash"].strip() + " " + " ".join(SHORT)
    r = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True, timeout=1200,
                       env={**os.environ, "MASKS_DIR": str(masks_dir), "STAPO_RUN_DIR": str(run_dir)})
    assert r.returncode == 0, failure_text(run_dir, r)

    pl = run_config(run_dir).actor_rollout_ref.actor.policy_loss
    assert (pl.loss_mode, pl.token_mask, pl.dump_tokens) == ("vanilla", "drop_rare", False)
    m = metrics_by_step(run_dir / "metrics.jsonl")
    assert sorted(m) == [1]
    # the mask ran in the actor worker (its metric), and the loss's denominator is the kept count Σ K
    kept_frac = m[1]["actor/drop_rare/kept_frac"]
    assert 0.0 < kept_frac <= 1.0
    # one optimizer mini-batch a step (8 prompts x 4 samples): Σ K = the kept share of the valid response tokens
    valid = m[1]["response_length/mean"] * 8 * 4
    assert m[1]["actor/policy_batch_num_tokens"] == pytest.approx(kept_frac * valid, rel=1e-6)
    assert "actor/stapo/num_masked" not in m[1]  # no S2T statistics for a mask that is not S2T
