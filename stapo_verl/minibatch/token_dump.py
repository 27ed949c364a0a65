"""Silenced-token dump: the tokens S2T silences each step, plus as many kept candidates for contrast, as JSONL.

Selected by the plugin's ``TrainingWorker.train_batch`` wrapper right after the mini-batch mask is computed, when
``actor_rollout_ref.actor.policy_loss.dump_tokens=True`` (:func:`minibatch_token_rows`), on one rank per DP rank
(FSDP: every rank, Ulysses SP rank 0; Megatron: TP rank 0, CP rank 0, last PP stage). The rows travel to the driver
with the update's metrics (:mod:`stapo_verl.diagnostics.shipping`: the nodes of a cluster need not share a disk),
which appends them at each step to ``<dump_dir>/stapo_tokens.dp{rank}.jsonl`` (:func:`write_step`), one file for
every DP rank that trains, empty while that rank has silenced nothing.

Schema (one JSON object per line; read by :mod:`stapo_verl.plots` — do not rename):

=============  =====================================================================================
step           int, verl global step
minibatch      int, optimizer mini-batch index within the step (0-based, over ``ppo_epochs``)
dp_rank        int, data-parallel rank that wrote the row
sample_index   int, row of the sample within this rank's mini-batch
position       int, response position (0 = first response token)
token_id       int
token          str, ``tokenizer.decode([token_id])``
context        str, decoded ±8 response tokens around it, the token wrapped as ``⟦token⟧``
p              float, probability of the token under the statistics' policy
entropy        float, entropy in nats at that position
advantage      float, Â of the sample
tau_h          float or null, τ_h of the mini-batch (null when the mode uses none)
tau_p          float
kind           "silenced" (in P, masked) or "kept" (in P, not masked; uniform sample, as many as silenced)
loss_mode      str
stats_source   str, the configured ``stats_source``
=============  =====================================================================================

Cost: the selection is one ``nonzero`` over the boolean masks (on the device) and a gather of the chosen rows;
decoding and JSON touch only the dumped rows (≤ ``dump_max_rows_per_step`` per rank per step), so the cost is
O(silenced tokens), not O(tokens). The JSONL follows verl's file logger convention (one JSON object per line).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch

from stapo_verl.algo.s2t import candidate_mask
from stapo_verl.algo.config_ranges import StapoConfigError
from stapo_verl.minibatch.dump_schema import SCHEMA

CONTEXT_TOKENS = 8
DEFAULT_SUBDIR = "stapo_tokens"


def resolve_dump_dir(dump_dir: str) -> str:
    """Absolute dump directory for ``policy_loss.dump_dir`` (see
    :class:`stapo_verl.integration.verl_0_9_1.policy_loss.config.StapoPolicyLossConfig`).

    ``""`` → the directory of ``$VERL_FILE_LOGGER_PATH`` (verl's file logger target, i.e. the run directory of
    the recipes) when it is set, else ``./stapo_tokens`` relative to this process's working directory.
    """
    if dump_dir:
        return os.path.abspath(os.path.expanduser(dump_dir))
    logger_path = os.environ.get("VERL_FILE_LOGGER_PATH", "")
    if logger_path:
        return os.path.dirname(os.path.abspath(logger_path))
    return os.path.abspath(DEFAULT_SUBDIR)


def dump_path(dump_dir: str, dp_rank: int) -> str:
    """``<resolved dump_dir>/stapo_tokens.dp{dp_rank}.jsonl``, with the directory created and writable.

    Raises:
        StapoConfigError: the directory cannot be created or written (names ``policy_loss.dump_dir``).
    """
    d = resolve_dump_dir(dump_dir)
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        raise StapoConfigError(
            f"actor_rollout_ref.actor.policy_loss.dump_dir={dump_dir!r} (resolved {d!r}) cannot be created: {e}"
        ) from e
    if not os.access(d, os.W_OK):
        raise StapoConfigError(
            f"actor_rollout_ref.actor.policy_loss.dump_dir={dump_dir!r} (resolved {d!r}) is not writable"
        )
    return os.path.join(d, f"stapo_tokens.dp{dp_rank}.jsonl")


def select_rows(
    silenced: torch.Tensor, kept_candidates: torch.Tensor, budget: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose the dumped (row, position) pairs: silenced first, then as many kept candidates, within ``budget``.

    Args:
        silenced, kept_candidates: (bs, T) bool (disjoint).
        budget: rows still allowed this step on this rank (≥ 0).
        generator: CPU generator; uniform draws without replacement when a set exceeds its share.
    Returns:
        (silenced_idx (n, 2) int64, kept_idx (m, 2) int64) on the CPU, with n = min(#silenced, budget) and
        m = min(n, #kept candidates, budget − n).
    """
    sil = silenced.nonzero().cpu()
    n = min(sil.shape[0], max(budget, 0))
    if n < sil.shape[0]:
        sil = sil[torch.randperm(sil.shape[0], generator=generator)[:n].sort().values]
    m = min(n, max(budget - n, 0))
    if m == 0:
        return sil, torch.zeros((0, 2), dtype=torch.int64)
    kept = kept_candidates.nonzero().cpu()
    if m < kept.shape[0]:
        kept = kept[torch.randperm(kept.shape[0], generator=generator)[:m].sort().values]
    return sil, kept


def context_strings(tokenizer, window: list[int], pos: int, width: int = CONTEXT_TOKENS) -> tuple[str, str]:
    """(decoded token, decoded context with the token wrapped as ⟦token⟧) for ``window[pos]``.

    ``window`` holds the response ids from ``max(0, t − width)`` to ``t + width`` (clipped at the response end)
    and ``pos`` is the token's index in it, so at most ``2·width + 1`` ids are decoded.
    """
    tok = tokenizer.decode([window[pos]])
    left = tokenizer.decode(window[max(0, pos - width) : pos])
    right = tokenizer.decode(window[pos + 1 : pos + 1 + width])
    return tok, f"{left}⟦{tok}⟧{right}"


@dataclass
class DumpContext:
    """Everything a row needs besides the per-token values (constant over one mini-batch)."""

    step: int
    minibatch: int
    dp_rank: int
    tau_h: float | None
    tau_p: float
    loss_mode: str
    stats_source: str


def build_rows(
    ctx: DumpContext,
    tokenizer,
    response_ids,
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    silenced_idx: torch.Tensor,
    kept_idx: torch.Tensor,
) -> list[dict]:
    """JSON-ready rows (schema :data:`SCHEMA`) for the chosen indices.

    Args:
        ctx: mini-batch constants. tokenizer: HF tokenizer (``decode``).
        response_ids: callable ``(i, lo, hi) -> list[int]``, response token ids ``lo:hi`` of sample i (clipped
            at its end), from :func:`response_id_getter`.
        log_prob, entropy, advantages: (bs, T) float, the statistics the mask used.
        silenced_idx, kept_idx: (n, 2) int64 (sample, position), from :func:`select_rows`.
    """
    rows = []
    for kind, idx in (("silenced", silenced_idx), ("kept", kept_idx)):
        if idx.numel() == 0:
            continue
        dev = log_prob.device
        i_dev, t_dev = idx[:, 0].to(dev), idx[:, 1].to(dev)
        lp = log_prob[i_dev, t_dev].double().cpu().tolist()
        ent = entropy[i_dev, t_dev].double().cpu().tolist()
        adv = advantages[i_dev, t_dev].double().cpu().tolist()
        for (i, t), lp_v, h_v, a_v in zip(idx.tolist(), lp, ent, adv, strict=True):
            lo = max(0, t - CONTEXT_TOKENS)
            window = response_ids(i, lo, t + CONTEXT_TOKENS + 1)  # only the ±8 window: O(rows), not O(tokens)
            tok, context = context_strings(tokenizer, window, t - lo)
            rows.append({
                "step": int(ctx.step), "minibatch": int(ctx.minibatch), "dp_rank": int(ctx.dp_rank),
                "sample_index": int(i), "position": int(t), "token_id": int(window[t - lo]), "token": tok,
                "context": context, "p": math.exp(lp_v), "entropy": h_v,
                "advantage": a_v, "tau_h": None if ctx.tau_h is None else float(ctx.tau_h),
                "tau_p": float(ctx.tau_p), "kind": kind, "loss_mode": ctx.loss_mode,
                "stats_source": ctx.stats_source,
            })
    return rows


def _last_line(path: str, chunk: int = 1 << 16) -> bytes:
    """The last non-empty line of ``path`` (b"" for a missing or empty file), read from the end."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            buf = b""
            while end > 0:
                start = max(0, end - chunk)
                f.seek(start)
                buf = f.read(end - start) + buf
                lines = buf.rstrip(b"\n").split(b"\n")
                if len(lines) > 1 or start == 0:
                    return lines[-1]
                end = start
    except FileNotFoundError:
        pass
    return b""


def drop_rows_from(path: str, step: int, minibatch: int) -> int:
    """Remove the rows at or after (``step``, ``minibatch``) from a dump: they were written by an attempt that did not
    reach its next checkpoint, and the resumed run is writing those mini-batches again. Returns how many were removed.

    O(1) when the file ends before (``step``, ``minibatch``), the normal case: only the last line is read. A partly
    written last line (a killed writer) is dropped too. The rewrite goes through a temporary file and ``os.replace``.
    """
    last = _last_line(path)
    if not last:
        return 0
    try:
        row = json.loads(last)
        if (int(row["step"]), int(row["minibatch"])) < (int(step), int(minibatch)):
            return 0
    except (ValueError, KeyError, TypeError):
        pass  # a torn last line: rewrite below
    kept, dropped = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
                if (int(row["step"]), int(row["minibatch"])) < (int(step), int(minibatch)):
                    kept.append(line if line.endswith("\n") else line + "\n")
                    continue
            except (ValueError, KeyError, TypeError):
                pass
            dropped += 1
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(kept)
    os.replace(tmp, path)
    return dropped


def append_jsonl(path: str, rows: list[dict]) -> None:
    """Append rows to ``path`` (one ``json.dumps`` line each, UTF-8, no ASCII escaping)."""
    if not rows:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def write_step(dump_dir: str, step: int, by_rank: dict[int, list[dict]], *, new_session: bool) -> dict[int, str]:
    """Append one step's rows of every DP rank to its file (created, empty, for a rank without rows); each file is
    closed, i.e. flushed, before this returns.

    Args:
        dump_dir: ``policy_loss.dump_dir`` (:func:`resolve_dump_dir` in the driver's process: the run directory).
        step: verl's global step of the rows. by_rank: DP rank → rows (schema :data:`SCHEMA`).
        new_session: the first step this process writes: the rows at or after ``step`` of every
            ``stapo_tokens.dp*.jsonl`` in the directory go first (an interrupted attempt wrote them, and the resumed
            run trains those steps again; :func:`drop_rows_from`).
    Returns:
        DP rank → the file written.
    Raises:
        StapoConfigError: the directory cannot be created or written.
    """
    paths = {int(rank): dump_path(dump_dir, int(rank)) for rank in by_rank}
    if new_session:
        d = resolve_dump_dir(dump_dir)
        for name in sorted(os.listdir(d)):
            if name.startswith("stapo_tokens.dp") and name.endswith(".jsonl"):
                drop_rows_from(os.path.join(d, name), step, 0)
    for rank, path in paths.items():
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in by_rank[rank]))
    return paths


def response_id_getter(data, valid: torch.Tensor):
    """``(i, lo, hi) -> list[int]``: response token ids ``lo:hi`` of sample i (clipped at its length).

    Uses ``responses`` (nested/jagged as TransferQueue delivers it, or padded (bs, T)); without it, the last
    ``len_i`` tokens of the nested ``input_ids`` (no-padding layout), ``len_i`` = Σ ``valid[i]`` (bs, T).
    Only the requested slice is copied to the host.

    Raises:
        KeyError: neither ``responses`` nor nested ``input_ids`` is in ``data``.
    """
    lens = valid.sum(-1).cpu().tolist()
    keys = set(data.keys())
    if "responses" in keys and data["responses"].is_nested:
        r = data["responses"]
        vals, offs = r.values(), r.offsets().cpu().tolist()
        return lambda i, lo, hi: vals[offs[i] + lo : min(offs[i] + hi, offs[i + 1])].tolist()
    if "responses" in keys:
        r = data["responses"]
        return lambda i, lo, hi: r[i, lo : min(hi, int(lens[i]))].tolist()
    if "input_ids" in keys and data["input_ids"].is_nested:
        x = data["input_ids"]
        vals, offs = x.values(), x.offsets().cpu().tolist()

        def ids(i, lo, hi):
            start = offs[i + 1] - int(lens[i])
            return vals[start + lo : min(start + hi, offs[i + 1])].tolist()

        return ids
    raise KeyError("the token dump needs the mini-batch field 'responses' (or nested 'input_ids')")


def minibatch_token_rows(data, batch: dict, keep: torch.Tensor, *, config, step: int, minibatch: int, dp_rank: int,
                         tokenizer, budget: int, tau_h: float | None) -> list[dict]:
    """This rank's rows for one optimizer mini-batch (schema :data:`SCHEMA`), not written anywhere.

    Silenced = candidates ∧ ¬K; kept contrast = candidates ∧ K, uniformly sampled, as many as silenced rows; at most
    ``budget`` rows (silenced first). The draw is seeded by (step, mini-batch, DP rank), so reruns select the same
    rows. Arguments as :func:`dump_minibatch_tokens`.
    """
    if budget <= 0:
        return []
    pl = config.policy_loss
    valid = batch["response_mask"].bool()
    lp, ent, adv = batch["old_log_probs"], batch["entropy"], batch["advantages"]
    keep = keep.bool().to(valid.device)
    cand, _ = candidate_mask(lp, ent, adv, valid, pl.s2t_tau_p)
    generator = torch.Generator().manual_seed((int(step) * 1_000_003 + int(minibatch)) * 4099 + int(dp_rank))
    sil_idx, kept_idx = select_rows(cand & ~keep, cand & keep, budget, generator)
    if sil_idx.numel() == 0 and kept_idx.numel() == 0:
        return []
    ctx = DumpContext(step=step, minibatch=minibatch, dp_rank=dp_rank, tau_h=tau_h, tau_p=pl.s2t_tau_p,
                      loss_mode=pl.loss_mode, stats_source=pl.stats_source)
    return build_rows(ctx, tokenizer, response_id_getter(data, valid), lp.float(), ent.float(), adv.float(),
                      sil_idx, kept_idx)


def dump_minibatch_tokens(data, batch: dict, keep: torch.Tensor, *, config, step: int, minibatch: int, dp_rank: int,
                          tokenizer, budget: int, tau_h: float | None) -> int:
    """Append this rank's rows for one optimizer mini-batch (:func:`minibatch_token_rows`); returns how many.

    Args:
        data: the mini-batch TensorDict (for the response token ids).
        batch: the padded (bs, T) fields the mask read: ``old_log_probs``, ``entropy``, ``advantages``,
            ``response_mask``. keep: (bs, T) bool, the mask's keep decision (``policy_loss_mask``).
        config: actor config (``policy_loss``: ``tau_p``, ``loss_mode``, ``token_mask``, ``stats_source``,
            ``dump_dir``). step, minibatch, dp_rank: where the rows come from. tokenizer: HF tokenizer.
        budget: rows still allowed this step on this rank. tau_h: τ_h of the mini-batch, or None.

    Raises:
        StapoConfigError: the dump directory cannot be created or written.
    """
    rows = minibatch_token_rows(data, batch, keep, config=config, step=step, minibatch=minibatch, dp_rank=dp_rank,
                                tokenizer=tokenizer, budget=budget, tau_h=tau_h)
    if rows:
        append_jsonl(dump_path(config.policy_loss.dump_dir, dp_rank), rows)
    return len(rows)
