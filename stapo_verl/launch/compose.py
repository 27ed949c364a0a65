"""verl's trainer config, composed in this process exactly as ``python -m verl.trainer.main_ppo`` composes it.

``verl.trainer.main_ppo.main`` is ``@hydra.main(config_path="config", config_name="ppo_trainer",
version_base=None)``; run as a module, Hydra resolves that relative path to the package ``verl.trainer.config``.
:func:`compose_config` uses Hydra's compose API on the same package and name, after importing the plugin (whose
Hydra options, e.g. ``actor@actor_rollout_ref.actor=stapo_dp_actor``, must be registered first, as they are inside
``import verl``). ``tests/integration/launch`` checks it against ``main_ppo --cfg job`` itself.

Source: Hydra 1.3 "Compose API" (https://hydra.cc/docs/advanced/compose_api/); verl 0.9.1
``verl.trainer.main_ppo.main``.
"""

from __future__ import annotations

import os

#: the package holding verl 0.9.1's trainer configs (``main_ppo``'s ``config_path="config"``)
CONFIG_MODULE = "verl.trainer.config"
#: ``main_ppo``'s ``config_name``
CONFIG_NAME = "ppo_trainer"


def compose_config(overrides: list[str]):
    """Compose verl's trainer config with Hydra ``overrides`` (as ``python -m verl.trainer.main_ppo`` would).

    Args:
        overrides: Hydra override strings (``key=value``, ``+key=value``, ``++key=value``, ``group@pkg=option``).

    Returns:
        ``omegaconf.DictConfig``, unresolved (interpolations stay), in struct mode like ``@hydra.main``'s.

    Raises:
        hydra.errors.ConfigCompositionException: an override names a missing key (without ``+``), has a wrong
            type, or adds a key twice; the OmegaConf error is its ``__cause__``.
    """
    import stapo_verl.plugin  # noqa: F401  (registers the plugin's Hydra options, also on a verl it is not written for)
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=list(overrides))


def data_files(value) -> list[str]:
    """``data.train_files`` / ``data.val_files`` as a list of paths (verl accepts a string or a list)."""
    if value is None:
        return []
    return [str(value)] if isinstance(value, str) else [str(x) for x in value]


def train_rows(config) -> tuple[int | None, list[str]]:
    """Row count of ``data.train_files`` from the parquet footers (no data read), capped by ``train_max_samples``.

    Returns:
        ``(rows, missing)``: ``rows`` is None when a file is absent (``missing`` lists those).
    """
    import pyarrow.parquet as pq

    files = data_files(config.data.train_files)
    missing = [f for f in files if not os.path.isfile(os.path.expanduser(f))]
    if missing:
        return None, missing
    rows = sum(pq.ParquetFile(os.path.expanduser(f)).metadata.num_rows for f in files)
    cap = config.data.get("train_max_samples", -1)
    if cap is not None and cap > 0:
        rows = min(rows, int(cap))
    return rows, []
