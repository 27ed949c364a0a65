"""Diagnostic (off by default): log the structure of the TensorDict ``TrainingWorker.train_batch`` receives.

Enable in a CPU run by loading it in every process through verl's external-module hook::

    +ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=stapo_verl.cpu.debug_keys
    +ray_kwargs.ray_init.runtime_env.env_vars.STAPO_DEBUG_KEYS_FILE=/path/keys.json

On the first ``train_batch`` call per process it writes ``{key: description}`` (tensor shape/dtype, whether
nested/jagged, or the non-tensor value type) to ``STAPO_DEBUG_KEYS_FILE`` (or stderr). Wraps
``verl/workers/engine_workers.py`` ``TrainingWorker.train_batch`` with ``functools.wraps`` so verl's
dispatch metadata is kept, and marks the worker instance (``_stapo_keys_logged``); both are in the CPU platform's
ledger (:data:`stapo_verl.cpu.ledger.DEBUG_KEYS_PATCHES`). A debugging aid, never loaded by the recipes.
"""

from __future__ import annotations

import functools
import json
import os
import sys

from stapo_verl.cpu import register as _register

_register()  # the platform must exist before engine_workers (and the FSDP engine module) is imported

from verl.workers import engine_workers as _ew  # noqa: E402


def describe(td) -> dict[str, str]:
    """``{key: "Tensor[shape] dtype (nested)" | "non-tensor <type>: value"}`` for a TensorDict's top level."""
    import torch

    out = {}
    for k in sorted(td.keys()):
        v = td.get(k)
        if isinstance(v, torch.Tensor):
            nested = bool(getattr(v, "is_nested", False))
            shape = "jagged" if nested else list(v.shape)
            out[k] = f"Tensor{shape} {v.dtype}{' nested' if nested else ''}"
        else:
            data = getattr(v, "data", v)
            out[k] = f"non-tensor {type(data).__name__}: {str(data)[:60]}"
    return out


def _install() -> None:
    """Wrap ``TrainingWorker.train_batch`` (idempotent), after checking the ledger's entries for it
    (:data:`stapo_verl.cpu.ledger.DEBUG_KEYS_PATCHES`)."""
    from stapo_verl.cpu import ledger

    ledger.check(ledger.DEBUG_KEYS_PATCHES, ledger.VERL_WRITTEN_FOR)
    orig = _ew.TrainingWorker.train_batch
    if getattr(orig, "_stapo_debug_keys", False):
        return

    @functools.wraps(orig)
    def train_batch(self, data, *args, **kwargs):
        if not getattr(self, "_stapo_keys_logged", False):
            self._stapo_keys_logged = True
            info = describe(data)
            path = os.environ.get("STAPO_DEBUG_KEYS_FILE")
            if path:
                with open(path, "w") as f:
                    json.dump(info, f, indent=1)
            print("[stapo debug_keys] TrainingWorker.train_batch keys:", json.dumps(info, indent=1), file=sys.stderr)
        return orig(self, data, *args, **kwargs)

    train_batch._stapo_debug_keys = True
    _ew.TrainingWorker.train_batch = train_batch


_install()
