"""CPU (gloo) support for verl 0.9.1's Megatron engine: megatron-core 0.16.1 + mbridge 0.15.1 shims.

Loaded by :func:`stapo_verl.cpu.register` (``VERL_PLATFORM=cpu`` only) through :func:`install_hooks`, a post-import
hook: nothing here imports megatron-core or mbridge until verl itself imports them, so processes that never touch
the Megatron engine pay nothing.

* when ``verl.workers.engine.megatron`` is imported → the ledger's megatron-core entries are checked, then
  :func:`stapo_verl.cpu.megatron_shims.engine.register_engines` and :func:`stapo_verl.cpu.megatron_shims.core.install`
  (megatron-core sites);
* when ``mbridge`` is imported (verl imports it lazily in ``_build_tf_config`` when ``vanilla_mbridge=True``) →
  the ledger's mbridge entries are checked, then :func:`stapo_verl.cpu.megatron_shims.bridge.install`.

Each shim names its site in its module's docstring and in the ledger (:mod:`stapo_verl.cpu.ledger`), is idempotent
and edits no installed file. Megatron-Bridge (verl's default ``vanilla_mbridge=False``) is not supported on the CPU:
it cannot be installed here (see docs/cpu_backend.md).
"""

from __future__ import annotations

from stapo_verl.integration.post_import import when_imported

ENGINE_MODULE = "verl.workers.engine.megatron"
MBRIDGE_MODULE = "mbridge"
BRIDGE_MODULE = "megatron.bridge"


def _on_engine(module) -> None:
    from stapo_verl.cpu import ledger
    from stapo_verl.cpu.megatron_shims import core, engine

    ledger.check(*ledger.megatron_core_patches())
    core.install()
    engine.register_engines(module)


def _on_mbridge(_module) -> None:
    from stapo_verl.cpu import ledger
    from stapo_verl.cpu.megatron_shims import bridge

    ledger.check(ledger.MBRIDGE_PATCHES, ledger.MBRIDGE_WRITTEN_FOR)
    bridge.install()


def _on_bridge(_module) -> None:
    from stapo_verl.cpu import ledger
    from stapo_verl.cpu.megatron_shims import megatron_bridge

    ledger.check(ledger.BRIDGE_PATCHES, ledger.BRIDGE_WRITTEN_FOR)
    megatron_bridge.install()


def install_hooks() -> None:
    """Apply the shims now for hooked modules already imported, else when they are first imported (idempotent).

    Each hook first checks its part of the ledger (:mod:`stapo_verl.cpu.ledger`), so a megatron-core or mbridge the
    shims were not written for fails at the import that would use them, naming the site.
    """
    from stapo_verl.cpu.megatron_shims import te_names

    te_names.install()
    when_imported(ENGINE_MODULE, _on_engine)
    when_imported(MBRIDGE_MODULE, _on_mbridge)
    when_imported(BRIDGE_MODULE, _on_bridge)
