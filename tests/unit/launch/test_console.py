"""The run console: the log gets every byte, the terminal one line per step, errors (capped) and the summary line."""

from __future__ import annotations

import io

import pytest

from stapo_verl.launch.console import MAX_REPEATS, MAX_TAIL_CHARS, Console, log_tail, parse_metrics, run

RAY = "\x1b[36m(TaskRunnerV1 pid=9748)\x1b[0m "
TQ_WARNING = (RAY + "2026-12-01 15:28:47,747 - WARNING - transfer_queue.utils.common - target_num_threads 8 should "
              "not exceed total physical CPU cores 2. Setting to 2.")
VAL0 = RAY + "step:0 - val-aux/math_dapo/reward/mean@1:np.float64(0.075) - val-core/math_dapo/acc/mean@1:np.float64(0.5375)"


def _step(n: int, seconds: float, masked: int, extra: str = "") -> str:
    return (RAY + f"step:{n} - global_seqlen/min:6608.0 - actor/stapo/num_masked:{masked}.0 - actor/entropy:0.4321 - "
            f"critic/score/mean:np.float64(0.28125) - timing_s/step:{seconds}{extra}")


def _feed(lines: list[str], total: int | None = 20, first: int = 0) -> tuple[str, bytes]:
    src = io.BytesIO("".join(line + "\n" for line in lines).encode())
    out, log = io.StringIO(), io.BytesIO()
    console = Console(out, first_step=first, total_steps=total)
    run(src, log, console)
    console.close("RUN/train.log")
    return out.getvalue(), log.getvalue()


def test_parse_metrics_reads_plain_and_numpy_values():
    step, m = parse_metrics("step:3 - a/b:1.5 - c:np.float64(0.25) - d:np.int64(7) - e:text")
    assert step == 3 and m == {"a/b": 1.5, "c": 0.25, "d": 7.0}
    assert parse_metrics("Training Progress: 5%") is None


def test_one_line_per_step_with_progress_and_time_left():
    lines = [TQ_WARNING] * 674 + [VAL0, _step(1, 10.0, 7), _step(2, 12.0, 3, " - val-core/math_dapo/acc/mean@1:0.61")]
    out, log = _feed(lines)
    shown = out.splitlines()
    assert shown[0] == "[stapo] validation at step 0: accuracy math_dapo 0.537"
    assert shown[1] == ("[stapo] step 1/20 (  5 %) | reward 0.281 | entropy 0.432 | silenced 7 | 10.0 s | "
                        "~3m10s left")  # 19 steps x 10.0 s
    assert shown[2] == ("[stapo] step 2/20 ( 10 %) | reward 0.281 | entropy 0.432 | silenced 3 | "
                        "val math_dapo 0.610 | 12.0 s | ~3m18s left")  # 18 x mean(10, 12)
    assert shown[3] == f"[stapo] full log: RUN/train.log ({len(lines)} lines, {len(lines) - 3} not shown here)"
    assert len(shown) == 4  # the 674 warnings are in the log only
    assert log.decode() == "".join(line + "\n" for line in lines)


def test_errors_are_shown_at_most_max_repeats_times_with_their_count():
    err = RAY + "ModuleNotFoundError: No module named 'stapo_verl.rewards.worker'"
    out, _ = _feed([err] * 640, total=None)
    shown = out.splitlines()
    assert shown[:MAX_REPEATS] == ["ModuleNotFoundError: No module named 'stapo_verl.rewards.worker'"] * MAX_REPEATS
    assert shown[MAX_REPEATS].startswith("[stapo] (the line above repeated 640 times in all: ModuleNotFoundError")
    assert len(shown) == MAX_REPEATS + 2


def test_tqdm_carriage_returns_split_lines_and_a_closed_terminal_does_not_stop_the_log():
    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError

    data = b"[stapo recipe] a\rTraining Progress: 5%\r" + b"x" * 10 + b"\n[stapo] b"
    log = io.BytesIO()
    console = Console(Closed(), total_steps=None)
    run(io.BytesIO(data), log, console)
    # every byte, plus a newline ending the unterminated last line (the next invocation appends to the same log)
    assert log.getvalue() == data + b"\n" and console.lines == 4 and console.shown == 2


@pytest.mark.parametrize("total", [None, 3])
def test_last_step_has_no_time_left(total):
    out, _ = _feed([_step(3, 9.0, 1)], total=total)
    first = out.splitlines()[0]
    assert "left" not in first
    assert first.startswith("[stapo] step 3/3 (100 %)" if total else "[stapo] step 3 |")


def test_log_tail_drops_python_warnings_and_cuts_long_lines(tmp_path):
    log = tmp_path / "train.log"
    long = "Error executing job with overrides: [" + "'a=1', " * 200 + "]"
    log.write_text("\n".join([
        "first",
        "/x/verl/workers/engine/__init__.py:32: UserWarning: torchtitan engine is not available",
        "  warnings.warn(f\"torchtitan engine is not available: {e!r}\", stacklevel=1)",
        "\x1b[36m(TaskRunnerV1 pid=1)\x1b[0m kept line",
        "/y/megatron/core/optimizer/__init__.py:24: FutureWarning: deprecated",
        "  warnings.warn(",
        long,
        "StapoConfigError: actor_rollout_ref.actor.policy_loss.loss_mode='stapoo' is not a registered policy loss",
    ]) + "\n")
    tail = log_tail(str(log), 40)
    assert tail == ["first", "(TaskRunnerV1 pid=1) kept line", long[:MAX_TAIL_CHARS] + f" … ({len(long)} chars)",
                    "StapoConfigError: actor_rollout_ref.actor.policy_loss.loss_mode='stapoo' is not a registered "
                    "policy loss"]
    assert log_tail(str(log), 2) == tail[-2:] and log_tail(str(log), 0) == []


def test_a_stop_signal_keeps_the_console_running_and_hides_the_errors_of_processes_ending():
    import os
    import signal

    from stapo_verl.launch.console import follow_stop_signals

    out = io.StringIO()
    console = Console(out)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        follow_stop_signals(console)
        console.feed("ValueError: shown before the stop")
        for sig in (signal.SIGINT, signal.SIGTERM):
            os.kill(os.getpid(), sig)  # the handler runs here: the console (this process) goes on
        assert console.stopping
        console.feed("Traceback (most recent call last):")  # a Ray worker dying of the same signal
        console.feed("[stapo recipe] stopped by SIGTERM; the last complete checkpoint is ...")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert out.getvalue().splitlines() == ["ValueError: shown before the stop",
                                           "[stapo recipe] stopped by SIGTERM; the last complete checkpoint is ..."]
