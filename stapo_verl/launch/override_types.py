"""Every override's value against the type the composed config wants for its key, before Ray; and every size, length
or count key (:data:`POSITIVE_KEYS`) against zero and negative values.

Hydra composes ``trainer.total_training_steps=abc`` without a word: the key's default is ``null`` in verl's
``ppo_trainer.yaml``, and an untyped ``DictConfig`` node takes any value. verl reads it much later, in the TaskRunner
after Ray and the workers are up (``RayPPOTrainer._create_dataloader`` compares it with the step count), and the
launcher's resume rule calls ``int()`` on it first. :func:`check_override_types` finds the type each override's key
wants, in this order, and refuses a value of another type with one message naming the key, the value, the type wanted
and an override that passes:

1. the field's annotation in the dataclass the key's section is built into (the nearest enclosing node with a
   ``_target_``: ``ActorConfig``, ``PolicyLossConfig``, ``RolloutConfig``, ... as verl's
   ``omega_conf_to_dataclass`` builds them in ``validate_config`` and the workers);
2. the type of the key's value in verl's config composed without the value overrides (only the config-group choices:
   ``model_engine=megatron``, ``actor@actor_rollout_ref.actor=...``), when that value is an integer, a number or a
   boolean (a string or list default says little: ``data.val_files`` takes either);
3. :data:`NULL_DEFAULT_TYPES`, for the keys whose default is ``null`` outside any dataclass and that verl reads as
   numbers.

A key none of these types (an ``Any`` field, a ``null`` default not in the table, a key added with ``+``) is not
checked here. A ``null`` value, an interpolation (``${...}``) and a sweep are accepted as they are.
"""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing
from dataclasses import dataclass

#: keys whose default is ``null`` in verl 0.9.1's ``ppo_trainer.yaml`` / ``data/legacy_data.yaml`` (no dataclass
#: types them) and that verl reads as integers: ``trainer.total_training_steps`` (``RayPPOTrainer.
#: _create_dataloader``: ``if self.config.trainer.total_training_steps is not None: total_training_steps = ...``, then
#: compared with ``global_steps``), ``data.val_batch_size`` / ``data.gen_batch_size`` (``StatefulDataLoader``'s
#: batch size), ``data.seed`` (``torch.Generator().manual_seed``), ``trainer.max_actor_ckpt_to_keep`` /
#: ``trainer.max_critic_ckpt_to_keep`` (``BaseCheckpointManager`` counts folders with it)
NULL_DEFAULT_TYPES: types.MappingProxyType = types.MappingProxyType({
    "trainer.total_training_steps": int,
    "trainer.max_actor_ckpt_to_keep": int,
    "trainer.max_critic_ckpt_to_keep": int,
    "data.val_batch_size": int,
    "data.gen_batch_size": int,
    "data.seed": int,
})

_A, _R, _C = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"
#: sizes, lengths and counts verl needs positive: ``key -> null allowed`` (null: "unset", verl derives the value or
#: uses another key). verl 0.9.1 reads none of them as "off" at 0 or -1: a zero or negative value either fails late,
#: after Ray and the workers are up (a batch split by zero, an empty dataloader, a prompt budget no prompt fits), or
#: trains nothing. Keys that do take -1 or 0 for "off" (``trainer.test_freq``, ``trainer.save_freq``,
#: ``rollout.top_k``, ``data.val_max_samples``) are not here.
POSITIVE_KEYS: types.MappingProxyType = types.MappingProxyType({
    "data.train_batch_size": False,
    "data.val_batch_size": True,
    "data.gen_batch_size": True,
    "data.max_prompt_length": False,
    "data.max_response_length": False,
    f"{_A}.ppo_mini_batch_size": False,
    f"{_A}.ppo_micro_batch_size": True,
    f"{_A}.ppo_micro_batch_size_per_gpu": True,
    f"{_A}.ppo_max_token_len_per_gpu": False,
    f"{_A}.ppo_epochs": False,
    f"{_R}.n": False,
    f"{_R}.val_kwargs.n": False,
    f"{_R}.prompt_length": False,
    f"{_R}.response_length": False,
    f"{_R}.tensor_model_parallel_size": False,
    f"{_R}.log_prob_micro_batch_size": True,
    f"{_R}.log_prob_micro_batch_size_per_gpu": True,
    f"{_R}.log_prob_max_token_len_per_gpu": False,
    f"{_R}.agent.num_workers": False,
    f"{_C}.log_prob_micro_batch_size": True,
    f"{_C}.log_prob_micro_batch_size_per_gpu": True,
    f"{_C}.log_prob_max_token_len_per_gpu": False,
    f"{_A}.megatron.tensor_model_parallel_size": False,
    f"{_A}.megatron.pipeline_model_parallel_size": False,
    f"{_A}.megatron.context_parallel_size": False,
    "critic.ppo_mini_batch_size": False,
    "critic.ppo_micro_batch_size_per_gpu": True,
    "critic.ppo_max_token_len_per_gpu": False,
    "critic.ppo_epochs": False,
    "reward.num_workers": False,
    "trainer.total_epochs": False,
    "trainer.total_training_steps": True,
    "trainer.nnodes": False,
    "trainer.n_gpus_per_node": False,
})

#: what a message calls each type, and a value of it for the fix when the key's default is null
_NAMES = types.MappingProxyType({int: "an integer", float: "a number", bool: "a boolean (True/False)",
                                 str: "a string", list: "a list ([a,b])", dict: "a mapping ({k:v})"})
_EXAMPLES = types.MappingProxyType({int: "1", float: "1.0", bool: "True", str: "text", list: "[]", dict: "{}"})


class OverrideTypeError(ValueError):
    """An override's value is not of the type its key wants; the message names the key, the value, the type and a
    fix that passes :func:`check_override_types`.

    Attributes:
        key: the dotted key. value: the value given. wanted: the Python type wanted. fix: the override that fixes it.
    """

    def __init__(self, key: str, value, wanted: type, source: str, fix: str):
        self.key, self.value, self.wanted, self.fix = key, value, wanted, fix
        super().__init__(f"{key}={_show(value)} is {_kind(value)}; {key} wants {_NAMES[wanted]} ({source}). "
                         f"Fix: {fix}")


class OverrideValueError(OverrideTypeError):
    """A size, length or count override (:data:`POSITIVE_KEYS`) that is zero or negative; the message names the key,
    the value, what is allowed and a fix that passes :func:`check_override_types`.

    Attributes:
        key: the dotted key. value: the value given. fix: the override that fixes it.
    """

    def __init__(self, key: str, value, nullable: bool, fix: str):
        self.key, self.value, self.wanted, self.fix = key, value, int, fix
        allowed = "a positive integer" + (" or null (unset)" if nullable else "")
        ValueError.__init__(self, f"{key}={_show(value)}: {key} is a size, length or count, allowed: {allowed}. "
                                  f"Fix: {fix}")


def positive_fix(key: str, default) -> str:
    """An override that passes the positive check: verl's default when it is a positive integer (or null for a
    nullable key), else ``1``."""
    if default is None and POSITIVE_KEYS.get(key):
        return f"{key}=null (the default) or a positive integer"
    if isinstance(default, int) and not isinstance(default, bool) and default > 0:
        return f"{key}={default} (the default)"
    return f"{key}=1 or another positive integer"


def _show(value) -> str:
    if value is None:
        return "null"
    return repr(value) if isinstance(value, str) else str(value)


def _kind(value) -> str:
    for t in (bool, int, float, str, list, dict):
        if isinstance(value, t):
            return _NAMES[t].split(" (")[0]
    return type(value).__name__


def _hydra_value(value) -> str:
    """``value`` as Hydra override syntax (what the user would type)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, list):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def accepts(wanted: type, value) -> bool:
    """True when a value parsed by Hydra's override grammar is acceptable where ``wanted`` is wanted (``None``
    always is: verl's keys with a typed default take null as "unset" or refuse it themselves).

    int: an int (not a bool) or a string ``int()`` reads; float: an int or a float (not a bool) or a string
    ``float()`` reads; bool: a bool; str: any scalar
    (OmegaConf converts a scalar; some of verl's
    str fields take a list too): anything but a mapping; list / dict: a list / dict.
    """
    if value is None:
        return True
    if wanted in (int, float) and isinstance(value, str):  # quoted numbers: the plugin's keys coerce them exactly
        try:
            wanted(value.strip())
        except ValueError:
            return False
        return True
    if wanted is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if wanted is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if wanted is bool:
        return isinstance(value, bool)
    if wanted is str:
        return not isinstance(value, dict)
    if wanted is list:
        return isinstance(value, (list, tuple))
    if wanted is dict:
        return isinstance(value, dict)
    return True


def _plain_type(hint) -> type | None:
    """``int`` / ``float`` / ``bool`` / ``str`` / ``list`` / ``dict`` of a type hint (``Optional[X]`` → X), else
    None (``Any``, unions of several types, dataclasses, ...)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _plain_type(args[0]) if len(args) == 1 else None
    if origin is not None:
        hint = origin
    if hint in (list, tuple, typing.List, typing.Tuple):  # noqa: UP006
        return list
    if hint in (dict, typing.Dict):  # noqa: UP006
        return dict
    return hint if hint in (int, float, bool, str) else None


def _dataclass_type(config, key: str) -> tuple[type | None, str]:
    """The type the nearest dataclass around ``key`` declares for it (``(None, "")`` when none does)."""
    from omegaconf import DictConfig, OmegaConf

    parts = key.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        node = OmegaConf.select(config, ".".join(parts[:depth]), default=None, throw_on_missing=False)
        if not isinstance(node, DictConfig) or "_target_" not in node:
            continue
        if depth != len(parts) - 1:
            return None, ""  # a nested field inside a dataclass field: its own section says, or nothing
        target = str(node._get_node("_target_")._value())
        module, _, name = target.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            return None, ""
        if not dataclasses.is_dataclass(cls):
            return None, ""
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # noqa: BLE001  (a hint that does not evaluate: no type from it)
            return None, ""
        if parts[-1] not in hints:
            return None, ""
        return _plain_type(hints[parts[-1]]), f"{target}.{parts[-1]}"
    return None, ""


def _default_type(defaults, key: str) -> tuple[type | None, object]:
    """The type of ``key``'s value in the defaults config, and that value (``(None, None)`` when null/absent)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if defaults is None:
        return None, None
    try:
        node = defaults._get_node(key) if "." not in key else OmegaConf.select(defaults, key, default=None,
                                                                                throw_on_missing=False)
    except Exception:  # noqa: BLE001
        return None, None
    if key and "." not in key and node is not None and hasattr(node, "_value"):
        node = node._value()
    if isinstance(node, str) and "${" in node:
        return None, None
    if isinstance(node, DictConfig):
        return dict, OmegaConf.to_container(node)
    if isinstance(node, ListConfig):
        return list, OmegaConf.to_container(node)
    for t in (bool, int, float, str):
        if isinstance(node, t):
            return t, node
    return None, None


@dataclass(frozen=True)
class _Parsed:
    key: str
    value: object


def _value_overrides(overrides: list[str]) -> list[_Parsed]:
    """``key=value`` overrides with a value Hydra parsed (not group choices, deletions or sweeps)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = []
    for o in OverridesParser.create().parse_overrides(list(overrides)):
        if o.is_delete() or o.is_sweep_override() or o.package is not None or o.key_or_group.startswith("hydra."):
            continue
        try:
            value = o.value()
        except Exception:  # noqa: BLE001
            continue
        if isinstance(value, str) and "${" in value:
            continue
        out.append(_Parsed(o.key_or_group, value))
    return out


def group_overrides(overrides: list[str]) -> list[str]:
    """The config-group choices among ``overrides`` (``group=option``, ``group@pkg=option``: no dot in the key, or a
    package), which shape the defaults :func:`check_override_types` compares with."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return [text for text, o in zip(overrides, parsed) if not o.is_delete() and not o.is_add()
            and (o.package is not None or "." not in o.key_or_group)]


def wanted_type(config, defaults, key: str) -> tuple[type | None, str, object]:
    """``(type, where the type comes from, the key's default)`` for ``key`` (module docstring, in order); the type
    is None when nothing types the key."""
    t, source = _dataclass_type(config, key)
    default_t, default = _default_type(defaults, key)
    if t is not None:
        return t, f"field {source}", default
    if default_t in (int, float, bool):  # a YAML string or list default: verl often takes either (data.val_files)
        return default_t, f"verl's default {_hydra_value(default)}", default
    if key in NULL_DEFAULT_TYPES:
        return NULL_DEFAULT_TYPES[key], "verl reads it as a number; default null", None
    return None, "", None


def fix_for(key: str, wanted: type, default) -> str:
    """An override that passes the check: the default when it has the wanted type, else an example of the type."""
    value = default if default is not None and accepts(wanted, default) else None
    if value is None and default is None and key in NULL_DEFAULT_TYPES:
        return f"{key}=null (the default) or {_NAMES[wanted]}, e.g. {key}={_EXAMPLES[wanted]}"
    return f"{key}={_EXAMPLES[wanted] if value is None else _hydra_value(value)}"


def check_override_types(overrides: list[str], config, defaults) -> int:
    """Refuse the first override whose value is not of the type its key wants.

    Args:
        overrides: the Hydra overrides (the recipe's and the user's).
        config: the config composed with them (:func:`stapo_verl.launch.compose.compose_config`).
        defaults: the config composed with :func:`group_overrides` only (None: rules 1 and 3 only).

    Returns:
        How many overrides were checked against a type.
    Raises:
        OverrideTypeError: naming the key, the value, the type wanted, where the type comes from and the fix.
        OverrideValueError: (a subclass) a key of :data:`POSITIVE_KEYS` set to zero or less, naming the key, the
            value, what is allowed and the fix.
    """
    checked = 0
    for o in _value_overrides(overrides):
        wanted, source, default = wanted_type(config, defaults, o.key)
        if wanted is not None:
            checked += 1
            if not accepts(wanted, o.value):
                raise OverrideTypeError(o.key, o.value, wanted, source, fix_for(o.key, wanted, default))
        number = _number(o.value)
        if o.key in POSITIVE_KEYS and number is not None and number <= 0:
            raise OverrideValueError(o.key, o.value, POSITIVE_KEYS[o.key], positive_fix(o.key, default))
    return checked


def _number(value) -> float | None:
    """``value`` as a number (an int, a float or a string ``float()`` reads; not a bool), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def check_composed(overrides: list[str], config) -> int:
    """:func:`check_override_types` with the defaults composed here (:func:`group_overrides`). Raises as it does."""
    from stapo_verl.launch.compose import compose_config

    return check_override_types(overrides, config, compose_config(group_overrides(overrides)))
