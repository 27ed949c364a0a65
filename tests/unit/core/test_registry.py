"""The policy-token-mask registry: registration, lookup, re-registration."""

import pytest

from stapo_verl.core import registry
from stapo_verl.core.masks import TOKEN_MASKS
from stapo_verl.core.registry import get_policy_token_mask, register_policy_token_mask


def test_the_plugin_registers_its_masks_with_their_fields():
    import stapo_verl.core.lab_masks  # noqa: F401  (what the config imports when it names a lab mask)

    assert set(TOKEN_MASKS) <= set(registry.POLICY_TOKEN_MASK_REGISTRY)
    fn, fields = get_policy_token_mask("s2t")
    assert fn.__name__ == "compute_s2t_token_mask"
    assert fields == ("old_log_probs", "entropy", "advantages", "response_mask")
    assert get_policy_token_mask("s2t_random")[1][-2:] == ("global_steps", "mini_batch_index")
    assert get_policy_token_mask("top_entropy")[1] == ("entropy", "response_mask")


def test_unknown_name_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"Unsupported policy token mask: nope\. Supported masks are: \['s2t'"):
        get_policy_token_mask("nope")


def test_registering_a_name_again_replaces_it_as_register_policy_loss_does(monkeypatch):
    monkeypatch.setattr(registry, "POLICY_TOKEN_MASK_REGISTRY", dict(registry.POLICY_TOKEN_MASK_REGISTRY))

    def my_mask(batch, config, dp_group=None):
        return batch["response_mask"].bool(), {}

    assert register_policy_token_mask("mine", required_fields=("response_mask",))(my_mask) is my_mask
    assert registry.POLICY_TOKEN_MASK_REGISTRY["mine"] == (my_mask, ("response_mask",))
    register_policy_token_mask("mine", required_fields=["response_mask", "advantages"])(my_mask)
    assert get_policy_token_mask("mine") == (my_mask, ("response_mask", "advantages"))
