"""The policy-token-mask registry: registration, lookup, duplicates."""

import pytest

from stapo_verl.core import registry
from stapo_verl.core.masks import TOKEN_MASKS
from stapo_verl.core.registry import get_policy_token_mask, register_policy_token_mask


def test_the_plugin_registers_its_masks_with_their_fields():
    assert set(TOKEN_MASKS) <= set(registry.POLICY_TOKEN_MASK_REGISTRY)
    s2t = get_policy_token_mask("s2t")
    assert s2t.required_fields == ("old_log_probs", "entropy", "advantages", "response_mask")
    assert get_policy_token_mask("s2t_random").required_fields[-2:] == ("global_steps", "mini_batch_index")
    assert get_policy_token_mask("top_entropy").required_fields == ("entropy", "response_mask")


def test_unknown_name_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"Unsupported policy token mask: nope\. Supported masks are: \['s2t'"):
        get_policy_token_mask("nope")


def test_a_name_cannot_be_taken_by_another_function(monkeypatch):
    monkeypatch.setattr(registry, "POLICY_TOKEN_MASK_REGISTRY", dict(registry.POLICY_TOKEN_MASK_REGISTRY))

    def my_mask(batch, config, dp_group=None):
        return batch["response_mask"].bool(), {}

    assert register_policy_token_mask("mine", required_fields=("response_mask",))(my_mask) is my_mask
    register_policy_token_mask("mine", required_fields=("response_mask",))(my_mask)  # same function: idempotent
    with pytest.raises(ValueError, match="'s2t' is already registered"):
        register_policy_token_mask("s2t", required_fields=("response_mask",))(my_mask)
    assert registry.POLICY_TOKEN_MASK_REGISTRY["mine"].fn is my_mask
