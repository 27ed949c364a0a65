#!/usr/bin/env bash
# Check the upstream patch series (upstream/patches/) the way verl's CI and pre-commit would. Self-contained: it
# needs PyPI (verl 0.9.1's sdist, ruff, mypy) and nothing else.
#
#   bash scripts/check_upstream.sh                            # verl 0.9.1 + overlay (always)
#   VERL_MAIN=<verl source tree> bash scripts/check_upstream.sh  # also a verl main tree (skipped, and said so, without)
#
# 1. upstream/build_series.py: the vendored overlay matches its recorded sha256 (--check-overlay); the committed
#    patches equal a fresh build from the plugin's sources, byte for byte (--check); PR.md has a section per patch
#    and the current sizes, and no committed text points outside the repository (--check-docs).
# 2. verl 0.9.1 + overlay (build_series.py --base-tree, a fresh temp dir): `git apply --check` then `git apply` of
#    each patch in upstream/patches/series. After PR A: PR A's tests and the drift check of PR A alone (PR A
#    stands on its own). After all patches, on this tree and on $VERL_MAIN's (a temp copy):
#    - pytest: the series' tests and verl's existing CPU tests of the touched files (PYTHONPATH = the tree, which
#      shadows the installed verl; external plugins off; a skipped test fails the check);
#    - build_series.py --check-tree: the definitions in the tree equal the plugin's (AST, docstrings aside), and
#      the shared config keys have the plugin's types and defaults (PolicyLossConfig, actor.yaml);
#    - examples/stapo_trainer/run_qwen3_8b_megatron.sh with `python3 -m verl.trainer.main_ppo` replaced by a Hydra
#      compose of the patched ppo_trainer.yaml: its overrides are declared keys and build a valid config;
#    - verl's pre-commit, pins read from the overlay's .pre-commit-config.yaml: autogen-trainer-cfg
#      (scripts/generate_trainer_config.sh), ruff check + format and mypy (verl's pyproject settings) on the
#      touched Python files, compileall with warnings as errors, the naming-convention grep;
#    - tests/special_sanity: docstrings, license headers, docs "Last updated", example naming, uv gating, test
#      layout, device-API usage (touched files), and check_pr_title.py / check_pr_description.py on every PR of
#      upstream/PR.md.
# Tools go into a throwaway venv; tests run in the project venv (scripts/setup_env.sh creates it if missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD
START=$(date +%s)
step() { printf '\n=== %s (%ss)\n' "$*" "$(($(date +%s) - START))"; }
die() { echo "check_upstream: $*" >&2; exit 1; }

PY="$(bash scripts/setup_env.sh)/bin/python"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/check_upstream.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
BUILD=("$PY" "$REPO/upstream/build_series.py")
declare -A RESULT

step "overlay: the vendored verl-main files match their sha256"
"${BUILD[@]}" --check-overlay

step "verl 0.9.1 sdist from PyPI"
"$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: verl==0.9.1 -d "$WORK/sdist"
export VERL_SDIST="$WORK/sdist/verl-0.9.1.tar.gz"

PRECOMMIT=upstream/verl_overlay/tree/.pre-commit-config.yaml
read -r RUFF_VERSION MYPY_VERSION < <("$PY" - "$PRECOMMIT" <<'EOF'
import sys, yaml
repos = yaml.safe_load(open(sys.argv[1]))["repos"]
revs = {r["repo"].split("github.com/")[-1]: str(r["rev"]).lstrip("v") for r in repos if "rev" in r}
print(revs["astral-sh/ruff-pre-commit"], revs["pre-commit/mirrors-mypy"])
EOF
)
[[ -n $RUFF_VERSION && -n $MYPY_VERSION ]] || die "cannot read the ruff/mypy pins from $PRECOMMIT"
step "tools: ruff==$RUFF_VERSION mypy==$MYPY_VERSION (verl's pre-commit pins) in a throwaway venv"
python3 -m venv "$WORK/tools"
"$WORK/tools/bin/pip" install -q --disable-pip-version-check "ruff==$RUFF_VERSION" "mypy==$MYPY_VERSION"

step "series == a fresh build from the plugin's sources (build_series.py --check)"
"${BUILD[@]}" --check
"${BUILD[@]}" --check-docs

mapfile -t SERIES < upstream/patches/series
touched() {  # paths the patches $@ touch
    for p in "$@"; do sed -n 's|^diff --git a/\(.*\) b/.*|\1|p' "upstream/patches/$p"; done | sort -u
}
mapfile -t TOUCHED < <(touched "${SERIES[@]}")
mapfile -t TOUCHED_PY < <(printf '%s\n' "${TOUCHED[@]}" | grep '\.py$')
mapfile -t TOUCHED_VERL_PY < <(printf '%s\n' "${TOUCHED_PY[@]}" | grep '^verl/')
mapfile -t SERIES_TESTS < <(printf '%s\n' "${TOUCHED_PY[@]}" | grep '^tests/.*_on_cpu\.py$')
# patch 2 is PR A (the extension point); PR A's own tests must pass before PR B is applied
mapfile -t PR_A_TESTS < <(touched "${SERIES[@]:0:2}" | grep '^tests/.*_on_cpu\.py$')
# verl's existing CPU tests of the touched modules (core_algos, losses, engine_workers, actor config, YAMLs)
EXISTING_TESTS=(
    tests/trainer/ppo/test_core_algos_on_cpu.py
    tests/trainer/ppo/test_loss_aggregation_on_cpu.py
    tests/trainer/ppo/test_dynamic_policy_losses_on_cpu.py
    tests/trainer/ppo/test_value_loss_normalization_on_cpu.py
    tests/trainer/ppo/test_rollout_corr_integration.py
    tests/test_base_config_on_cpu.py
    tests/workers/config/test_actor_config_on_cpu.py
    tests/workers/test_engine_workers_mini_batch_trace_on_cpu.py
    tests/workers/test_engine_return_model_output_on_cpu.py
    tests/checkpoint_engine/test_global_steps_on_cpu.py
    tests/special_sanity/test_config_docs.py
)

run_pytest() {  # tree name label files...: run pytest in the tree, count the results
    local t=$1 name=$2 label=$3 out
    shift 3
    out=$(cd "$t" && PYTHONPATH=$t VERL_USE_EXTERNAL_PLUGINS=none timeout 900 "$PY" -m pytest -q -p no:cacheprovider \
        -o addopts="" --junitxml="$WORK/$name.$label.xml" "$@" 2>&1) || { echo "$out" | tail -60; die "[$name] pytest failed"; }
    echo "$out" | tail -1
    RESULT[$name.$label]=$("$PY" upstream/count_junit.py "$WORK/$name.$label.xml" "${SERIES_TESTS[@]}") ||
        die "[$name] ${RESULT[$name.$label]:-junit count failed}"
    echo "${RESULT[$name.$label]}"
}

apply_patch() {  # tree name patch
    local t=$1 name=$2 p=$3 subject
    git -C "$t" apply --check "$REPO/upstream/patches/$p" || die "[$name] $p does not apply"
    git -C "$t" apply "$REPO/upstream/patches/$p"
    subject=$(git mailinfo -b /dev/null /dev/null <"upstream/patches/$p" | sed -n 's/^Subject: //p')
    git -C "$t" add -A
    git -C "$t" -c user.name=ci -c user.email=ci@localhost commit -q -m "$subject"
}

check_tree() {  # name source: "sdist" or a verl source tree
    local name=$1 src=$2 t=$WORK/$1 out p
    step "[$name] apply the series"
    if [[ $src == sdist ]]; then
        "${BUILD[@]}" --base-tree "$t"
    else
        cp -r "$src" "$t"
        chmod -R u+w "$t"
        rm -rf "$t/.git"
    fi
    git -C "$t" init -q
    git -C "$t" add -A
    git -C "$t" -c user.name=ci -c user.email=ci@localhost commit -q -m base
    for p in "${SERIES[@]:0:2}"; do apply_patch "$t" "$name" "$p"; done
    if [[ $src == sdist ]]; then
        step "[$name] PR A alone: ${#PR_A_TESTS[@]} test files, drift check"
        run_pytest "$t" "$name" pr-a "${PR_A_TESTS[@]}"
        "${BUILD[@]}" --check-tree "$t" --upto a
    fi
    for p in "${SERIES[@]:2}"; do apply_patch "$t" "$name" "$p"; done
    RESULT[$name.patches]="${#SERIES[@]}/${#SERIES[@]} patches applied"

    step "[$name] pytest: ${#SERIES_TESTS[@]} series test files + ${#EXISTING_TESTS[@]} existing verl test files"
    run_pytest "$t" "$name" all "${SERIES_TESTS[@]}" "${EXISTING_TESTS[@]}"

    step "[$name] the tree's definitions and config keys == the plugin's (build_series.py --check-tree)"
    "${BUILD[@]}" --check-tree "$t"

    step "[$name] autogen-trainer-cfg (scripts/generate_trainer_config.sh)"
    out=$(cd "$t" && PATH="$(dirname "$PY"):$PATH" PYTHONPATH=$t VERL_USE_EXTERNAL_PLUGINS=none \
        bash scripts/generate_trainer_config.sh 2>&1) || {
        echo "$out" | tail -20
        git -C "$t" diff --stat
        die "[$name] the generated trainer YAMLs are out of date"
    }
    echo "$out" | tail -1

    step "[$name] the example's overrides compose (examples/stapo_trainer with main_ppo replaced by a Hydra compose)"
    mkdir -p "$WORK/shim_$name"
    printf '#!/usr/bin/env bash\nif [[ $1 == -m && $2 == verl.trainer.main_ppo ]]; then shift 2; exec %q %q "$@"; fi\nexec %q "$@"\n' \
        "$PY" "$WORK/compose_example.py" "$PY" >"$WORK/shim_$name/python3"
    chmod +x "$WORK/shim_$name/python3"
    out=$(cd "$t" && PATH="$WORK/shim_$name:$PATH" PYTHONPATH=$t VERL_USE_EXTERNAL_PLUGINS=none VERL_USE_UV=0 \
        bash examples/stapo_trainer/run_qwen3_8b_megatron.sh 2>&1) || { echo "$out" | tail -20; die "[$name] the example does not compose"; }
    echo "$out" | grep '^  ok: '

    step "[$name] ruff $RUFF_VERSION check + format, compileall on ${#TOUCHED_PY[@]} files; mypy $MYPY_VERSION"
    (cd "$t" && "$WORK/tools/bin/ruff" check --no-cache "${TOUCHED_PY[@]}" &&
        "$WORK/tools/bin/ruff" format --no-cache --check "${TOUCHED_PY[@]}")
    (cd "$t" && "$WORK/tools/bin/mypy" --no-incremental --cache-dir=/dev/null "${TOUCHED_VERL_PY[@]}")
    (cd "$t" && PYTHONWARNINGS=error "$PY" -m compileall -q "${TOUCHED_PY[@]}")
    if (cd "$t" && grep -In "veRL" "${TOUCHED[@]}") || (cd "$t" && grep -InE "Sglang|sgLang|sglAng|sglaNg|sglanG" "${TOUCHED[@]}"); then
        die "[$name] naming conventions (verl's check-naming-conventions hook)"
    fi

    step "[$name] tests/special_sanity"
    local fails=0 runs=0 title i=0
    sanity() {  # run one check in the tree; print its last line, or its tail on failure
        local o
        runs=$((runs + 1))
        if o=$(cd "$t" && "$@" 2>&1); then
            echo "  ok: $(echo "$o" | tail -1)"
        else
            echo "$o" | tail -20
            echo "  FAILED: $*"
            fails=$((fails + 1))
        fi
    }
    sanity "$PY" tests/special_sanity/check_docstrings.py
    sanity "$PY" tests/special_sanity/check_license.py --directories "${TOUCHED_PY[@]}"
    sanity "$PY" tests/special_sanity/check_docs_time_info.py
    sanity "$PY" tests/special_sanity/check_example_naming.py --root examples
    sanity "$PY" tests/special_sanity/check_uv_gpu_only.py --roots examples tests scripts
    sanity "$PY" tests/special_sanity/validate_structure.py
    # on the touched verl files only: its whitelist is verl main's, and 0.9.1 has other files that need it
    mkdir -p "$WORK/device_api_$name"
    (cd "$t" && cp --parents "${TOUCHED_VERL_PY[@]}" "$WORK/device_api_$name/")
    sanity "$PY" tests/special_sanity/check_device_api_usage.py --directory "$WORK/device_api_$name/verl"
    while IFS= read -r title; do
        i=$((i + 1))
        sanity env PR_TITLE="$title" "$PY" tests/special_sanity/check_pr_title.py
        "$PY" - "$REPO/upstream/PR.md" "$title" "$WORK/pr_event_$i.json" <<'EOF'
import json, sys
sys.path.insert(0, "upstream")
from build_series import pr_sections
body = pr_sections(open(sys.argv[1], encoding="utf-8").read())[sys.argv[2]]
json.dump({"pull_request": {"body": body}}, open(sys.argv[3], "w"))
EOF
        sanity env GITHUB_EVENT_PATH="$WORK/pr_event_$i.json" GITHUB_WORKSPACE="$t" "$PY" \
            tests/special_sanity/check_pr_description.py
    done < <(for p in "${SERIES[@]}"; do git mailinfo -b /dev/null /dev/null <"upstream/patches/$p" | sed -n 's/^Subject: //p'; done)
    ((fails == 0)) || die "[$name] $fails of $runs special_sanity runs failed"
    RESULT[$name.sanity]="$runs special_sanity runs passed (+ test_config_docs in pytest)"
}

cat >"$WORK/compose_example.py" <<'EOF'
"""Stands in for `python3 -m verl.trainer.main_ppo OVERRIDES`: compose ppo_trainer.yaml, build the policy-loss config."""
import os
import sys

from hydra import compose, initialize_config_dir

from verl.utils.config import omega_conf_to_dataclass

with initialize_config_dir(config_dir=os.path.abspath("verl/trainer/config"), version_base=None):
    config = compose("ppo_trainer", overrides=sys.argv[1:])
policy_loss = omega_conf_to_dataclass(config.actor_rollout_ref.actor.policy_loss)
assert policy_loss.token_mask == "s2t", policy_loss
print(f"  ok: {len(sys.argv) - 1} overrides compose; loss_mode={policy_loss.loss_mode} token_mask={policy_loss.token_mask} "
      f"tau_p={policy_loss.s2t_tau_p} entropy_quantile={policy_loss.s2t_entropy_quantile}")
EOF

check_tree verl-0.9.1 sdist
if [[ -n ${VERL_MAIN:-} ]]; then
    [[ -d $VERL_MAIN/verl ]] || die "VERL_MAIN=$VERL_MAIN is not a verl source tree"
    check_tree verl-main "$(cd "$VERL_MAIN" && pwd)"
else
    step "verl main: skipped (no VERL_MAIN given; set VERL_MAIN=<verl source tree> to also check verl main)"
fi

step "summary"
echo "verl-0.9.1 + overlay: PR A alone: ${RESULT[verl-0.9.1.pr-a]}"
for name in verl-0.9.1 verl-main; do
    [[ -n ${RESULT[$name.patches]:-} ]] || { echo "$name: skipped (no VERL_MAIN)"; continue; }
    echo "$name: ${RESULT[$name.patches]}; ${RESULT[$name.all]}; ${RESULT[$name.sanity]};" \
        "ruff+format+compileall on ${#TOUCHED_PY[@]} files; mypy; autogen-trainer-cfg up to date; no drift"
done
echo "series touches ${#TOUCHED[@]} files; wall time $(($(date +%s) - START)) s"
