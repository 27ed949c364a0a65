"""verl 0.9.1's Megatron engine on the CPU platform.

Site: ``verl.workers.engine.megatron.transformer_impl`` register ``MegatronEngineWithLMHead`` /
``MegatronEngineWithValueHead`` with ``EngineRegistry.register(...)``, whose device defaults to ``"cuda"``
(``verl.workers.engine.base.EngineRegistry``); ``EngineRegistry.new`` looks the class up by ``get_device_name()``, i.e.
``"cpu"`` here. :func:`register_engines` adds the ``cpu`` keys for the same classes.

Everything else verl's engine needs on the CPU is either already device-neutral in verl (``get_device_id()``,
``get_torch_device()`` → :mod:`stapo_verl.cpu.platform`) or lives in megatron-core / mbridge
(:mod:`stapo_verl.cpu.megatron_shims.core`, :mod:`stapo_verl.cpu.megatron_shims.bridge`). ``set_random_seed``
(``verl.workers.engine.megatron.utils.set_random_seed``) calls ``model_parallel_cuda_manual_seed``, which the core shims route to the CPU
generator.
"""

from __future__ import annotations


def register_engines(module) -> None:
    """Register verl's Megatron engines for device ``cpu`` (idempotent).

    Args:
        module: ``verl.workers.engine.megatron.transformer_impl`` (or the package re-exporting its classes).
    """
    from verl.workers.engine.base import EngineRegistry

    for model_type, cls in (("language_model", module.MegatronEngineWithLMHead),
                            ("value_model", module.MegatronEngineWithValueHead)):
        existing = EngineRegistry._engines.get(model_type, {}).get("megatron", {})
        if "cpu" not in existing:
            EngineRegistry.register(model_type=model_type, backend="megatron", device="cpu")(cls)
