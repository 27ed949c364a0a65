"""The gate of the CPU platform's and the reward code's ledgers (:func:`enforce_ledger`); the plugin's own gate is
:mod:`stapo_verl.integration.verl_0_9_1`."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterable

from stapo_verl.ledger import ALLOW_ENV, ledger_mismatches


def enforce_ledger(patches: Iterable, written_for: str, *, owner: str, remedy: str,
                   error: type[BaseException], log: logging.Logger) -> None:
    """The gate every ledger's ``check`` runs: raise ``error`` unless every entry's symbol exists with the signature
    (and source hash) it was written for.

    Args:
        patches: ledger entries (:class:`Patch`). written_for: what they were written against (for the message).
        owner: the part of stapo-verl the ledger belongs to, e.g. ``"CPU platform (VERL_PLATFORM=cpu)"``.
        remedy: what the user should do, ending with what :data:`ALLOW_ENV` lets them do anyway.
        error: the exception class to raise. log: the ledger module's logger (the warning is logged there too).

    Raises:
        error: a symbol is missing or differs (the message names the first one and the count), unless
            ``STAPO_ALLOW_UNSUPPORTED_VERL=1`` (then a warning on ``warnings`` and ``log``, listing every difference).
    """
    problems = ledger_mismatches(patches, written_for)
    if not problems:
        return
    message = (f"stapo-verl's {owner} was written for {written_for}; {len(problems)} site(s) differ, first: "
               f"{problems[0]}. {remedy}")
    if os.environ.get(ALLOW_ENV, "") == "1":
        warnings.warn(f"{message} Proceeding because {ALLOW_ENV}=1. All differences: {problems}", stacklevel=3)
        log.warning("%s Proceeding because %s=1.", message, ALLOW_ENV)
        return
    raise error(message)
