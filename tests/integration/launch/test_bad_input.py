"""Bad input stops the launcher before Ray, in one line naming the fix (``stapo_verl.launch.train.checked_config``).

The four cases a new user meets on the tiny recipe: a train parquet without ``reward_model``, a prompt 10x longer than
``data.max_prompt_length``, a policy-loss value out of range, and a verl the plugin was not written for. Each returns
the launcher's :data:`~stapo_verl.launch.errors.EXIT_CONFIG` from ``main`` without calling the trainer entry.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stapo_verl.algo.config_ranges import KEY, RANGES
from stapo_verl.data.schema import arrow_schema
from stapo_verl.launch import train
from stapo_verl.launch.console import Console
from stapo_verl.launch.errors import EXIT_CONFIG, default_of


def _rows(question="What is 2+3?"):
    return [{"data_source": "math_dapo", "prompt": [{"role": "user", "content": question}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": "5"},
             "extra_info": {"split": "train", "index": 0, "benchmark": "math_dapo", "problem_id": "0",
                            "source_row": 0, "problem": question}}]


def _parquet(path, question="What is 2+3?", drop=()):
    table = pa.Table.from_pylist(_rows(question), schema=arrow_schema())
    pq.write_table(table.drop_columns(list(drop)) if drop else table, path)
    return str(path)


def _model(tmp_path):
    """A local model directory as far as the launcher reads it: a tokenizer with a chat template and config.json."""
    from stapo_verl.cpu.make_assets import build_tokenizer

    build_tokenizer(["What is 2+3? " * 20], tmp_path / "model")
    (tmp_path / "model" / "config.json").write_text("{}")
    return str(tmp_path / "model")


def _overrides(train_file, val_file, *extra, model=None):
    out = [f"data.train_files=['{train_file}']", f"data.val_files=['{val_file}']",
           "reward.custom_reward_function.path=pkg://stapo_verl.rewards",
           "reward.custom_reward_function.name=compute_score", "data.max_prompt_length=64",
           "actor@actor_rollout_ref.actor=stapo_dp_actor", "actor_rollout_ref.actor.policy_loss.loss_mode=stapo",
           "data.filter_overlong_prompts=False", "data.truncation=error", *extra]
    return out + ([f"actor_rollout_ref.model.path='{model}'"] if model else [])


@pytest.fixture
def never_trains(monkeypatch):
    """The trainer entry the launcher would call after its checks: a failing one (the tests expect it unreached)."""
    monkeypatch.setenv(train.ENTRY_ENV, "builtins:SystemExit")


def _main(tmp_path, overrides, **kw):
    return train.main(["--run-dir", str(tmp_path / "run"), "--", *overrides], **kw)


def _one_error(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    return err[0]


def test_a_train_file_without_reward_model_stops_before_ray(tmp_path, capsys, never_trains):
    bad = _parquet(tmp_path / "train.parquet", drop=["reward_model"])
    assert _main(tmp_path, _overrides(bad, _parquet(tmp_path / "val.parquet"))) == EXIT_CONFIG
    line = _one_error(capsys)
    assert line.startswith("[stapo recipe] ERROR: bad data: ") and "train.parquet has no column 'reward_model'" in line
    assert "python -m stapo_verl.data.prepare" in line and "sync_refill" not in line


def test_a_prompt_ten_times_too_long_stops_before_ray_naming_the_fixes(tmp_path, capsys, never_trains):
    model = _model(tmp_path)
    long = _parquet(tmp_path / "train.parquet", question="What is 2+3? " * 80)
    assert _main(tmp_path, _overrides(long, _parquet(tmp_path / "val.parquet"), model=model)) == EXIT_CONFIG
    line = _one_error(capsys)
    assert "1 of 1 prompts are longer than data.max_prompt_length=64 tokens" in line
    assert "Fix: data.filter_overlong_prompts=True (drop them)" in line and "data.truncation=left" in line
    # asked for: verl's filter drops it, and the launcher says so (one warning line) and goes on to train
    ok = _overrides(long, _parquet(tmp_path / "val.parquet"), "data.filter_overlong_prompts=True", model=model)
    assert train.checked_config(ok) is not None
    assert "verl's data.filter_overlong_prompts=True drops them" in _one_error(capsys)


def test_a_value_out_of_range_is_one_line_with_the_default_and_the_fix(tmp_path, capsys, never_trains):
    from stapo_verl.integration.verl_0_9_1.policy_loss.config import TOKEN_MASK_KEYS

    # a token-mask key whose range refuses 0 (names from the one table, not typed here)
    name = next(k for k in TOKEN_MASK_KEYS if not RANGES[k].test(0.0))
    files = _parquet(tmp_path / "train.parquet"), _parquet(tmp_path / "val.parquet")
    assert _main(tmp_path, _overrides(*files, f"{KEY}.{name}=0")) == EXIT_CONFIG
    line = _one_error(capsys)
    default = default_of(f"{KEY}.{name}")
    assert line == (f"[stapo recipe] ERROR: invalid config: {KEY}.{name}=0 is out of range: allowed "
                    f"{RANGES[name].allowed}; default {default}. Fix: {KEY}.{name}={default} or another value with "
                    f"{RANGES[name].allowed}")
    assert len(line) < 400  # no dump of the overrides


def test_a_composition_error_exits_with_the_same_code(tmp_path, capsys, never_trains):
    files = _parquet(tmp_path / "train.parquet"), _parquet(tmp_path / "val.parquet")
    assert _main(tmp_path, _overrides(*files, "data.no_such_key=1")) == EXIT_CONFIG
    assert "the overrides do not compose" in _one_error(capsys)


def test_another_verl_is_the_line_on_screen(tmp_path, capsys, never_trains):
    from stapo_verl.integration.verl_0_9_1 import ALLOW_ENV, VERL_VERSION

    found = [f"verl 0.9.0 is installed; stapo-verl's integration is written for verl {VERL_VERSION}"]
    files = _parquet(tmp_path / "train.parquet"), _parquet(tmp_path / "val.parquet")
    assert _main(tmp_path, _overrides(*files), verl_problems=found) == EXIT_CONFIG
    line = _one_error(capsys)
    assert "verl 0.9.0 is installed" in line and f"pip install verl=={VERL_VERSION}" in line and ALLOW_ENV in line
    screen = io.StringIO()
    Console(screen).feed(line + "\n")
    assert screen.getvalue() == line + "\n"  # the recipe's console shows it (not only train.log)


def _table_parquet(path, ground_truths=("5", "7"), prompts=None):
    """A train parquet of len(ground_truths) rows, row i with ground truth ground_truths[i]."""
    rows = []
    for i, gt in enumerate(ground_truths):
        (row,) = _rows(f"What is {i}+5?")
        row["reward_model"]["ground_truth"] = gt
        if prompts is not None and prompts[i] is not None:
            row["prompt"] = prompts[i]
        rows.append(row)
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema()), path)
    return str(path)


def test_a_row_without_ground_truth_is_named_before_ray_and_left_out_on_request(tmp_path, capsys, never_trains):
    """A null ground truth scored every response of its row −1, correct ones included; the launcher names the file,
    the row and the field, with both fixes, and ``--drop-bad-rows`` writes a copy the launcher accepts."""
    from stapo_verl.launch import data_checks

    bad = _table_parquet(tmp_path / "train.parquet", ("5", None, "7", ""),
                         prompts=[None, None, [{"role": "user", "content": "  "}], None])
    val = _parquet(tmp_path / "val.parquet")
    assert _main(tmp_path, _overrides(bad, val)) == EXIT_CONFIG
    line = _one_error(capsys)
    assert line.startswith(f"[stapo recipe] ERROR: bad data: {bad}: 3 of 4 rows cannot be scored: ")
    assert "row 1 reward_model.ground_truth None is missing" in line
    assert "row 2 prompt is empty" in line and "row 3 reward_model.ground_truth '' is empty" in line
    fixed = str(tmp_path / "train.checked.parquet")
    assert f"--drop-bad-rows {bad} {fixed}" in line
    assert data_checks.main(["--drop-bad-rows", bad, fixed]) == 0
    assert pq.read_table(fixed).to_pylist()[0]["reward_model"]["ground_truth"] == "5"
    assert pq.read_table(fixed).num_rows == 1
    capsys.readouterr()
    assert train.checked_config(_overrides(fixed, val)) is not None


def test_an_override_of_the_wrong_type_is_one_line_before_ray(tmp_path, capsys, never_trains):
    """``trainer.total_training_steps=abc`` reached ``int()`` in the resume rule as a traceback labelled a main_ppo
    failure; now it is one config error naming the key, the value, the type and the fix, with the config exit code,
    and the dry run refuses it too."""
    from stapo_verl.launch.dryrun import dry_run

    files = _parquet(tmp_path / "train.parquet"), _parquet(tmp_path / "val.parquet")
    assert _main(tmp_path, _overrides(*files, "trainer.total_training_steps=abc")) == EXIT_CONFIG
    line = _one_error(capsys)
    assert line.startswith("[stapo recipe] ERROR: invalid config: trainer.total_training_steps='abc' is a string; "
                           "trainer.total_training_steps wants an integer"), line
    assert "Fix: trainer.total_training_steps=null" in line
    out = io.StringIO()
    report = dry_run(_overrides(*files, f"{KEY}.s2t_tau_p=abc"), out=out)
    assert not report.ok and "OK" not in out.getvalue().split()
    (failed,) = [s for s in report.steps if s[1] == "FAIL"]
    assert failed[0].startswith("override types") and f"{KEY}.s2t_tau_p='abc' is a string" in failed[2]


@pytest.mark.parametrize("key,value,allowed,fix", [
    ("data.max_prompt_length", "-5", "a positive integer", "data.max_prompt_length=512 (the default)"),
    ("data.max_response_length", "0", "a positive integer", "data.max_response_length=512 (the default)"),
    ("data.train_batch_size", "-1", "a positive integer", "data.train_batch_size=1024 (the default)"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", "0", "a positive integer",
     "actor_rollout_ref.actor.ppo_mini_batch_size=256 (the default)"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "0", "a positive integer or null (unset)",
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null (the default) or a positive integer"),
    ("actor_rollout_ref.rollout.n", "0", "a positive integer", "actor_rollout_ref.rollout.n=1 (the default)"),
    ("trainer.total_training_steps", "-3", "a positive integer or null (unset)",
     "trainer.total_training_steps=null (the default) or a positive integer"),
    ("trainer.total_epochs", "0", "a positive integer", "trainer.total_epochs=30 (the default)"),
])
def test_a_size_length_or_count_at_zero_or_below_is_one_line_before_ray(tmp_path, capsys, never_trains, key, value,
                                                                        allowed, fix):
    """``data.max_prompt_length=-5`` passed the dry run (the memory plan computed with it) and reached the tiny
    launcher's data check as "4000 of 4000 prompts are longer than -5 tokens"; every size, length or count key verl
    needs positive is now one config error naming the key, the value, what is allowed and the fix, before the data
    is read, and the dry run fails on it too."""
    from stapo_verl.launch.dryrun import dry_run

    files = _parquet(tmp_path / "train.parquet"), _parquet(tmp_path / "val.parquet")
    assert _main(tmp_path, _overrides(*files, f"{key}={value}")) == EXIT_CONFIG
    assert _one_error(capsys) == (f"[stapo recipe] ERROR: invalid config: {key}={value}: {key} is a size, length or "
                                  f"count, allowed: {allowed}. Fix: {fix}")
    if key == "data.max_prompt_length":
        out = io.StringIO()
        report = dry_run(_overrides(*files, f"{key}={value}"), out=out)
        (failed,) = [s for s in report.steps if s[1] == "FAIL"]
        assert not report.ok and failed[0].startswith("override types"), report.steps
        assert f"{key}={value}: {key} is a size, length or count, allowed: {allowed}. Fix: {fix}" in failed[2]


@pytest.mark.parametrize("bad", [f"{KEY}.tau_p=-1", f"{KEY}.tau_p=0.05", f"{KEY}.s2t_tau_p=0",
                                 "trainer.total_training_steps=abc", "actor_rollout_ref.actor.ppo_mini_batch_size=x",
                                 "trainer.total_epochs=1.5", "data.max_prompt_length=-5",
                                 "actor_rollout_ref.rollout.n=0", "trainer.total_training_steps=0"])
def test_every_suggested_fix_passes_the_check(tmp_path, capsys, never_trains, bad):
    """Each ``key=value`` after "Fix:" in the error line, put in place of the bad override, gives a config the
    launcher accepts (the renamed key's message once suggested the refused value under the new name)."""
    import re

    files = _parquet(tmp_path / "train.parquet"), _parquet(tmp_path / "val.parquet")
    assert _main(tmp_path, _overrides(*files, bad)) == EXIT_CONFIG
    line = _one_error(capsys)
    assert line.count("Fix: ") == 1, line
    fixes = re.findall(r"((?:actor_rollout_ref|trainer|data)\.[\w.]+=[^\s,;()]+)", line.split("Fix: ")[1])
    applied = 0
    for fix in fixes:
        assert train.checked_config(_overrides(*files, fix)) is not None, (fix, capsys.readouterr().err)
        capsys.readouterr()
        applied += 1
    assert applied, line
