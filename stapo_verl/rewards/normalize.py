"""Answer-string normalisation shared by the scorers: verl's two normalisers (called, not copied) and plain numbers.

* :func:`normalize_final_answer` is verl's ``utils/reward_score/math_dapo.py`` normaliser (DAPO/Minerva: units,
  ``\\text{}``, ``$``, ``\\fracab`` → ``\\frac{a}{b}``, ``1,000`` → ``1000``).
* :func:`strip_string` is verl's ``utils/reward_score/math_reward.py`` normaliser (Hendrycks MATH: ``\\dfrac`` and
  ``\\tfrac`` → ``\\frac``, ``\\%`` removed, ``\\left``/``\\right`` removed, ``a/b`` → ``\\frac{a}{b}``,
  ``.5`` → ``0.5``, ``0.5`` → ``\\frac{1}{2}``).
* :func:`canonical_answer` chains the two; :func:`as_number` reads a plain decimal number (``05`` = ``5.0`` = ``5``).

Both verl files import only ``re``/``typing``; they are loaded straight from the installed wheel
(:func:`load_verl_reward_module`), so a reward worker does not pay for ``import verl`` (torch and the plugins).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from decimal import Decimal, InvalidOperation
from types import ModuleType

_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(\D|$))")
# LaTeX scientific notation, e.g. Minerva-style "4.5 \times 10^{33}" (gold answers there are written "4.5e33").
_LATEX_SCI = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:\\times|\\cdot)10\^\{?([+-]?\d+)\}?$")

_MODULES: dict[str, ModuleType] = {}


def load_verl_reward_module(name: str) -> ModuleType:
    """Load ``verl/utils/reward_score/<name>.py`` without executing ``verl/__init__.py`` (cached).

    Importing the ``verl`` package pulls in torch and the plugin entry points (~6 s on a loaded CPU), which would
    make every reward worker start slowly. ``math_dapo.py`` and ``math_reward.py`` only import ``re``/``typing``.
    Falls back to a normal import when the file is not found (unusual installs).

    Args:
        name: module name under ``verl/utils/reward_score`` (``"math_dapo"`` or ``"math_reward"``).

    Raises:
        ImportError: verl is not installed.
    """
    module = _MODULES.get(name)
    if module is not None:
        return module
    spec = importlib.util.find_spec("verl")
    path = None
    if spec is not None and spec.submodule_search_locations:
        path = os.path.join(list(spec.submodule_search_locations)[0], "utils", "reward_score", f"{name}.py")
    if path is not None and os.path.exists(path):
        file_spec = importlib.util.spec_from_file_location(f"_stapo_verl_{name}", path)
        module = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(module)
    else:  # pragma: no cover - unusual installs only
        module = importlib.import_module(f"verl.utils.reward_score.{name}")
    _MODULES[name] = module
    return module


def normalize_final_answer(answer: str) -> str:
    """verl's ``math_dapo.normalize_final_answer``.

    Args:
        answer: a final-answer string, e.g. the content of a ``\\boxed{}``.

    Returns:
        The normalised string (units/``\\text``/``$`` removed, ``\\fracab`` expanded, ``1,000`` → ``1000``).
    """
    return load_verl_reward_module("math_dapo").normalize_final_answer(answer)


def strip_string(answer: str) -> str:
    """verl's ``math_reward.strip_string`` (Hendrycks MATH), or ``answer`` unchanged where it raises.

    verl's own ``math_reward.is_equiv`` treats an exception the same way (it then compares the raw strings): the
    function asserts on two ``"\\text{ "`` and indexes past a trailing ``\\frac``/``\\sqrt``.

    Args:
        answer: a final-answer string.

    Returns:
        The normalised string (``\\dfrac``/``\\tfrac`` → ``\\frac``, ``\\%`` and spaces removed, ...).
    """
    try:
        return load_verl_reward_module("math_reward").strip_string(answer)
    except (AssertionError, IndexError, ValueError):
        return answer


def canonical_answer(answer: str) -> str:
    """``strip_string(normalize_final_answer(answer))``: the form the strict scorer compares.

    Example: ``"\\dfrac{1}{2}"``, ``"\\tfrac12"`` and ``"\\frac{1}{2}"`` all give ``"\\frac{1}{2}"``; ``"20\\%"`` gives
    ``"20"``. Linear-time string replacements after verl's normaliser (which is super-linear on adversarial input,
    D12: callers cap the length and run through the killable runner).
    """
    return strip_string(normalize_final_answer(answer))


def as_number(text: str) -> Decimal | None:
    """Parse a plain decimal number after light clean-up (``$``, spaces, thousands commas, ``a\\times 10^{b}``,
    verl's normalisers).

    Args:
        text: an answer string such as ``"2,125"``, ``"27.0"``, ``"05"``, ``"20\\%"`` or ``"\\$18"``.

    Returns:
        The value as :class:`~decimal.Decimal` (``Decimal("5.0") == Decimal("05") == 5``), or ``None`` if ``text``
        is not a plain number.
    """
    s = text.strip().strip("$").replace("\\!", "").replace("\\,", "").replace(" ", "")
    s = _THOUSANDS.sub("", s)
    sci = _LATEX_SCI.match(s)
    if sci:
        s = f"{sci.group(1)}e{sci.group(2)}"
    if not _NUMBER.match(s):
        s = _THOUSANDS.sub("", normalize_final_answer(s))
        if not _NUMBER.match(s):
            s = strip_string(s)  # "20\%" -> "20" (verl's MATH normaliser drops the percent sign)
            if not _NUMBER.match(s):
                return None
    try:
        return Decimal(s)
    except InvalidOperation:
        return None
