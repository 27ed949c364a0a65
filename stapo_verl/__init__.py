"""stapo-verl: STAPO (Spurious-Token-Aware Policy Optimization, arXiv 2602.15620) for verl 0.9.1; imports neither verl
nor torch. The plugin (:mod:`.plugin`) installs the series (:mod:`.core`, :mod:`.algo`) through :mod:`.integration`;
the options, lab and tools: docs/architecture.md."""

from importlib.metadata import PackageNotFoundError, version

try:
    # The one version number lives in setup.cfg; the installed distribution's metadata carries it.
    __version__ = version("stapo-verl")
except PackageNotFoundError:  # a source tree that was never installed (pip install -e .)
    __version__ = "0+unknown"
