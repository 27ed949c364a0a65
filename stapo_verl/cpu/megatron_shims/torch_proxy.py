"""A per-module stand-in for ``torch`` that maps megatron-core's CUDA-only calls to the CPU.

megatron-core 0.16.1 writes ``torch.cuda.current_device()``, ``torch.cuda.synchronize()``,
``torch.cuda.get_rng_state()`` and literal ``device="cuda"`` inside its functions. They cannot be fixed by
arguments. Instead of a global torch function mode (overhead on every op in the process) or editing
``torch.cuda`` for the whole process, :func:`install_into` rebinds the global name ``torch`` *only in the named
megatron modules* to a :class:`TorchOnCPU` object (one per module, held by that module). It forwards every
attribute to the real ``torch`` (cached on first use, so later lookups are plain module-dict hits) except:

* ``torch.cuda.current_device()`` → ``torch.device("cpu")``; ``synchronize``/``empty_cache`` → no-ops;
  ``Stream``/``current_stream``/``stream`` → torch's CPU stream API (``torch.cpu.Stream``: no-op streams);
  ``get_rng_state``/``set_rng_state``/``manual_seed`` → torch's CPU generator (the RNG tracker's fork then forks
  the CPU generator, as it forks the CUDA one on a GPU);
* the tensor factories ``zeros``/``ones``/``empty``/``full``/``tensor``/``arange`` with ``device`` ``"cuda"``
  (or ``"cuda:N"``, or a CUDA ``torch.device``) → ``device="cpu"``.

Every other module (verl, torch, the user's code) keeps the real ``torch``.
"""

from __future__ import annotations

import functools
import types

import torch

_FACTORIES = ("zeros", "ones", "empty", "full", "tensor", "arange", "zeros_like", "empty_like")
_CPU = torch.device("cpu")


def _is_cuda(device) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return False


def _cpu_factory(fn):
    @functools.wraps(fn)
    def factory(*args, **kwargs):
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = _CPU
            kwargs.pop("pin_memory", None)  # pinned host memory needs CUDA
        return fn(*args, **kwargs)

    return factory


class CudaOnCPU(types.ModuleType):
    """``torch.cuda`` as megatron-core sees it on the CPU platform (see module docstring)."""

    def __init__(self):
        super().__init__("stapo_verl.cpu.megatron_shims.torch_proxy.cuda")
        self.current_device = lambda: _CPU
        self.synchronize = lambda *a, **k: None
        self.empty_cache = lambda *a, **k: None
        self.get_rng_state = lambda *a, **k: torch.get_rng_state()
        self.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
        self.manual_seed = lambda seed: torch.manual_seed(seed)
        self.manual_seed_all = lambda seed: torch.manual_seed(seed)
        self.device_count = lambda: 1
        # side streams (Megatron-Bridge's DDP wrap, megatron/training/models/dist_utils.py): torch's CPU stream API,
        # whose streams are no-ops
        self.Stream = torch.cpu.Stream
        self.current_stream = torch.cpu.current_stream
        self.stream = torch.cpu.stream

    def __getattr__(self, name):
        value = getattr(torch.cuda, name)
        setattr(self, name, value)
        return value


class TorchOnCPU(types.ModuleType):
    """``torch`` as megatron-core sees it on the CPU platform: the real module plus :class:`CudaOnCPU`."""

    def __init__(self):
        super().__init__("stapo_verl.cpu.megatron_shims.torch_proxy.torch")
        self.cuda = CudaOnCPU()
        for name in _FACTORIES:
            setattr(self, name, _cpu_factory(getattr(torch, name)))

    def __getattr__(self, name):
        value = getattr(torch, name)
        setattr(self, name, value)
        return value


def install_into(module) -> bool:
    """Rebind ``module.torch`` to a new :class:`TorchOnCPU` (idempotent: a module whose ``torch`` already is one keeps
    it).

    Args:
        module: an imported module whose global ``torch`` is the real torch (``import torch``).
    Returns:
        True if it was rebound now, False if it already was.
    Raises:
        TypeError: the module has no global ``torch`` module (the site list no longer matches megatron-core).
    """
    current = getattr(module, "torch", None)
    if isinstance(current, TorchOnCPU):
        return False
    if current is not torch:
        raise TypeError(f"{module.__name__}: expected a global 'torch' module to shim, found {current!r}")
    module.torch = TorchOnCPU()
    return True
