"""The worker → driver data path (``stapo_verl.diagnostics.shipping``): when a table is due, the row cap, the payload
key, and the config keys that drive them."""

import pytest
from support.verl_batches import actor_config

from stapo_verl.diagnostics.shipping import (
    PAYLOAD_KEY,
    DiagnosticsPayload,
    cap_rows,
    gather_rows,
    table_due,
    table_rows,
    take_payloads,
)
from stapo_verl.integration.verl_0_9_1.policy_loss.config import StapoConfigError


def test_table_due_follows_validation_by_default_and_dump_every_otherwise():
    at = lambda **kw: [s for s in range(1, 11) if table_due(s, total_steps=10, **kw)]  # noqa: E731
    assert at(dump_every=None, test_freq=4) == [4, 8, 10]  # verl validates at test_freq multiples and the last step
    assert at(dump_every=None, test_freq=-1) == []  # no validation, no table
    assert at(dump_every=0, test_freq=4) == []
    assert at(dump_every=3, test_freq=4) == [3, 6, 9, 10]
    assert at(dump_every=1, test_freq=-1) == list(range(1, 11))


def _rows(n_sil, n_kept):
    return [{"kind": "silenced", "i": i} for i in range(n_sil)] + [{"kind": "kept", "i": i} for i in range(n_kept)]


def test_cap_keeps_silenced_first_then_as_many_kept_in_order_and_deterministic():
    rows = _rows(10, 30)
    out = cap_rows(rows, 8, seed=5)
    assert [r["kind"] for r in out] == ["silenced"] * 4 + ["kept"] * 4
    assert out == cap_rows(rows, 8, seed=5) and out != cap_rows(rows, 8, seed=6)
    assert [r["i"] for r in out[:4]] == sorted(r["i"] for r in out[:4])  # original order kept
    few = cap_rows(_rows(2, 30), 8, seed=0)
    assert [r["kind"] for r in few] == ["silenced"] * 2 + ["kept"] * 2  # never more kept than silenced
    assert cap_rows(_rows(3, 1), 100, seed=0) == _rows(3, 1)


def test_gather_without_a_group_keeps_every_row_by_rank_and_the_table_caps_and_counts():
    rows = _rows(10, 30)
    assert gather_rows(rows, None, dp_rank=3) == {3: rows} and gather_rows([], None, dp_rank=0) == {0: []}
    table, selected = table_rows({1: rows[:25], 0: rows[25:]}, max_rows=8, seed=5)
    assert table == cap_rows(rows[25:] + rows[:25], 8, seed=5) and selected == 40  # rank order


def test_take_payloads_removes_the_key_so_verls_reduction_never_sees_it():
    p = DiagnosticsPayload(step=3, rows=[])
    metrics = {"loss": [1.0, 2.0], PAYLOAD_KEY: [p]}
    assert take_payloads(metrics) == [p] and metrics == {"loss": [1.0, 2.0]}
    assert take_payloads(metrics) == []


@pytest.mark.parametrize("key, value, allowed", [
    ("dump_every", -1, "null"), ("table_max_rows", 1, ">= 2"), ("collapse_z_threshold", 0.0, "> 0"),
    ("collapse_window", 1, ">= 2"), ("collapse_warmup_steps", 30, "collapse_window"),
    ("collapse_warmup_steps", 1, "2 <="),
])
def test_bad_values_raise_naming_the_key(key, value, allowed):
    with pytest.raises(StapoConfigError, match=rf"policy_loss\.{key}={value!r}.*{allowed}"):
        actor_config("stapo", mask_statistics=True, **{key: value})
    assert actor_config("stapo", **{key: value}).policy_loss.mask_statistics is False  # not asked: not read


def test_dump_every_needs_the_dump():
    with pytest.raises(StapoConfigError, match=r"policy_loss\.dump_every=3 .* needs .*policy_loss\.dump_tokens=True"):
        actor_config("stapo", mask_statistics=True, dump_every=3)


def test_defaults_and_types():
    pl = actor_config("stapo", dump_tokens=True, dump_every=2, collapse_z_threshold=None).policy_loss
    assert pl.dump_every == 2 and pl.collapse_z_threshold is None
    with pytest.raises(StapoConfigError, match=r"policy_loss\.dump_every='2' \(str\): allowed an int or null"):
        actor_config("stapo", dump_tokens=True, dump_every="2")
    pl = actor_config("stapo").policy_loss
    assert (pl.dump_every, pl.table_max_rows, pl.collapse_z_threshold, pl.collapse_window,
            pl.collapse_warmup_steps) == (None, 256, 5.0, 20, 10)
