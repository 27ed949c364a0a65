"""Stop tokens of a chat-formatted model, read from the model's own files; the vLLM generation config that uses them.

Why: Qwen3 *base* checkpoints end a sequence with ``<|endoftext|>`` (``tokenizer_config.json`` ``eos_token`` and
``generation_config.json`` ``eos_token_id``), while their chat template ends an assistant turn with ``<|im_end|>``.
vLLM stops at the tokenizer's EOS plus the generation config's ``eos_token_id`` (``SamplingParams.
update_from_generation_config``), and verl 0.9.1's vLLM server sends no ``stop_token_ids`` (only its TRT-LLM server
adds ``<|im_end|>``, ``trtllm_async_server.py::_resolve_chat_stop_tokens``). A response can then run past its answer
into invented turns. The route that reaches verl's vLLM server without patching it is vLLM's own
``--generation-config <folder>`` engine argument, which verl passes through from
``actor_rollout_ref.rollout.engine_kwargs.vllm``: :func:`write_generation_config` writes that folder (the model's
generation config with ``eos_token_id`` extended by the end-of-turn token). The CPU rollout server and
``stapo_verl.eval.generate_vllm`` read the same ids through :func:`effective_stop_ids` / :func:`resolve`.

The end-of-turn token is found by rendering the model's chat template, not from a list of known names:
:func:`end_of_turn_token_id` renders one user/assistant exchange and takes the special token that directly follows
the assistant's content.

CLI (what the recipes run before training)::

    python -m stapo_verl.stop_tokens --model <hf dir or hub id> --out <folder>   # writes the folder's
                                                                                 # generation_config.json
    python -m stapo_verl.stop_tokens --model <hf dir or hub id>                  # prints the ids only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Optional

#: Text put in the assistant turn when rendering the chat template; plain ASCII so no template transforms it.
_PROBE = "STAPO_END_OF_TURN_PROBE"

#: Values of vLLM's ``generation_config`` engine argument that are not folders (vLLM ``ModelConfig``).
VLLM_GENERATION_CONFIG_KEYWORDS = ("auto", "vllm")


@dataclass(frozen=True)
class StopTokens:
    """The stop ids of one model.

    Attributes:
        eos_token_id: the tokenizer's EOS id (``tokenizer_config.json`` ``eos_token``), or None.
        generation_eos_ids: ``eos_token_id`` of the model's generation config, as a list (may be empty).
        end_of_turn_id: the special token the chat template puts after an assistant turn, or None (no template,
            or a template whose turn ends in plain text).
        ids: sorted union of the three: what generation must stop at.
        tokens: ``{id: token string}`` of ``ids``, for messages.
    """

    eos_token_id: Optional[int]
    generation_eos_ids: tuple[int, ...]
    end_of_turn_id: Optional[int]
    ids: tuple[int, ...]
    tokens: dict[int, str]

    def describe(self) -> str:
        """One line, e.g. ``[151643, 151645] (<|endoftext|>, <|im_end|>)``."""
        return f"{list(self.ids)} ({', '.join(self.tokens[i] for i in self.ids)})"


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [int(value)]
    return [int(v) for v in value]


def end_of_turn_token_id(tokenizer) -> Optional[int]:
    """Id of the special token that ends an assistant turn in ``tokenizer``'s chat template.

    Renders ``[user, assistant=<probe>]`` with ``apply_chat_template(tokenize=False)``, tokenizes the text after the
    probe and returns its first id if that id is one of the tokenizer's special / added tokens (for Qwen's ChatML:
    ``<|im_end|>``). Returns None when the tokenizer has no chat template, the probe is not rendered, or the turn
    is closed by ordinary text.
    """
    if not getattr(tokenizer, "chat_template", None):
        return None
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": _PROBE}], tokenize=False
    )
    at = text.rfind(_PROBE)
    if at < 0:
        return None
    tail = text[at + len(_PROBE):]
    ids = tokenizer(tail, add_special_tokens=False)["input_ids"] if tail else []
    if not ids:
        return None
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special.update(int(i) for i in (getattr(tokenizer, "added_tokens_decoder", {}) or {}))
    return int(ids[0]) if int(ids[0]) in special else None


def load_generation_config(source: str):
    """``transformers.GenerationConfig`` of ``source`` the way vLLM's ``try_get_generation_config`` loads it.

    ``generation_config.json`` of the folder / hub id when present, else derived from its ``config.json``; None when
    neither exists.
    """
    from transformers import AutoConfig, GenerationConfig

    try:
        return GenerationConfig.from_pretrained(source)
    except OSError:
        try:
            return GenerationConfig.from_model_config(AutoConfig.from_pretrained(source))
        except OSError:
            return None


def resolve(model: str, tokenizer=None) -> StopTokens:
    """Stop ids of ``model`` from its own tokenizer and generation config (no list of known token names).

    Args:
        model: a local HF directory or a hub id (needs the files in the HF cache or network access).
        tokenizer: an already-loaded tokenizer of ``model`` (loaded with ``AutoTokenizer`` when None).
    Raises:
        OSError: the tokenizer cannot be loaded.
        ValueError: the model defines no stop id at all (no EOS, no generation-config EOS, no end-of-turn token).
    """
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
    eos = tokenizer.eos_token_id
    gen = load_generation_config(model)
    gen_ids = _as_id_list(getattr(gen, "eos_token_id", None)) if gen is not None else []
    eot = end_of_turn_token_id(tokenizer)
    ids = sorted({*(i for i in (eos, eot) if i is not None), *gen_ids})
    if not ids:
        raise ValueError(f"{model}: no eos_token in the tokenizer, no eos_token_id in the generation config and no "
                         "end-of-turn token in the chat template: generation would never stop")
    return StopTokens(
        eos_token_id=None if eos is None else int(eos),
        generation_eos_ids=tuple(gen_ids),
        end_of_turn_id=eot,
        ids=tuple(ids),
        tokens={i: tokenizer.convert_ids_to_tokens(i) for i in ids},
    )


def write_generation_config(model: str, out_dir: str, tokenizer=None) -> StopTokens:
    """Write ``out_dir/generation_config.json``: ``model``'s generation config with ``eos_token_id`` = all stop ids.

    Point vLLM's ``generation_config`` engine argument (``actor_rollout_ref.rollout.engine_kwargs.vllm.
    generation_config``) at ``out_dir``. The other fields (sampling defaults, bos/pad ids) are the model's own, so
    vLLM's defaults are unchanged apart from the stop ids (verl's ``override_generation_config`` still wins for
    temperature / top-p / top-k / max tokens).

    Raises:
        OSError, ValueError: as :func:`resolve`.
    """
    from transformers import GenerationConfig

    stop = resolve(model, tokenizer)
    gen = load_generation_config(model) or GenerationConfig()
    gen.eos_token_id = list(stop.ids)
    os.makedirs(out_dir, exist_ok=True)
    gen.save_pretrained(out_dir)
    return stop


def effective_stop_ids(model: str, generation_config: Optional[str], tokenizer=None) -> list[int]:
    """Ids vLLM stops at for ``model`` under the engine argument ``generation_config`` (and the CPU server with it).

    vLLM: the tokenizer's EOS, plus ``eos_token_id`` of the generation config loaded from ``model`` (``None`` or
    ``"auto"``), from nowhere (``"vllm"``) or from the folder ``generation_config``.

    Raises:
        FileNotFoundError: ``generation_config`` names a folder without ``generation_config.json``.
    """
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
    ids = set() if tokenizer.eos_token_id is None else {int(tokenizer.eos_token_id)}
    if generation_config in (None, "", "auto"):
        gen = load_generation_config(model)
    elif generation_config == "vllm":
        gen = None
    else:
        path = os.path.join(os.path.expanduser(str(generation_config)), "generation_config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"engine_kwargs.vllm.generation_config={generation_config!r}: {path} does not exist "
                f"(allowed: {' | '.join(VLLM_GENERATION_CONFIG_KEYWORDS)} | a folder with generation_config.json; "
                "write one with `python -m stapo_verl.stop_tokens --model <model> --out <folder>`)"
            )
        with open(path, encoding="utf-8") as f:
            gen_ids = _as_id_list(json.load(f).get("eos_token_id"))
        return sorted(ids | set(gen_ids))
    if gen is not None:
        ids |= set(_as_id_list(getattr(gen, "eos_token_id", None)))
    return sorted(ids)


def main(argv: Optional[list[str]] = None) -> int:
    """CLI entry: print the stop ids of ``--model``; with ``--out``, write the generation config folder."""
    ap = argparse.ArgumentParser(prog="python -m stapo_verl.stop_tokens", description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="HF model directory or hub id")
    ap.add_argument("--out", default=None,
                    help="folder to write generation_config.json into (vLLM --generation-config)")
    a = ap.parse_args(argv)
    stop = write_generation_config(a.model, a.out) if a.out else resolve(a.model)
    where = f" -> {os.path.join(a.out, 'generation_config.json')}" if a.out else ""
    print(f"[stapo stop tokens] {a.model}: stop at {stop.describe()}{where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
