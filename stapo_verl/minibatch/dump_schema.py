"""The row schema of the silenced-token dump (``stapo_tokens.dp<rank>.jsonl``) and of the trackers' token tables.

One definition for the writer (:mod:`stapo_verl.minibatch.token_dump`, inside the actor workers) and the readers
(:mod:`stapo_verl.plots.loading`, the diagnostics' tables). Imports nothing heavy, so the plotting tools can read it
without importing torch or verl.
"""

from __future__ import annotations

from types import MappingProxyType

#: column → the JSON types a row may hold there (after ``json.loads``); ``tau_h`` is null when no candidate existed
ROW_TYPES = MappingProxyType({
    "step": (int,), "minibatch": (int,), "dp_rank": (int,), "sample_index": (int,), "position": (int,),
    "token_id": (int,), "token": (str,), "context": (str,), "p": (int, float), "entropy": (int, float),
    "advantage": (int, float), "tau_h": (int, float, type(None)), "tau_p": (int, float), "kind": (str,),
    "loss_mode": (str,), "stats_source": (str,),
})
#: the columns, in the order rows are written
SCHEMA = tuple(ROW_TYPES)
#: ``kind``: "silenced" (a candidate the mask removed) or "kept" (a candidate it kept, sampled as a contrast)
KINDS = ("silenced", "kept")
