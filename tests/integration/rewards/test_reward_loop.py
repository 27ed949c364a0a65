"""compute_score as the recipes use it: loaded by verl 0.9.1's own ``load_reward_manager`` (what
``verl.experimental.reward_loop.RewardLoopWorker`` calls) from the recipe's ``reward.*`` keys, and driven through
the registered ``dapo`` / ``naive`` reward-loop managers on hand-built batches, with the killable workers. Every
input of the public bug reports scores as expected (``support.rewards_reported.REPORTED``)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.reward import load_reward_manager

from stapo_verl.rewards import RESULT_KEYS
from support.rewards_reported import PAD, REPORTED


class CharTokenizer:
    """Token ids are code points: decoding is exact and needs no model files."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(int(i)) for i in ids)


def recipe_config(manager: str):
    """The ``reward`` keys of ``recipes/common/base.sh`` (manager name from the registry, our function by path)."""
    return OmegaConf.create({"reward": {
        "reward_manager": {"name": manager, "source": "register"},
        "custom_reward_function": {"path": "pkg://stapo_verl.rewards", "name": "compute_score", "reward_kwargs": {}},
        "reward_kwargs": {},
        "sandbox_fusion": None,
    }})


def one_row(text: str, source: str, gold: str, pad_to: int) -> DataProto:
    """A batch of one: prompt ``[1, 2]``, the response's code points, right padding masked out."""
    ids = [ord(c) for c in text] + [0] * (pad_to - len(text))
    mask = [1, 1] + [1] * len(text) + [0] * (pad_to - len(text))
    return DataProto.from_dict(
        tensors={"prompts": torch.tensor([[1, 2]]), "responses": torch.tensor([ids]),
                 "attention_mask": torch.tensor([mask])},
        non_tensors={"data_source": np.array([source], dtype=object),
                     "reward_model": np.array([{"ground_truth": gold, "style": "rule"}], dtype=object),
                     "extra_info": np.array([{"index": 0}], dtype=object)},
    )


@pytest.mark.parametrize("manager_name", ["dapo", "naive"])
def test_reported_inputs_through_verls_reward_manager(manager_name):
    manager = load_reward_manager(recipe_config(manager_name), CharTokenizer())
    assert type(manager).__name__ == {"dapo": "DAPORewardManager", "naive": "NaiveRewardManager"}[manager_name]
    pad_to = max(len(text) for _, text, _, _ in REPORTED) + 3
    batches = [one_row(text, source, gold, pad_to) for source, text, gold, _ in REPORTED]

    async def score_all():  # concurrently, as RewardLoopWorker.compute_score_batch does
        return await asyncio.gather(*(manager.run_single(b) for b in batches))

    outs = manager.loop.run_until_complete(score_all())
    expected = [acc for *_, acc in REPORTED]
    assert [o["reward_extra_info"]["acc"] for o in outs] == expected
    assert [o["reward_score"] for o in outs] == [1.0 if acc else -1.0 for acc in expected]
    assert all(set(o["reward_extra_info"]) >= set(RESULT_KEYS) for o in outs)
    assert not any(o["reward_extra_info"]["timeout"] for o in outs)
    rm = manager.assemble_rm_scores(DataProto.concat(batches), [o["reward_score"] for o in outs])
    for i, (_, text, _, acc) in enumerate(REPORTED):  # the reward sits on the last valid response token
        assert rm[i, len(text) - 1].item() == (1.0 if acc else -1.0) and rm[i].abs().sum().item() == 1.0


def test_reward_kwargs_reach_compute_score():
    cfg = recipe_config("dapo")
    cfg.reward.custom_reward_function.reward_kwargs = {"scorer": "strict_box", "timeout_s": 30}
    manager = load_reward_manager(cfg, CharTokenizer())
    text = PAD + "\nAnswer: 42"
    out = manager.loop.run_until_complete(manager.run_single(one_row(text, "math_dapo", "42", len(text))))
    assert out["reward_score"] == -1.0 and out["reward_extra_info"]["no_box"] is True  # JustRL's box-only rule


def test_each_reward_manager_owns_its_reward_function_and_workers():
    """verl looks ``compute_score`` up once per manager: each manager holds its own RewardFunction, whose runner
    (the killable workers) exists once it has scored; nothing is shared through the package."""
    from stapo_verl.rewards import RewardFunction

    first, second = (load_reward_manager(recipe_config("naive"), CharTokenizer()) for _ in range(2))
    fn_first, fn_second = first.compute_score.args[0], second.compute_score.args[0]  # partial(_call_with_kwargs, fn)
    assert isinstance(fn_first, RewardFunction) and isinstance(fn_second, RewardFunction)
    assert fn_first is not fn_second and fn_first._runner is None
    out = first.loop.run_until_complete(first.run_single(one_row("\\boxed{7}", "math500", "7", 9)))
    assert out["reward_score"] == 1.0
    assert fn_first._runner is not None and fn_first.runner.stats["calls"] == 1 and fn_second._runner is None
    fn_first.close()
