# Copyright 2026 Individual Contributor: stapo-verl contributors
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""The S2T mask of STAPO (verl/trainer/ppo/s2t_mask.py): closed forms, strictness, non-finite values, DP gather."""

import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verl.trainer.ppo.s2t_mask import candidate_mask, gather_candidates, s2t_keep_mask

TAU_P = 0.1
LOG_SMALL = math.log(0.05)  # p = 0.05 < τ_p
LOG_LARGE = math.log(0.5)  # p = 0.5 > τ_p


def _population():
    """Two positive-advantage responses (bs=2, T=4): five candidates with entropies 0.1..0.5 and three other tokens.

    Row 0: candidates H = 0.1, 0.2, 0.3 and a high-probability token. Row 1: candidates H = 0.4, 0.5, a
    high-probability token and one padding position.
    """
    log_prob = torch.tensor([[LOG_SMALL, LOG_SMALL, LOG_SMALL, LOG_LARGE], [LOG_SMALL, LOG_SMALL, LOG_LARGE, 0.0]])
    entropy = torch.tensor([[0.1, 0.2, 0.3, 0.05], [0.4, 0.5, 0.05, 0.0]])
    advantages = torch.ones(2, 4)
    response_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    return log_prob, entropy, advantages, response_mask


def test_candidate_conditions_are_strict():
    # tokens: candidate; Â < 0; Â = 0; p = τ_p exactly (not < τ_p); p > τ_p; padding; NaN entropy
    log_prob = torch.tensor([[LOG_SMALL, LOG_SMALL, LOG_SMALL, math.log(TAU_P), LOG_LARGE, LOG_SMALL, LOG_SMALL]])
    entropy = torch.tensor([[0.1, 0.1, 0.1, 0.1, 0.1, 0.1, float("nan")]])
    advantages = torch.tensor([[1.0, -1.0, 0.0, 1.0, 1.0, 1.0, 1.0]])
    response_mask = torch.tensor([[1, 1, 1, 1, 1, 0, 1]])
    candidates, nonfinite = candidate_mask(log_prob, entropy, advantages, response_mask, TAU_P)
    assert candidates.tolist() == [[True, False, False, False, False, False, False]]
    assert nonfinite.tolist() == [[False, False, False, False, False, False, True]]


def test_keep_mask_closed_form():
    keep, metrics = s2t_keep_mask(*_population(), tau_p=TAU_P, q=0.75)
    # P = {0.1, 0.2, 0.3, 0.4, 0.5}: τ_h = Quantile_0.75 = 0.4 (rank 0.75·4 = 3, no interpolation); silence H < 0.4,
    # so 0.4 itself is kept. 7 valid tokens, 5 candidates, 3 silenced, 4 kept.
    assert keep.tolist() == [[False, False, False, True], [True, True, True, False]]
    assert metrics == pytest.approx(
        {
            "actor/stapo/masked_frac": 3 / 7,
            "actor/stapo/candidate_frac": 5 / 7,
            "actor/stapo/num_masked": 3.0,
            "actor/stapo/num_candidates": 5.0,
            "actor/stapo/nonfinite_tokens": 0.0,
            "actor/stapo/renorm_factor": 7 / 4,
            "actor/stapo/tau_h": 0.4,
        }
    )


def test_tau_h_interpolates_linearly_as_torch_quantile():
    # P = {0.1, 0.2, 0.3, 0.4}: rank 0.75·3 = 2.25 → 0.3 + 0.25·(0.4 − 0.3) = 0.325; 0.1, 0.2, 0.3 silenced
    log_prob = torch.full((1, 4), LOG_SMALL)
    entropy = torch.tensor([[0.4, 0.1, 0.3, 0.2]])
    keep, metrics = s2t_keep_mask(log_prob, entropy, torch.ones(1, 4), torch.ones(1, 4), tau_p=TAU_P, q=0.75)
    assert metrics["actor/stapo/tau_h"] == pytest.approx(0.325) and keep.tolist() == [[True, False, False, False]]


def test_tau_h_is_torch_quantile_of_the_candidates():
    # P = 0 .. 1000, shuffled: Quantile_0.75 = 0.75 · 1000 = 750 exactly; the 750 candidates below it are silenced
    generator = torch.Generator().manual_seed(0)
    entropy = torch.randperm(1001, generator=generator).float().reshape(1, -1)
    ones, log_prob = torch.ones_like(entropy), torch.full_like(entropy, LOG_SMALL)
    keep, metrics = s2t_keep_mask(log_prob, entropy, ones, ones, tau_p=TAU_P, q=0.75)
    assert metrics["actor/stapo/tau_h"] == 750.0 and metrics["actor/stapo/num_masked"] == 750
    assert torch.equal(keep, entropy >= 750)
    # any population: τ_h is torch.quantile's value (linear interpolation), bit for bit
    entropy = torch.rand(1, 1001, generator=generator)
    _, metrics = s2t_keep_mask(log_prob, entropy, ones, ones, tau_p=TAU_P, q=0.3)
    assert metrics["actor/stapo/tau_h"] == torch.quantile(entropy.reshape(-1), 0.3).item()


def test_ties_at_the_threshold_are_kept():
    log_prob = torch.full((1, 4), LOG_SMALL)
    entropy = torch.tensor([[0.1, 0.3, 0.3, 0.3]])
    keep, metrics = s2t_keep_mask(log_prob, entropy, torch.ones(1, 4), torch.ones(1, 4), tau_p=TAU_P, q=0.75)
    assert metrics["actor/stapo/tau_h"] == pytest.approx(0.3) and keep.tolist() == [[False, True, True, True]]


def test_empty_population_nonfinite_tokens_and_shape_errors():
    log_prob, entropy, advantages, response_mask = _population()
    entropy[0, 3] = float("inf")  # a valid non-candidate with a non-finite entropy is dropped from the loss
    keep, metrics = s2t_keep_mask(log_prob, entropy, -advantages, response_mask, tau_p=TAU_P, q=0.75)
    assert keep.tolist() == [[True, True, True, False], [True, True, True, False]]
    assert metrics["actor/stapo/num_candidates"] == 0 and metrics["actor/stapo/nonfinite_tokens"] == 1
    assert metrics["actor/stapo/renorm_factor"] == pytest.approx(7 / 6) and "actor/stapo/tau_h" not in metrics
    with pytest.raises(ValueError, match="share one"):
        s2t_keep_mask(log_prob, entropy[:, :3], advantages, response_mask)


def _dp_worker(rank: int, world: int, init_file: str, queue) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        rows = slice(rank, rank + 1)
        population = [t[rows] for t in _population()]
        keep, metrics = s2t_keep_mask(*population, tau_p=TAU_P, q=0.75, group=dist.group.WORLD)
        candidates, nonfinite = candidate_mask(*population, TAU_P)
        gathered, mine, *_ = gather_candidates(
            population[0], population[1], population[3], candidates, nonfinite, dist.group.WORLD
        )
        queue.put((rank, keep.tolist(), metrics, gathered[:, 0].tolist(), mine.start))
    finally:
        dist.destroy_process_group()


def test_data_parallel_ranks_apply_the_threshold_of_the_whole_population(tmp_path):
    """Each of 2 gloo ranks holds one response; τ_h and the counts are those of the whole mini-batch."""
    single, whole = s2t_keep_mask(*_population(), tau_p=TAU_P, q=0.75)
    ctx = mp.get_context("fork")  # the children inherit the imported modules; gloo on CPU only
    queue = ctx.Queue()
    procs = [ctx.Process(target=_dp_worker, args=(rank, 2, str(tmp_path / "init"), queue)) for rank in range(2)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for rank, keep, metrics, entropies, offset in results:
        # alone, rank 1's candidates {0.4, 0.5} would give τ_h = 0.475 and silence 0.4
        assert keep == single[rank : rank + 1].tolist()
        assert metrics == whole  # counts and τ_h of the whole mini-batch (7 valid, 5 candidates, 3 silenced)
        # the gather: every rank's candidates in rank order (rank 0 holds 3 of them, padded rows dropped)
        assert entropies == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5]) and offset == [0, 3][rank]
