"""CPU (gloo) support for verl 0.9.1's Megatron engine: megatron-core 0.16.1 + mbridge 0.15.1 shims.

Loaded by :func:`stapo_verl.cpu.register` (``VERL_PLATFORM=cpu`` only) through :func:`install_hooks`, a post-import
hook: nothing here imports megatron-core or mbridge until verl itself imports them, so processes that never touch
the Megatron engine pay nothing.

* when ``verl.workers.engine.megatron`` is imported → :func:`stapo_verl.cpu.megatron_shims.engine.register_engines` and
  :func:`stapo_verl.cpu.megatron_shims.core.install` (megatron-core sites);
* when ``mbridge`` is imported (verl imports it lazily in ``_build_tf_config`` when ``vanilla_mbridge=True``) →
  :func:`stapo_verl.cpu.megatron_shims.bridge.install`.

Each shim names its site in its module's docstring, is idempotent and edits no installed file. Megatron-Bridge
(verl's default ``vanilla_mbridge=False``) is not supported on the CPU: it cannot be installed here (see
docs/cpu_backend.md).
"""

from __future__ import annotations

from stapo_verl.integration.post_import import when_imported

ENGINE_MODULE = "verl.workers.engine.megatron"
MBRIDGE_MODULE = "mbridge"


def _on_engine(module) -> None:
    from stapo_verl.cpu.megatron_shims import core, engine

    core.install()
    engine.register_engines(module)


def _on_mbridge(module) -> None:
    from stapo_verl.cpu.megatron_shims import bridge

    bridge.install()


_HOOKS = {ENGINE_MODULE: _on_engine, MBRIDGE_MODULE: _on_mbridge}


def install_hooks() -> None:
    """Apply the shims now for hooked modules already imported, else when they are first imported (idempotent)."""
    for name, hook in _HOOKS.items():
        when_imported(name, hook)
