"""The killable reward workers (pebble ProcessPool): timeouts kill and replace the worker, failures are reported,
and no worker outlives its parent. Every assertion is on an outcome that does not depend on a race: what should
finish gets a generous limit, what should be killed hangs forever (a power tower, ``time.sleep(10**6)``), and the
tests assert the kill and the replacement, not wall times."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from support.procs import no_shm_orphans_since

from stapo_verl.rewards import KillableRunner, compute_score
from stapo_verl.rewards.equivalence import answers_equivalent

#: Makes math_verify.verify evaluate a power tower: never finishes (https://github.com/huggingface/Math-Verify/issues/65).
HANG = "\\boxed{5^{5^{5^{5^{5}}}}}"
GENEROUS_S = 120.0
REPO = Path(__file__).resolve().parents[3]


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _processes_mentioning(text: str) -> list[int]:
    """PIDs of live processes whose command line contains ``text`` (the fork server's holds its ``sys.path``)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if text in (entry / "cmdline").read_bytes().decode("utf-8", "replace") and _alive(int(entry.name)):
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def _wait_no_process_mentioning(text: str, within_s: float = GENEROUS_S) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := _processes_mentioning(text)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _wait_gone(pid: int, within_s: float = GENEROUS_S) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_timeout_kills_the_worker_and_a_replacement_takes_over():
    runner = KillableRunner(timeout_s=GENEROUS_S, max_workers=1)
    try:
        first = runner.run(os.getpid)
        assert first.value is not None and not first.timed_out and first.error is None
        hung = runner.run(time.sleep, 10**6, timeout_s=1.0)
        assert hung.timed_out and hung.value is None and hung.error is None
        assert _wait_gone(first.value), "the timed-out worker is still running"
        second = runner.run(os.getpid)
        assert second.value != first.value and _alive(second.value)  # a new worker took over
        assert runner.run(answers_equivalent, "\\frac{1}{2}", "0.5").value is True
        assert runner.stats == {"calls": 4, "timeouts": 1, "errors": 0}
    finally:
        runner.close()
    assert _wait_gone(second.value), "close() left its worker running"


def test_the_limit_is_cpu_time_so_a_call_that_waits_for_the_cpu_is_not_cut_off():
    """A busy machine stretches a call's wall-clock time, not its CPU time: a call that waits 3 s using almost no
    CPU stays within a 1 s limit, and one long C call (no Python bytecode to interrupt) is ended at 1 s of CPU."""
    import math

    runner = KillableRunner(timeout_s=1.0, max_workers=1)
    try:
        waited = runner.run(time.sleep, 3.0)
        assert not waited.timed_out and waited.error is None
        busy = runner.run(math.factorial, 10**8)
        assert busy.timed_out and busy.value is None and busy.error is None
        assert runner.run(answers_equivalent, "\\frac{1}{2}", "0.5").value is True  # a replacement took over
        assert runner.stats == {"calls": 3, "timeouts": 1, "errors": 0}
    finally:
        runner.close()


def test_hanging_scorer_is_cut_off_through_compute_score():
    out = compute_score("math500", "The answer is " + HANG, "5", timeout_s=1.0)
    assert out == {"score": -1.0, "acc": False, "pred": "", "timeout": True, "no_box": False, "data_source": "math500",
                   "ground_truth_error": False}
    assert compute_score("math500", "\\boxed{5}", "5", timeout_s=GENEROUS_S)["acc"]  # the pool recovered


def test_scorer_errors_are_reported_not_raised():
    runner = KillableRunner(timeout_s=GENEROUS_S, max_workers=1)
    try:
        res = runner.run(int, "x")
        assert res.error == "ValueError: invalid literal for int() with base 10: 'x'"
        assert res.value is None and not res.timed_out
        assert runner.stats["errors"] == 1
        assert runner.run(os.getpid).error is None  # the worker survives a raising function
    finally:
        runner.close()
    with pytest.raises(ValueError, match="timeout_s must be > 0, got 0"):
        KillableRunner(timeout_s=0)
    with pytest.raises(ValueError, match="max_workers must be >= 1, got 0"):
        KillableRunner(max_workers=0)


def test_concurrent_calls_from_threads_get_their_own_results():
    runner = KillableRunner(timeout_s=GENEROUS_S, max_workers=2)
    golds = [str(i) for i in range(40)]
    results: dict[int, bool] = {}

    def work(i: int) -> None:
        pred = golds[i] if i % 3 else str(i + 1)
        results[i] = runner.run(answers_equivalent, pred, golds[i]).value

    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(GENEROUS_S)
    finally:
        runner.close()
    assert results == {i: bool(i % 3) for i in range(40)}


def _run_script(code: str, tmp_path: Path, extra_path: Path | None = None, timeout: float = GENEROUS_S):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(extra_path or ""), str(REPO)) if p))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=timeout)


def test_warm_up_failure_is_an_error_naming_the_cause(tmp_path):
    """math-verify missing in the workers' environment: the call raises WorkerStartError with the import error."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "math_verify.py").write_text("raise ModuleNotFoundError(\"No module named 'math_verify' (test)\")\n")
    proc = _run_script("""
        from stapo_verl.rewards import WorkerStartError, compute_score
        try:
            compute_score("math500", "\\\\boxed{1}", "1", timeout_s=60)
        except WorkerStartError as exc:
            print("RAISED", exc)
        else:
            print("NO ERROR")
    """, tmp_path, extra_path=fake)
    assert "RAISED reward worker could not import the scorers: ModuleNotFoundError: No module named " \
           "'math_verify' (test)" in proc.stdout, proc.stdout + proc.stderr


def test_a_fork_server_that_never_starts_is_an_error_and_is_killed(tmp_path):
    """An import that hangs forever in the fork server: the caller gets WorkerStartError, and no process is left."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "math_verify.py").write_text("import time\ntime.sleep(10**6)\n")
    proc = _run_script("""
        from stapo_verl.rewards import KillableRunner, WorkerStartError
        from stapo_verl.rewards.equivalence import answers_equivalent
        runner = KillableRunner(timeout_s=1, max_workers=1, start_timeout_s=3)
        try:
            runner.run(answers_equivalent, "1", "1")
        except WorkerStartError as exc:
            print("RAISED", exc)
    """, tmp_path, extra_path=fake)
    assert "RAISED reward workers did not start within start_timeout_s=3.0 s" in proc.stdout, \
        proc.stdout + proc.stderr
    assert _wait_no_process_mentioning(str(fake)) == []  # the stuck fork server was killed


def test_a_script_without_main_guard_is_not_rerun_in_the_workers(tmp_path):
    """multiprocessing would re-run the caller's main module in every forkserver child; ours do not."""
    marker = tmp_path / "runs.txt"
    proc = _run_script(f"""
        import os
        with open({str(marker)!r}, "a") as fh:
            fh.write(f"{{os.getpid()}}\\n")
        from stapo_verl.rewards import compute_score
        print("ACC", compute_score("math500", "\\\\boxed{{\\\\frac12}}", "0.5", timeout_s=60)["acc"])
    """, tmp_path)
    assert "ACC True" in proc.stdout, proc.stdout + proc.stderr
    assert len(marker.read_text().split()) == 1  # the script's top level ran once, in the script's process


def test_workers_die_with_a_killed_parent(tmp_path):
    """A SIGKILLed trainer must not leave a hung scorer worker behind (PR_SET_PDEATHSIG via the fork server)."""
    if not sys.platform.startswith("linux"):
        pytest.fail("PR_SET_PDEATHSIG is Linux-only; this project runs on Linux")
    (tmp_path / "hangmod.py").write_text(textwrap.dedent("""
        import os, time
        def hang(marker):
            with open(marker, "w") as fh:
                fh.write(str(os.getpid()))
            time.sleep(10**6)
    """))
    marker = tmp_path / "worker.pid"
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        from hangmod import hang
        from stapo_verl.rewards import KillableRunner
        KillableRunner(timeout_s=10**6, max_workers=1).run(hang, {str(marker)!r})
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    parent = subprocess.Popen([sys.executable, str(script)], env=env)
    try:
        deadline = time.monotonic() + GENEROUS_S
        while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        worker = int(marker.read_text())  # the worker is inside the hanging call now
        assert _alive(worker)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=GENEROUS_S)
        assert _wait_gone(worker), f"worker {worker} survived its SIGKILLed parent"
        assert _wait_no_process_mentioning(str(tmp_path)) == []  # nor did the fork server
    finally:
        if parent.poll() is None:
            parent.kill()


def test_an_exit_after_the_resource_tracker_was_killed_prints_no_traceback(tmp_path):
    """What a Ray worker's exit looks like when Ray killed its child processes first: the pool's process exits
    normally after its resource tracker was SIGKILLed. Its semaphores' finalizers would start a new tracker and send
    it names it never registered (``KeyError: '/mp-…'`` tracebacks on the console); with the pool's exit hook they
    do not, and the semaphores are unlinked all the same."""
    from stapo_verl.launch import shm

    started = time.time()
    proc = _run_script("""
        import os, signal
        from multiprocessing import resource_tracker
        from stapo_verl.rewards import KillableRunner
        from stapo_verl.rewards.equivalence import answers_equivalent
        runner = KillableRunner(timeout_s=60, max_workers=2)
        print("ANSWER", runner.run(answers_equivalent, "1/2", "0.5").value)
        os.kill(resource_tracker._resource_tracker._pid, signal.SIGKILL)
        os.waitpid(resource_tracker._resource_tracker._pid, 0)
        print("TRACKER KILLED", flush=True)
    """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "ANSWER True" in proc.stdout and "TRACKER KILLED" in proc.stdout, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "KeyError" not in proc.stderr, proc.stderr
    assert "relaunching" not in proc.stderr, proc.stderr  # no new tracker was started
    assert _wait_no_process_mentioning(str(tmp_path)) == []
    assert no_shm_orphans_since(started, ("sem.mp-",)), os.listdir(shm.SHM_DIR)  # the finalizers unlinked them
