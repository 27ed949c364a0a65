"""Benchmark: what the tracker diagnostics cost per rank per step at the production shape.

Shape: one DP rank's share of a production optimizer mini-batch (paper setup: 64 prompts × 8 samples × ~15,000
tokens over 16 DP ranks = 480,000 tokens, as 32 sequences × 15,000), candidate rate ~1e-3 (``bench_loss.py``'s
batch: p < τ_p on 1e-3 of the tokens, |Â| > 0 per sequence, a quarter of the sequences with Â < 0), the paper's S2T mask
(τ_p = 0.002, q = 0.75) applied first, as the worker does.

Timed, each as the median (and interquartile range) over ``--repeats`` runs after one warm-up, the components
interleaved in every repeat so a drift of the machine hits all of them alike:

* ``mask``: the S2T pre-pass alone (``apply_policy_token_mask``): what a mini-batch costs with
  ``policy_loss.mask_statistics=False`` (the reference point, not a diagnostics cost);
* ``mask+stats``: the pre-pass as the worker runs it with the statistics on (the default): the statistics
  (quantiles, fraction, position thirds, the silenced-gradient shares with Qwen3's |V| = 151,936, the four
  histograms) ride on the mask's candidates and its one DP exchange
  (:class:`stapo_verl.diagnostics.stats.MaskStatisticsObserver`); its excess over ``mask`` is the statistics' cost.
  Skipped (and said so) on a stapo-verl without the observer, which this tree is (the observer was removed: the
  upstream series carries nothing only the plugin uses); kept to compare with an earlier tree (``PYTHONPATH``);
* ``mask,stats``: the pre-pass, then :func:`stapo_verl.diagnostics.stats.mask_statistics` with the same |V| on its
  keep mask: the statistics on their own, selecting the candidates again, with an exchange of their own (how the
  worker runs them; on one process the exchanges are no-ops);
* ``stats``: that ``mask_statistics`` call alone;
* ``rows``: the token rows of the table (:func:`stapo_verl.minibatch.token_dump.minibatch_token_rows` under the
  256-row cap with a decode-counting tokenizer) — shared with the JSONL dump when both are on;
* ``ship``: the table's own worker-side work on a due step (:func:`cap_rows` + the pickle of what
  ``all_gather_object`` sends) and the bytes sent per rank;
* ``driver``: the driver's work on a due step: a ``wandb.Table``, the TensorBoard markdown and four raw histograms
  written to a ``SummaryWriter`` in a temporary directory;
* ``lm_head``: the norm of one rank's FSDP shard of Qwen3-8B's output weight (151,936 × 4,096 / 16 ranks, fp32) —
  once per optimizer step.

On one process the DP exchanges are no-ops (the saving of the statistics' own ``all_gather_object`` per mini-batch is
not in these times); what each rank sends is printed: the statistics' share of the mask's exchange (the histograms,
counts and bound sums, each candidate's third and bounds) and, for comparison, the standalone exchange of
``mask_statistics``, and the rows on due steps. Results are printed as ms per rank per step and ns per token.
Usage: ``python benchmarks/bench_diagnostics.py [--repeats 10] [--device cpu|cuda] [--clock wall|cpu]``
(``--clock cpu``: the process's CPU time on one torch thread, for a machine whose cores other jobs share).
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' support code
from bench_loss import RANK_SEQ_LEN, RANK_SEQS, _actor_config, _batch, _sync  # noqa: E402
from support.tokenizers import CountingTokenizer  # noqa: E402

#: Qwen3's |V| (the width of its logits), for the silenced-gradient share's upper bound
VOCAB_SIZE = 151_936
VOCAB_SHARD = (VOCAB_SIZE * 4_096) // 16


def _inputs(device):
    """One rank's production share, masked by S2T as the worker's pre-pass does."""
    import torch
    from tensordict import TensorDict

    from stapo_verl.core.losses import POLICY_LOSS_MASK_KEY, apply_policy_token_mask

    b = _batch(RANK_SEQS * RANK_SEQ_LEN, device, seed=1, bs=RANK_SEQS)
    b["adv"] = b["adv"] * torch.where(torch.arange(RANK_SEQS, device=device) % 4 != 3, 1.0, -1.0)[:, None]
    cfg = _actor_config("stapo")
    td = TensorDict({"old_log_probs": b["old"], "entropy": b["ent"], "advantages": b["adv"],
                     "response_mask": b["mask"].clone(), "loss_mask": b["mask"].clone(),
                     "responses": torch.randint(0, 151_936, b["mask"].shape, device=device)},
                    batch_size=[RANK_SEQS])
    metrics = apply_policy_token_mask(cfg, td, None)
    return cfg, td, td[POLICY_LOSS_MASK_KEY].bool(), metrics


def main(argv=None):
    """CLI: times the components, prints one line each and the per-step totals."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="wall: perf_counter; cpu: this process's CPU time on one torch thread (robust to other "
                         "processes competing for the cores; CPU device only)")
    a = ap.parse_args(argv)
    import torch
    from torch.utils.tensorboard import SummaryWriter

    import stapo_verl.plugin  # noqa: F401
    from stapo_verl.algo.s2t import candidate_mask
    from stapo_verl.core.losses import POLICY_LOSS_MASK_KEY, apply_policy_token_mask
    from stapo_verl.diagnostics import trackers
    from stapo_verl.diagnostics.shipping import cap_rows
    from stapo_verl.diagnostics import stats as stats_module
    from stapo_verl.diagnostics.stats import local_partials, mask_statistics
    from stapo_verl.minibatch.token_dump import minibatch_token_rows

    observer_class = getattr(stats_module, "MaskStatisticsObserver", None)  # None on an older stapo-verl

    torch.manual_seed(0)
    if a.clock == "cpu":
        if a.device != "cpu":
            ap.error("--clock cpu measures CPU time: use it with --device cpu")
        torch.set_num_threads(1)
    clock = time.process_time if a.clock == "cpu" else time.perf_counter
    cfg, td, keep, metrics = _inputs(a.device)
    n_tokens = int(td["response_mask"].sum())
    batch = {k: td[k] for k in ("old_log_probs", "entropy", "advantages", "response_mask")}
    args = (batch["old_log_probs"], batch["entropy"], batch["advantages"], batch["response_mask"], keep)
    shard = torch.randn(VOCAB_SHARD, device=a.device)
    tmp = tempfile.mkdtemp()
    writer = SummaryWriter(tmp)
    tok = CountingTokenizer()
    state = {}

    def mask():
        apply_policy_token_mask(cfg, td.clone(), None)

    def mask_and_stats():
        observer = observer_class(*args[:4], tau_p=cfg.policy_loss.s2t_tau_p, vocab_size=VOCAB_SIZE)
        apply_policy_token_mask(cfg, td.clone(), None, observer=observer)
        state["observed"] = observer

    def mask_then_stats():
        masked = td.clone()
        apply_policy_token_mask(cfg, masked, None)
        mask_statistics(*args[:4], masked[POLICY_LOSS_MASK_KEY].bool(), tau_p=cfg.policy_loss.s2t_tau_p,
                        vocab_size=VOCAB_SIZE)

    def stats():
        state["stats"] = mask_statistics(*args, tau_p=cfg.policy_loss.s2t_tau_p, vocab_size=VOCAB_SIZE)

    def rows():
        state["rows"] = minibatch_token_rows(td, batch, keep, config=cfg, step=3, minibatch=0, dp_rank=0,
                                             tokenizer=tok, budget=256, tau_h=metrics.get("actor/stapo/tau_h"))

    def ship():
        state["bytes"] = len(pickle.dumps(cap_rows(state["rows"], 256, seed=3)))

    def driver():
        import wandb

        rows_ = state["rows"]
        wandb.Table(columns=list(trackers.SCHEMA), data=[[r[c] for c in trackers.SCHEMA] for r in rows_])
        writer.add_text(trackers.TABLE_KEY, trackers.markdown_table(rows_, title="t"), 3)
        for name, h in state["stats"].histograms.items():
            if h.num:
                writer.add_histogram_raw(name, min=h.low, max=h.high, num=h.num, sum=h.total,
                                         sum_squares=h.total_sq, bucket_limits=list(h.edges[1:]),
                                         bucket_counts=list(h.counts), global_step=3)
        writer.flush()

    def lm_head():
        torch.nn.utils.get_total_norm([shard], norm_type=2.0).item()

    jobs = {"mask": mask, "mask+stats": mask_and_stats, "mask,stats": mask_then_stats, "stats": stats, "rows": rows,
            "ship": ship, "driver": driver, "lm_head": lm_head}
    if observer_class is None:
        del jobs["mask+stats"]
    times = {k: [] for k in jobs}
    for rep in range(a.repeats + 1):
        for name, fn in jobs.items():
            _sync(a.device)
            t0 = clock()
            fn()
            _sync(a.device)
            if rep:
                times[name].append(clock() - t0)
    st = state["stats"]
    partial = local_partials(*args, cfg.policy_loss.s2t_tau_p, vocab_size=VOCAB_SIZE)
    print(f"# one rank's share: {RANK_SEQS} x {RANK_SEQ_LEN} = {n_tokens} tokens on {a.device}; {st.n_candidates} "
          f"candidates ({st.n_candidates / n_tokens:.1e}), {int(metrics['actor/stapo/num_masked'])} silenced, "
          f"{len(state['rows'])} table rows; |V| = {VOCAB_SIZE}; median (IQR) of {a.repeats} interleaved repeats, "
          f"{a.clock} clock" + (", 1 torch thread" if a.clock == "cpu" else ""))
    if observer_class is None:
        print("# mask+stats skipped: this stapo-verl has no MaskStatisticsObserver (statistics on the mask's exchange); "
              f"mask_statistics' own exchange: {len(pickle.dumps(partial))} bytes per rank")
    else:
        observed = state["observed"]
        assert observed.statistics == st, "the statistics on the mask's exchange differ from mask_statistics"
        share = observed.share(candidate_mask(*args[:4], cfg.policy_loss.s2t_tau_p)[0])  # what the mask sends along
        print(f"# per-mini-batch DP exchange: the statistics' share of the mask's one exchange "
              f"{len(pickle.dumps(share))} bytes per rank (identical statistics); mask_statistics on its own: a second "
              f"exchange of "
              f"{len(pickle.dumps(partial))} bytes per rank")
    print(f"# rows on a due step: {state['bytes']} bytes per rank")
    for name, ts in times.items():
        q1, med, q3 = statistics.quantiles(ts, n=4, method="inclusive")
        per_token = f"{med / n_tokens * 1e9:8.2f} ns/token" if name != "driver" else "     (driver)"
        print(f"{name:10s} {med * 1e3:9.3f} ms (IQR {q1 * 1e3:.3f}-{q3 * 1e3:.3f}) {per_token}")
    med = {k: statistics.median(v) for k, v in times.items()}
    if "mask+stats" in med:
        on = med["mask+stats"] - med["mask"]
        print(f"statistics on the mask's exchange (mask+stats - mask): {on * 1e3:.2f} ms = {on / n_tokens * 1e9:.2f} "
              f"ns/token per mini-batch, one exchange; on their own (mask,stats - mask): "
              f"{(med['mask,stats'] - med['mask']) * 1e3:.2f} ms and a second exchange; with mask_statistics=False "
              f"the mini-batch costs the mask's own {med['mask'] * 1e3:.2f} ms")
    every = med["stats"] + med["lm_head"]
    due = med["rows"] + med["ship"]
    print(f"every step, per rank: stats (standalone) + lm_head = {every * 1e3:.2f} ms = {every / n_tokens * 1e9:.2f} "
          f"ns/token ({every / med['mask']:.2f}x the S2T mask's own {med['mask'] * 1e3:.2f} ms)")
    print(f"table step, per rank: + rows + ship = {due * 1e3:.2f} ms = {due / n_tokens * 1e9:.2f} ns/token (rows are "
          f"shared with the JSONL dump); driver {med['driver'] * 1e3:.2f} ms per table step")
    writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
