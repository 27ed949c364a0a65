"""The console of a training run: everything goes to the log file, the terminal gets one line per step.

Usage (what ``recipes/common/cpu.sh`` pipes ``python -m verl.trainer.main_ppo`` through)::

    python -m stapo_verl.launch.train ... 2>&1 | python -m stapo_verl.launch.console --log RUN/train.log \\
        [--first-step K --total-steps N]

Every byte of the input is appended to ``--log`` unchanged (one file for every invocation of a run directory). The
step range comes from the options or from the line :func:`training_header` prints. The terminal gets:

* the lines of the recipes and tools (``[stapo …]``, ``[make_assets] …``);
* for every metrics record of verl's ``console`` logger (``step:N - key:value - …``, written by
  ``verl.utils.logger.aggregate_logger.LocalLogger``) one line: the progress (``step 3/20``), the reward, entropy,
  silenced tokens, the validation accuracy when there is one, the step time and the time left;
* lines that report an error (``Traceback``, ``…Error:``, ``ERROR``), each distinct text at most
  :data:`MAX_REPEATS` times (Ray workers repeat an error once per request);
* at the end, how many lines the log holds and how many were not shown.

On a failed run the recipe prints the tail of the log after this (``--tail N``: the last N lines without Python
warnings, long lines cut). A SIGINT or SIGTERM to the run's process group (Ctrl-C, Slurm's stop) does not stop the
console: it keeps copying until the run's output ends, so the run's last line (where it can resume) reaches the
terminal, and from then on shows no error lines, which are the other processes dying of the same signal
(:func:`follow_stop_signals`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter
from typing import BinaryIO, TextIO

PREFIX = "[stapo]"
#: how often one distinct error line is shown
MAX_REPEATS = 3
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: Ray's prefix of a forwarded worker line, e.g. ``(TaskRunnerV1 pid=9748)`` or ``(pid=8283, ip=10.0.0.2)``
_RAY_PREFIX = re.compile(r"^\((?:[A-Za-z_][\w.]*\s+)?pid=\d+(?:,\s*ip=[^)]*)?\)\s?")
_METRICS = re.compile(r"^step:(\d+) - (.*)$")
_NUMPY_SCALAR = re.compile(r"np\.\w+\((.*)\)")
_OWN = ("[stapo", "[make_assets]")
#: a Python warning line (``path:line: UserWarning: …``); the line after it is the source line ``warnings.warn(…``
_WARNING = re.compile(r"^\S*:\d+: \w*Warning: ")
#: longest line :func:`log_tail` prints (Hydra's "Error executing job with overrides" line runs to kilobytes)
MAX_TAIL_CHARS = 400
_ERROR = re.compile(r"Traceback \(most recent call last\)|^\w*(Error|Exception)\b.*:|\bERROR\b")
#: (label, metric-key regex, format) shown for a training step, in order, when logged
TRAIN_FIELDS = (
    ("reward", re.compile(r"^critic/score/mean$"), "{:.3f}"),
    ("entropy", re.compile(r"^actor/entropy$"), "{:.3f}"),
    ("silenced", re.compile(r"^actor/stapo/num_masked$"), "{:g}"),
    ("kept", re.compile(r"^actor/top_entropy/kept_frac$"), "{:.2f}"),
)
_VAL = re.compile(r"^val-core/([^/]+)/acc/mean@\d+$")
_STEP_TIME = "timing_s/step"
_HEADER = re.compile(r"^\[stapo recipe\] training (?P<run>.+) \(steps (?P<first>\d+)-(?P<last>\d+|\?)\)")


def training_header(run_dir: str, first_step: int, total_steps: int | None) -> str:
    """The line :mod:`stapo_verl.launch.train` prints before main_ppo starts; :class:`Console` reads the step range
    (``first_step`` = the checkpoint step, so steps ``first_step + 1``..``total_steps`` run) from it."""
    last = "?" if total_steps is None else str(total_steps)
    return (f"[stapo recipe] training {run_dir} (steps {first_step + 1}-{last}); starting Ray and the workers "
            f"takes a minute. Full log: {os.path.join(run_dir, 'train.log')}")


def _strip(line: str) -> str:
    """The text of a log line without colour codes and Ray's worker prefix."""
    return _RAY_PREFIX.sub("", _ANSI.sub("", line).strip("\r\n ")).strip()


def parse_metrics(text: str) -> tuple[int, dict[str, float]] | None:
    """``(step, {key: value})`` of a ``LocalLogger`` line (``step:N - k:v - …``); None for any other text.

    ``LocalLogger`` formats each value with ``pprint.pformat``, so a NumPy scalar reads ``np.float64(0.5)``; both
    forms are accepted. Values that are not numbers are skipped.
    """
    m = _METRICS.match(text)
    if not m:
        return None
    out: dict[str, float] = {}
    for item in m.group(2).split(" - "):
        key, sep, value = item.rpartition(":")
        if not sep:
            continue
        wrapped = _NUMPY_SCALAR.fullmatch(value.strip())
        try:
            out[key] = float(wrapped.group(1) if wrapped else value)
        except ValueError:
            continue
    return int(m.group(1)), out


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Console:
    """Turns the stream of a run into the terminal lines described in the module docstring.

    Args:
        out: the terminal stream.
        first_step: the step the run resumes from (0 for a fresh run).
        total_steps: the last step (None: unknown; then no percentage or time left). The time left is the mean
            ``timing_s/step`` so far times the steps to go (validation and checkpoint time not included).
    """

    def __init__(self, out: TextIO | None, first_step: int = 0, total_steps: int | None = None):
        self.out = out
        self.first_step = first_step
        self.total_steps = total_steps
        self.lines = 0
        self.shown = 0
        self.errors: Counter[str] = Counter()
        self.step_seconds: list[float] = []
        self.stopping = False  # a stop signal reached the run: error lines are its processes ending

    def _emit(self, text: str) -> None:
        self.shown += 1
        if self.out is None:
            return
        try:
            print(text, file=self.out, flush=True)
        except (BrokenPipeError, OSError):
            self.out = None  # the terminal went away: keep logging, never kill the run through its pipe

    def _step_line(self, step: int, metrics: dict[str, float]) -> str:
        val = {m.group(1): v for k, v in metrics.items() if (m := _VAL.match(k))}
        train = [(label, fmt.format(v)) for label, rx, fmt in TRAIN_FIELDS
                 for k, v in metrics.items() if rx.match(k)]
        if not train:  # a validation-only record (before training, or after the last step)
            accs = ", ".join(f"{src} {v:.3f}" for src, v in sorted(val.items()))
            return f"{PREFIX} validation at step {step}: accuracy {accs}" if accs else ""
        total = f"/{self.total_steps}" if self.total_steps else ""
        pct = f" ({100 * step / self.total_steps:3.0f} %)" if self.total_steps else ""
        parts = [f"{PREFIX} step {step}{total}{pct}"] + [f"{label} {value}" for label, value in train]
        parts += [f"val {src} {v:.3f}" for src, v in sorted(val.items())]
        if _STEP_TIME in metrics:
            self.step_seconds.append(metrics[_STEP_TIME])
            parts.append(f"{metrics[_STEP_TIME]:.1f} s")
        if self.total_steps and step < self.total_steps and self.step_seconds:
            per_step = sum(self.step_seconds) / len(self.step_seconds)
            parts.append(f"~{_duration(per_step * (self.total_steps - step))} left")
        return " | ".join(parts)

    def feed(self, raw: str) -> None:
        """Process one line of the run's output (already written to the log)."""
        self.lines += 1
        text = _strip(raw)
        if not text:
            return
        if text.startswith(_OWN):
            header = _HEADER.match(text)
            if header:
                self.first_step = int(header["first"]) - 1
                self.total_steps = None if header["last"] == "?" else int(header["last"])
            self._emit(text)
            return
        parsed = parse_metrics(text)
        if parsed is not None:
            line = self._step_line(*parsed)
            if line:
                self._emit(line)
            return
        if _ERROR.search(text) and not self.stopping:
            self.errors[text] += 1
            if self.errors[text] <= MAX_REPEATS:
                self._emit(text)

    def close(self, log_path: str) -> None:
        """Print what was not shown: repeated errors (with their count) and the log's size."""
        for text, n in self.errors.items():
            if n > MAX_REPEATS:
                self._emit(f"{PREFIX} (the line above repeated {n} times in all: {text[:120]})")
        hidden = self.lines - self.shown
        self._emit(f"{PREFIX} full log: {log_path} ({self.lines} lines, {max(hidden, 0)} not shown here)")


def log_tail(path: str, n: int) -> list[str]:
    """The last ``n`` lines of the log at ``path`` that are not Python warnings (a warning line and the source line
    under it are dropped), each cut to :data:`MAX_TAIL_CHARS` characters and stripped of ANSI colours."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    kept, skip_source = [], False
    for line in lines:
        text = _ANSI.sub("", line)
        if _WARNING.match(text):
            skip_source = True
            continue
        if skip_source and text.startswith(" "):
            skip_source = False
            continue
        skip_source = False
        kept.append(text if len(text) <= MAX_TAIL_CHARS else text[:MAX_TAIL_CHARS] + f" … ({len(text)} chars)")
    return kept[-n:] if n > 0 else []


def dead_actors(path: str) -> list[str]:
    """Ray actors the last invocation in the log at ``path`` reported dead (``ActorDiedError`` … ``class_name: X``),
    in the order first reported, each once; the last invocation starts at the last :func:`training_header` line."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [_ANSI.sub("", line) for line in f.read().splitlines()]
    start = max((i for i, line in enumerate(lines) if line.startswith("[stapo recipe] training ")), default=0)
    names, pending = [], False
    for line in lines[start:]:
        if "ActorDiedError" in line:
            pending = True
        elif pending and (m := re.search(r"class_name: (\S+)", line)):
            name = m.group(1).rsplit(".", 1)[-1]
            if name not in names:
                names.append(name)
            pending = False
    return names


def follow_stop_signals(console: Console) -> None:
    """SIGINT and SIGTERM (sent to the whole process group by Ctrl-C, ``kill -- -PGID`` or Slurm) set
    ``console.stopping`` instead of ending the console: the launcher handles the stop and prints where the run can
    resume (:func:`stapo_verl.launch.train.stop_on_signals`), and the console must live to show that line."""
    import signal

    def on_signal(_signum, _frame):
        console.stopping = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)


def run(src: BinaryIO, log: BinaryIO, console: Console) -> None:
    """Copy ``src`` to ``log`` byte for byte and feed each line (split at ``\\n`` and ``\\r``) to ``console``."""
    pending = b""
    while True:
        chunk = src.read1(65536) if hasattr(src, "read1") else src.read(65536)
        if not chunk:
            break
        log.write(chunk)
        log.flush()
        pending += chunk
        *lines, pending = re.split(rb"\r\n|\n|\r", pending)
        for line in lines:
            console.feed(line.decode("utf-8", errors="replace"))
    if pending:
        console.feed(pending.decode("utf-8", errors="replace"))
        log.write(b"\n")  # the next invocation of the run appends to this log: start it on a line of its own


def main(argv: list[str] | None = None) -> int:
    """CLI entry (see the module docstring). Always exits 0: the run's own exit status is the caller's."""
    ap = argparse.ArgumentParser(prog="python -m stapo_verl.launch.console", description=__doc__.splitlines()[0])
    ap.add_argument("--log", required=True, help="file that receives the whole output (appended to)")
    ap.add_argument("--first-step", type=int, default=0, help="the checkpoint step the run resumes from")
    ap.add_argument("--total-steps", type=int, default=None, help="the run's last step")
    ap.add_argument("--tail", type=int, default=None, metavar="N",
                    help="print the last N lines of --log without Python warnings (see log_tail) and exit")
    a = ap.parse_args(argv)
    if a.tail is not None:
        print("\n".join(log_tail(a.log, a.tail)))
        died = dead_actors(a.log)
        if died:
            print(f"[stapo] Ray actor(s) died during this run: {', '.join(died)} (the first is the cause; the others "
                  "failed on it). Search the log for ActorDiedError.")
        return 0
    console = Console(sys.stdout, a.first_step, a.total_steps)
    follow_stop_signals(console)
    with open(a.log, "ab") as log:
        run(sys.stdin.buffer, log, console)
    console.close(a.log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
