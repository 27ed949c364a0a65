"""The driver's side of the diagnostics: when to ask for a table, what to do with what comes back.

One :class:`DriverDiagnostics` lives on the trainer instance (built from the actor's policy-loss config). Per
update it says whether a token table is due (:meth:`DriverDiagnostics.table_due`); after the update it writes the
payloads' histograms and tables through verl's ``Tracking`` (:mod:`.trackers`), adds the collapse z-scores to the
step's metrics and prints the warnings (:mod:`.collapse`). verl-specific glue (where the payload is taken out of
the worker output) is in ``stapo_verl.integration``.
"""

from __future__ import annotations

from dataclasses import dataclass

from stapo_verl.diagnostics.collapse import CollapseMonitor
from stapo_verl.diagnostics.shipping import DiagnosticsPayload, table_due
from stapo_verl.diagnostics.trackers import TABLE_KEY, log_histograms, log_token_table, start_tensorboard_session


@dataclass
class DriverDiagnostics:
    """Per-run driver state of the diagnostics.

    Attributes:
        dump_tokens: ``policy_loss.dump_tokens`` (the rows of a table are the dump's selection).
        dump_every: ``policy_loss.dump_every`` (see :func:`stapo_verl.diagnostics.shipping.table_due`).
        dump_dir: ``policy_loss.dump_dir`` resolved in the driver's process (the run directory by default): where the
            driver writes every DP rank's JSONL dump (:func:`stapo_verl.minibatch.token_dump.write_step`).
        dump_glob: the dump's files (for the warning line).
        monitor: the collapse z-scores.
        last_table_step: the last step a token table was logged at (None before the first).
        session_started: whether this process has marked its first step in TensorBoard
            (:func:`stapo_verl.diagnostics.trackers.start_tensorboard_session`); not saved with a checkpoint.
        dump_started: whether this process has written the dump yet (its first write drops the rows an interrupted
            attempt wrote at or after that step); not saved with a checkpoint.
    """

    dump_tokens: bool
    dump_every: int | None
    dump_dir: str
    dump_glob: str
    monitor: CollapseMonitor
    last_table_step: int | None = None
    session_started: bool = False
    dump_started: bool = False

    @classmethod
    def from_policy_loss(cls, pl) -> DriverDiagnostics:
        """From a built policy-loss config (:class:`stapo_verl.integration.verl_0_9_1.policy_loss.config.StapoPolicyLossConfig`)."""
        from stapo_verl.minibatch.token_dump import resolve_dump_dir

        dump_dir = resolve_dump_dir(pl.dump_dir)
        return cls(dump_tokens=bool(pl.dump_tokens), dump_every=pl.dump_every, dump_dir=dump_dir,
                   dump_glob=f"{dump_dir}/stapo_tokens.dp*.jsonl",
                   monitor=CollapseMonitor(window=pl.collapse_window, warmup=pl.collapse_warmup_steps,
                                           threshold=pl.collapse_z_threshold))

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the driver state (JSON-serialisable): collapse windows, last table step."""
        return {"collapse_windows": self.monitor.state_dict(), "last_table_step": self.last_table_step}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            KeyError: a key of :meth:`state_dict` is missing. ValueError: see :meth:`CollapseMonitor.load_state_dict`.
        """
        self.monitor.load_state_dict(state["collapse_windows"])
        self.last_table_step = state["last_table_step"]

    def table_due(self, step: int, *, test_freq: int, total_steps: int) -> bool:
        """Whether to ask the workers for the token rows at ``step`` (never without ``dump_tokens``)."""
        return self.dump_tokens and table_due(step, dump_every=self.dump_every, test_freq=test_freq,
                                              total_steps=total_steps)

    def where(self) -> str:
        """Where the silenced tokens of this run can be read (the end of a warning line)."""
        if not self.dump_tokens:
            return ("Silenced tokens: not recorded (set actor_rollout_ref.actor.policy_loss.dump_tokens=True for "
                    "the JSONL dump and the tracker table).")
        table = (f"tracker table {TABLE_KEY} (last at step {self.last_table_step})" if self.last_table_step is not None
                 else f"tracker table {TABLE_KEY} (none logged yet)")
        return f"Silenced tokens: {table}; JSONL dump {self.dump_glob}."

    def after_update(self, tracking, step: int, metrics: dict, payloads: list[DiagnosticsPayload]) -> list[str]:
        """Write the token dump of every DP rank (when the payloads carry it), log the payloads through ``tracking``, add
        the z-scores to ``metrics`` (in place), print the warnings.

        Args:
            tracking: verl's ``Tracking`` (``PPOTrainer.logger``), or None (then nothing is written to trackers).
            step: verl's global step. metrics: the step's metrics so far (``actor/entropy`` comes from the
                old-log-prob pass, the gradient norms from this update). payloads: what the update sent back.

        Returns:
            The warning lines printed.
        """
        if tracking is not None and not self.session_started:
            # the first update of this process: events of an interrupted attempt at this step or later go
            start_tensorboard_session(tracking, step)
            self.session_started = True
        dump = {rank: rows for payload in payloads if payload.dump is not None for rank, rows in payload.dump.items()}
        if any(payload.dump is not None for payload in payloads):
            from stapo_verl.minibatch.token_dump import write_step

            write_step(self.dump_dir, step, dump, new_session=not self.dump_started)
            self.dump_started = True
        for payload in payloads:
            if tracking is None:
                break
            log_histograms(tracking, payload.histograms, step)
            if payload.rows and log_token_table(tracking, payload.rows, step, rows_selected=payload.rows_selected):
                self.last_table_step = step
        z, lines = self.monitor.observe(step, metrics, where=self.where())
        metrics.update(z)
        for line in lines:
            print(line, flush=True)
        return lines
