"""Per-request rollout seeds: a function of what the request is for, distinct where it must be."""

from __future__ import annotations

import hashlib
import itertools

import pytest

from stapo_verl.core.seeding import SEED_BITS, rollout_request_seed

BASE = dict(global_step=3, validate=False, data_source="math_dapo", sample_index=17, sample_number=2)


def test_closed_form_and_range():
    key = repr((42, 3, False, "math_dapo", "17", 2)).encode()
    expected = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") & SEED_BITS
    assert rollout_request_seed(42, **BASE) == expected
    assert 0 <= expected < 2**63


def test_every_field_changes_the_seed():
    seeds = {rollout_request_seed(s, global_step=g, validate=v, data_source=d, sample_index=i, sample_number=n)
             for s, g, v, d, i, n in itertools.product((0, 1), (0, 1), (False, True), ("a", "b"), (0, 1), (0, 1, 2))}
    assert len(seeds) == 2 * 2 * 2 * 2 * 2 * 3


def test_index_types_from_a_batch_agree():
    # extra_info.index arrives as int or numpy/tensor scalars turned into ints: the same row, the same seed
    import numpy as np

    assert rollout_request_seed(0, **{**BASE, "sample_index": int(np.int64(17))}) == rollout_request_seed(0, **BASE)


@pytest.mark.parametrize("field", ["global_step", "sample_number"])
def test_negative_position_is_rejected(field):
    with pytest.raises(ValueError, match=field):
        rollout_request_seed(0, **{**BASE, field: -1})
