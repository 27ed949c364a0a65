"""Reward scorers: strict box (D13 fixed), math-verify equivalence, routing, verl loader, timeouts (D12)."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pytest

from stapo_verl.rewards import (
    DAPO_FORMAT,
    MATH_VERIFY,
    STRICT_BOX,
    KillableRunner,
    UnknownDataSourceError,
    compute_score,
    extract_boxed_answer,
    extract_final_answer,
    get_runner,
    score_math_verify,
    score_strict_box,
    scorer_for,
)
from stapo_verl.rewards.dapo import _load_verl_math_dapo
from stapo_verl.rewards.math_verify_scorer import answers_equivalent
from stapo_verl.eval.scoring import score_many

KEYS = {"score", "acc", "pred", "timeout", "no_box", "data_source"}
#: Makes math_verify.verify evaluate a power tower: hangs for minutes (verl_notes D12, Math-Verify #65).
HANG = "The answer is \\boxed{5^{5^{5^{5^{5}}}}}"
PAD = "Reasoning. " * 30  # 330 characters of filler


def _state(pid: int) -> str | None:
    """``/proc/<pid>/stat`` state letter, or None if the process does not exist."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _descendants() -> set[int]:
    """PIDs of this process's live (non-zombie) descendants (workers are children of the fork server)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    out, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - out
        out |= frontier
    return out


def _gone(pid: int, within_s: float = 3.0) -> bool:
    deadline = time.time() + within_s
    while time.time() < deadline:
        if _state(pid) in (None, "Z"):
            return True
        time.sleep(0.05)
    return False


# ---------------------------------------------------------------- strict box (training reward)


def test_strict_box_window_bug_d13_fixed():
    # The box starts 150 characters before the end: verl's strict check re-slices to 100 characters and misses it.
    resp = PAD + "\\boxed{34}" + " Double-checked, and every step above is consistent with the constraints." * 2
    assert 100 < len(resp) - resp.index("\\boxed{") < 300
    assert _load_verl_math_dapo().compute_score(resp, "34", strict_box_verify=True)["score"] == -1.0  # verl 0.9.1
    out = score_strict_box(resp, "34")
    assert out == {"score": 1.0, "acc": True, "pred": "34", "timeout": False, "no_box": False}


def test_strict_box_answer_longer_than_window_and_tail_rule():
    long_answer = "+".join(["x"] * 200)  # 399 characters: the box starts before the 300-character window
    assert score_strict_box(PAD + f"\\boxed{{{long_answer}}}", long_answer, normalize=False)["acc"]
    # A box that closes more than 300 characters before the end is not the final answer (as in verl).
    late = score_strict_box("\\boxed{34}" + PAD, "34")
    assert late["no_box"] and late["score"] == -1.0


def test_strict_box_pathological_shapes():
    assert score_strict_box("no box at all, answer 34", "34") == {
        "score": -1.0, "acc": False, "pred": "", "timeout": False, "no_box": True}
    assert score_strict_box("\\boxed{12} wait, \\boxed{34}", "34")["acc"]  # the last box counts
    assert not score_strict_box("\\boxed{34} wait, \\boxed{12}", "34")["acc"]
    assert extract_boxed_answer("so \\boxed{\\frac{a^{2}}{b_{1}}}.") == "\\frac{a^{2}}{b_{1}}"  # nested braces
    assert score_strict_box("\\boxed{34} then \\boxed{3", "34")["no_box"]  # truncated last box = no answer
    assert score_strict_box("\\boxed{34^\\circ}", "34")["acc"]  # verl's normalize_final_answer
    assert score_strict_box("\\boxed{1,000}", "1000")["acc"]
    assert not score_strict_box("\\boxed{1,000}", "1000", normalize=False)["acc"]  # JustRL's pure exact match
    t0 = time.perf_counter()
    big = "x" * 100_000 + "\\boxed{34}"
    assert score_strict_box(big, "34")["acc"] and score_math_verify(big, "34")["acc"]
    assert score_strict_box("\\boxed{" + "{" * 50_000, "34")["no_box"]  # 50k unclosed braces: linear scan
    # One "$" then 100k characters makes verl's normalize_final_answer regexes run for minutes (D12);
    # such long box contents are compared raw.
    assert not score_strict_box("\\boxed{$" + "x" * 100_000 + "}", "34")["acc"]
    # a super-linear regression would take minutes here (D12); the bound is loose for loaded CI machines
    assert time.perf_counter() - t0 < 20.0


# ---------------------------------------------------------------- math-verify (benchmarks)


@pytest.mark.parametrize(
    ("pred", "gold", "equal"),
    [
        ("\\frac{1}{2}", "0.5", True),
        ("\\dfrac{3}{4}", "\\frac34", True),
        ("(1,2]", "(1, 2]", True),
        ("[1,2]", "(1,2]", False),
        ("\\{1,2\\}", "\\{2,1\\}", True),
        ("3\\sqrt{2}", "\\sqrt{18}", True),
        ("10\\text{ cm}", "10", True),
        ("90^\\circ", "90", True),
        ("2,125", "2125", True),
        ("4.5\\times 10^{33}", "4.5e33", True),
        ("4.6\\times 10^{33}", "4.5e33", False),
        ("27", "27.0", True),
        ("x \\in [0, 1)", "[0,1)", True),
        ("\\frac{1}{2 n+2}", "$\\frac{1}{2 n+2}$", True),
        ("7", "8", False),
    ],
)
def test_math_verify_equivalence(pred, gold, equal):
    assert answers_equivalent(pred, gold) is equal


def test_math_verify_needs_a_box():
    assert score_math_verify("the answer is 5", "5")["no_box"]
    assert score_math_verify("first \\boxed{4}, finally \\boxed{5}", "5")["acc"]


# ---------------------------------------------------------------- routing and the verl entry point


def test_routing_and_uniform_keys():
    outs = [
        compute_score("math_dapo", "\\boxed{34}", "34"),
        compute_score("DAPO-17k", "no box", "34"),
        compute_score("math500", "\\boxed{\\frac12}", "0.5"),
        compute_score("aime2026", "\\boxed{025}", "25"),
        compute_score("gsm8k", "\\boxed{2,125}", "2125", extra_info={"split": "test"}, reward_router_address=None),
    ]
    assert all(set(o) == KEYS for o in outs)
    assert [o["data_source"] for o in outs] == ["math_dapo", "DAPO-17k", "math500", "aime2026", "gsm8k"]
    assert [o["acc"] for o in outs] == [True, False, True, True, True]
    assert [o["score"] for o in outs] == [1.0, -1.0, 1.0, 1.0, 1.0]
    # The strict scorer does not accept what only math-verify accepts.
    assert not compute_score("math_dapo", "\\boxed{\\frac{2}{4}}", "0.5")["acc"]
    assert compute_score("math_dapo", "\\boxed{\\frac{2}{4}}", "0.5", scorer="math_verify")["acc"]
    with pytest.raises(UnknownDataSourceError, match=r"data_source='gpqa'.*allowed.*math500"):
        compute_score("gpqa", "\\boxed{1}", "1")
    with pytest.raises(UnknownDataSourceError, match="scorer='nope'"):
        compute_score("math500", "\\boxed{1}", "1", scorer="nope")


def test_loaded_through_verl_custom_reward_loader():
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    cfg = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": "pkg://stapo_verl.rewards", "name": "compute_score", "reward_kwargs": {"timeout_s": 10}}}})
    fn = get_custom_reward_fn(cfg)
    # The reward-loop managers (naive.py/dapo.py) call it with these keywords.
    out = fn(data_source="math_dapo", solution_str=PAD + "\\boxed{34}", ground_truth="34", extra_info={"index": 0})
    assert out["score"] == 1.0 and out["acc"] is True and set(out) == KEYS


# ---------------------------------------------------------------- timeouts (verl_notes D12)


def test_hanging_parser_times_out_counted_and_no_leak():
    timeout = 1.5
    runner = KillableRunner(timeout_s=timeout, max_workers=1)
    try:
        res = runner.run(score_math_verify, "\\boxed{1}", "1")  # starts the worker (not charged to the timeout)
        assert res.value["acc"] and not res.timed_out
        before = _descendants() - set(runner.worker_pids())
        worker_pid = runner.worker_pids()[0]
        t0 = time.perf_counter()
        res = runner.run(score_math_verify, HANG, "5")
        wall = time.perf_counter() - t0
        assert res.timed_out and res.value is None
        assert wall < timeout + 1.0, f"hanging call returned after {wall:.2f}s (timeout {timeout}s)"
        assert runner.stats["timeouts"] == 1
        assert _gone(worker_pid) and runner.worker_pids() == []  # killed and reaped by the fork server
        assert runner.run(score_math_verify, "\\boxed{2}", "2").value["acc"]  # a fresh worker takes over
        new_pid = runner.worker_pids()[0]
    finally:
        runner.close()
    assert _gone(new_pid), "closed runner left its worker running"
    assert _descendants() <= before, f"reward worker processes leaked: {_descendants() - before}"


def test_degenerate_normalisation_input_is_cut_off_by_the_timeout():
    """D12 for the strict scorer's normaliser itself: the killable runner bounds it."""
    from stapo_verl.rewards.dapo import normalize_final_answer

    runner = KillableRunner(timeout_s=1.0, max_workers=1)
    try:
        runner.run(normalize_final_answer, "1")
        t0 = time.perf_counter()
        res = runner.run(normalize_final_answer, "$" + "x" * 100_000)
        assert res.timed_out and time.perf_counter() - t0 < 2.0
    finally:
        runner.close()


def test_compute_score_reports_timeout():
    t0 = time.perf_counter()
    out = compute_score("math500", HANG, "5", timeout_s=1.0)
    wall = time.perf_counter() - t0
    assert out == {"score": -1.0, "acc": False, "pred": "", "timeout": True, "no_box": False, "data_source": "math500"}
    assert wall < 2.0 + 1.0  # 1 s timeout (+ at most one worker start, which is excluded from the budget)
    assert compute_score("math500", "\\boxed{5}", "5")["acc"]  # the pool recovered


def test_per_call_overhead_and_thread_safety(capsys):
    get_runner()  # warm: the first call starts a worker
    compute_score("math_dapo", "\\boxed{1}", "1")
    times = []
    for i in range(100):
        t0 = time.perf_counter()
        compute_score("math_dapo", PAD + f"\\boxed{{{i}}}", str(i))
        times.append(time.perf_counter() - t0)
    median_ms = 1000 * statistics.median(times)
    with capsys.disabled():
        print(f"\nstrict-box compute_score through the killable worker: median {median_ms:.3f} ms/call")
    assert median_ms < 20, f"per-call overhead {median_ms:.1f} ms"
    items = [("math_dapo" if i % 2 else "math500", f"\\boxed{{{i}}}", str(i if i % 3 else i + 1)) for i in range(40)]
    results = score_many(items, threads=4)
    assert [r["acc"] for r in results] == [bool(i % 3) for i in range(40)]


def test_workers_die_with_a_killed_parent(tmp_path):
    """PR_SET_PDEATHSIG: a SIGKILLed trainer must not leave a hung scorer worker (or the fork server) behind."""
    import signal
    import subprocess
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux-only")
    code = (
        "import sys, time\n"
        "from stapo_verl.rewards import KillableRunner\n"
        "from stapo_verl.rewards.math_verify_scorer import score_math_verify\n"
        "r = KillableRunner(timeout_s=60, max_workers=1)\n"
        "r.run(score_math_verify, '\\\\boxed{1}', '1')\n"
        "print(r.worker_pids()[0], flush=True)\n"
        f"r.run(score_math_verify, {HANG!r}, '5')\n"  # hangs in the worker until we kill the parent
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(parent.stdout.readline())
        time.sleep(0.3)
        assert _state(worker) not in (None, "Z")
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert _gone(worker, 5.0), f"worker {worker} survived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.parametrize("manager_name", ["naive", "dapo"])
def test_through_verl_reward_loop_manager(manager_name):
    """verl 0.9.1's own reward-loop manager (``experimental/reward_loop/reward_manager``) calls our function."""
    import numpy as np
    import torch
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
    from verl.trainer.ppo.reward import get_custom_reward_fn

    class CharTokenizer:  # ids are code points: decode is exact and needs no model files
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(int(i)) for i in ids)

    cfg = OmegaConf.create({"reward": {"reward_kwargs": {}, "custom_reward_function": {
        "path": "pkg://stapo_verl.rewards", "name": "compute_score", "reward_kwargs": {}}}})
    manager = get_reward_manager_cls(manager_name)(cfg, CharTokenizer(), get_custom_reward_fn(cfg))
    outs = []
    for text, source, gt in [(PAD + "\\boxed{34}", "math_dapo", "34"), ("no box", "math_dapo", "34"),
                             ("\\boxed{\\frac{1}{2}}", "math500", "0.5"), (PAD + "\nAnswer: 34", "math_dapo", "34")]:
        ids = torch.tensor([ord(c) for c in text] + [0, 0])  # right padding, masked out below
        data = DataProto.from_dict(
            tensors={"prompts": torch.tensor([[1, 2]]), "responses": ids[None],
                     "attention_mask": torch.cat([torch.ones(2 + len(text)), torch.zeros(2)])[None].long()},
            non_tensors={"data_source": np.array([source], dtype=object),
                         "reward_model": np.array([{"ground_truth": gt, "style": "rule"}], dtype=object),
                         "extra_info": np.array([{"index": 0}], dtype=object)},
        )
        outs.append(manager.loop.run_until_complete(manager.run_single(data)))
    assert [o["reward_score"] for o in outs] == [1.0, -1.0, 1.0, 1.0]
    assert [o["reward_extra_info"]["acc"] for o in outs] == [True, False, True, True]
    assert [o["reward_extra_info"]["no_box"] for o in outs] == [False, True, False, False]
    assert all(set(o["reward_extra_info"]) >= KEYS for o in outs)


# ---------------------------------------------------------------- issue 9 item 5: equivalent notations

STRICT_ROUTES = ["math_dapo", "dapo-math-17k"]  # DAPO's integer answers: the strict scorers


@pytest.mark.parametrize("route", STRICT_ROUTES + ["math"])
@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\tfrac{1}{2}", "\\frac{1}{2}"),
        ("\\tfrac12", "\\frac{1}{2}"),
        ("20\\%", "20"),
        ("5.0", "5"),
        ("05", "5"),
        ("5", "5.0"),
    ],
)
def test_equivalent_notations_score_correct(route, pred, gold):
    out = compute_score(route, PAD + f"so the answer is $\\boxed{{{pred}}}$.", gold, timeout_s=0)
    assert out["score"] == 1.0 and out["acc"] is True, (route, pred, gold, out)


@pytest.mark.parametrize("route", STRICT_ROUTES)
@pytest.mark.parametrize(
    "resp",
    [
        "\\boxed{5.1}",  # a different number
        "\\boxed{50}",
        "\\boxed{-5}",
        "\\boxed{0.5}",
        "\\boxed{2\\%}",
        "\\boxed{\\frac{10}{2}}",  # equal value, not an equal string: only math-verify accepts this
        "\\boxed{5} wait, the final answer is \\boxed{6}",  # the last box counts
        "\\boxed{5}" + PAD,  # closed more than 300 characters before the end
        "\\boxed{5} then \\boxed{5",  # truncated last box: no answer
    ],
)
def test_strict_routes_stay_strict(route, resp):
    out = compute_score(route, resp, "5", timeout_s=0)
    assert out["score"] == -1.0 and out["acc"] is False, (route, resp, out)


def test_math_routes_to_math_verify():
    """Hendrycks MATH answers are LaTeX: ``math`` is scored by equivalence, not by the DAPO string match."""
    assert scorer_for("math") == MATH_VERIFY and scorer_for("MATH") == MATH_VERIFY
    assert scorer_for("math_dapo") == DAPO_FORMAT and scorer_for("dapo-math-17k") == STRICT_BOX
    assert compute_score("math", "\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}")["acc"]
    assert compute_score("math", "\\boxed{(1, 2]}", "(1,2]")["acc"]
    assert not compute_score("math", "\\boxed{[1, 2]}", "(1,2]")["acc"]


# ---------------------------------------------------------------- issue 9 item 6: DAPO's published answer line


def test_dapo_answer_line_on_math_dapo_rows():
    """The published DAPO-Math-17k prompt (``data_source=math_dapo``) asks for ``Answer: $Answer``."""
    line = PAD + "\nAnswer: 42"
    assert compute_score("math_dapo", line, "42") == {
        "score": 1.0, "acc": True, "pred": "42", "timeout": False, "no_box": False, "data_source": "math_dapo"}
    assert compute_score("math_dapo_reasoning", PAD + "\nanswer: $42$", "42")["acc"]
    assert compute_score("math_dapo", PAD + "\nAnswer: 41", "42")["score"] == -1.0
    assert compute_score("math_dapo", "\\boxed{41}\nAnswer: 42", "42")["acc"]  # the later final answer counts
    assert not compute_score("math_dapo", "Answer: 42\nNo, \\boxed{41}", "42")["acc"]
    assert compute_score("math_dapo", "Answer: \\boxed{42}", "42")["pred"] == "42"
    late = compute_score("math_dapo", "Answer: 42\n" + PAD, "42")  # outside the 300-character tail, like a box
    assert late["no_box"] and late["score"] == -1.0
    assert extract_final_answer(PAD + "\\boxed{7}") == "7"  # the box alone still works (prepare's prompt)
    # Box-only where the prompt never asks for the line: the SvS copy's name and the forced JustRL rule.
    assert not compute_score("dapo-17k", line, "42")["acc"]
    assert not compute_score("math_dapo", line, "42", scorer="strict_box")["acc"]


# ---------------------------------------------------------------- issue 9 item 7: a fork server that dies


def test_fork_server_dying_at_import_reports_exit_code_and_stderr(tmp_path, monkeypatch):
    """``math_verify`` missing in the server's environment: the error says so at once, with the exit code."""
    from stapo_verl.rewards.timeout import _Zygote

    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "math_verify.py").write_text("raise ModuleNotFoundError(\"No module named 'math_verify' (test)\")\n")
    monkeypatch.syspath_prepend(str(fake))  # the server's PYTHONPATH is built from our sys.path
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError) as info:
        _Zygote(start_timeout_s=60.0)
    message = str(info.value)
    assert "exited before it was ready" in message and "exit code 1;" in message, message
    assert "ModuleNotFoundError: No module named 'math_verify' (test)" in message, message
    assert time.perf_counter() - t0 < 30.0  # not the 60 s start timeout


def test_fork_server_hanging_at_import_is_killed_with_its_stderr(tmp_path, monkeypatch):
    from stapo_verl.rewards.timeout import _Zygote

    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "math_verify.py").write_text(
        "import sys, time\nprint('fake math_verify: stuck', file=sys.stderr, flush=True)\ntime.sleep(120)\n")
    monkeypatch.syspath_prepend(str(fake))
    with pytest.raises(RuntimeError) as info:
        _Zygote(start_timeout_s=3.0)
    message = str(info.value)
    assert "did not start within 3.0 s (killed), exit code -9;" in message, message
    assert message.rstrip().endswith("fake math_verify: stuck"), message
