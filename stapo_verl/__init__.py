"""stapo-verl: STAPO (Spurious-Token-Aware Policy Optimization, arXiv 2602.15620) for verl 0.9.1.

Importing this package imports neither verl nor torch. The parts:

* :mod:`stapo_verl.plugin` — the ``verl.plugins`` entry point (verl imports it in every process);
* :mod:`stapo_verl.core` — the mask registry, policy token masks, ``ppo_loss`` with the mask (runs inside verl);
* :mod:`stapo_verl.algo` — the pure mask maths (torch only);
* :mod:`stapo_verl.minibatch` — current-policy statistics and the silenced-token dump;
* :mod:`stapo_verl.integration` — every touch of verl's private API, with its ledger and version gate, and
  what exists only for verl 0.9.1 (the policy-loss config class with the mask keys, its Hydra options);
* :mod:`stapo_verl.cpu` — a CPU platform for verl (loaded only with ``VERL_PLATFORM=cpu``);
* tools: :mod:`stapo_verl.rewards`, :mod:`stapo_verl.data`, :mod:`stapo_verl.eval`, :mod:`stapo_verl.plots`,
  :mod:`stapo_verl.launch`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    # The one version number lives in setup.cfg; the installed distribution's metadata carries it.
    __version__ = version("stapo-verl")
except PackageNotFoundError:  # a source tree that was never installed (pip install -e .)
    __version__ = "0+unknown"
