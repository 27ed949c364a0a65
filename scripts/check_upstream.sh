#!/usr/bin/env bash
# Check the upstream patch series (upstream/patches/, issue 10 part 2) the way verl's CI and pre-commit would.
#
#   bash scripts/check_upstream.sh            # offline apart from PyPI; ~2-4 min on 2 cores
#
# 1. upstream/build_series.py --check: the committed patches equal a fresh build from stapo_verl/s2t.py (one
#    implementation of the mask maths), plus an AST comparison of the shared functions.
# 2. Two trees, each a fresh temp copy: verl main (VERL_MAIN, default /work/shared/upstream/verl-main) and verl
#    0.9.1 (the PyPI wheel's verl/, tests/, scripts/ over verl-main's docs/examples/CI files, which the wheel
#    lacks). On each: `git apply --check` then `git apply` of every patch in upstream/patches/series.
# 3. On each patched tree (PYTHONPATH = the tree, so it shadows the installed verl; external plugins off):
#    the series' tests and verl's existing CPU tests of the touched files; scripts/generate_trainer_config.sh
#    (autogen-trainer-cfg: the committed generated YAMLs must be up to date); ruff 0.12.2 (verl's pre-commit pin)
#    check + format on the touched Python files with verl's pyproject settings; mypy 1.17.0 on core_algos.py;
#    tests/special_sanity/ scripts (docstrings, license headers, docs "Last updated", example naming, uv gating,
#    test layout, config docs) and check_pr_title.py on the PR title and every patch subject.
# Tools go into a throwaway venv; tests run in the project .venv (created by scripts/setup_env.sh if missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD
START=$(date +%s)
step() { printf '\n=== %s (%ss)\n' "$*" "$(($(date +%s) - START))"; }
die() { echo "check_upstream: $*" >&2; exit 1; }
# verl main snapshot (issue 10: ../shared/upstream/verl-main next to the checkout)
VERL_MAIN=${VERL_MAIN:-$REPO/../shared/upstream/verl-main}
[[ -d $VERL_MAIN ]] || VERL_MAIN=/work/shared/upstream/verl-main
[[ -d $VERL_MAIN/verl ]] || die "no verl main snapshot at $VERL_MAIN (set VERL_MAIN=<verl source tree>)"
VERL_MAIN=$(cd "$VERL_MAIN" && pwd)
VERL_VERSION=0.9.1
RUFF_VERSION=0.12.2  # verl .pre-commit-config.yaml: astral-sh/ruff-pre-commit rev v0.12.2
MYPY_VERSION=1.17.0  # verl .pre-commit-config.yaml: mirrors-mypy rev v1.17.0

[[ -x .venv/bin/python ]] || bash scripts/setup_env.sh
PY=$REPO/.venv/bin/python
WORK=$(mktemp -d "${TMPDIR:-/tmp}/check_upstream.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

declare -A COUNTS

step "tools: ruff==$RUFF_VERSION mypy==$MYPY_VERSION in a throwaway venv"
python3 -m venv "$WORK/tools"
"$WORK/tools/bin/pip" install -q --disable-pip-version-check "ruff==$RUFF_VERSION" "mypy==$MYPY_VERSION"

step "series is generated from stapo_verl/s2t.py (build_series.py --check)"
VERL_MAIN=$VERL_MAIN "$PY" upstream/build_series.py --check

step "verl $VERL_VERSION sources from PyPI"
"$PY" -m pip download -q --disable-pip-version-check --no-deps "verl==$VERL_VERSION" -d "$WORK/whl"
mkdir -p "$WORK/wheel"
"$PY" -m zipfile -e "$WORK"/whl/verl-"$VERL_VERSION"-*.whl "$WORK/wheel"

make_tree() {  # name → a git repo at $WORK/<name> with the unpatched sources
    local name=$1 dst=$WORK/$1
    cp -r "$VERL_MAIN" "$dst"
    chmod -R u+w "$dst"
    if [[ $name == verl-$VERL_VERSION ]]; then
        rm -rf "$dst/verl"
        cp -r "$WORK/wheel/verl" "$dst/verl"
        cp -r "$WORK/wheel/tests/." "$dst/tests/"
        cp -r "$WORK/wheel/scripts/." "$dst/scripts/"
    fi
    git -C "$dst" init -q
    git -C "$dst" add -A
    git -C "$dst" -c user.name=ci -c user.email=ci@localhost commit -q -m base
}

# files the series touches, for the per-file checks
mapfile -t TOUCHED < <(sed -n 's|^diff --git a/\(.*\) b/.*|\1|p' upstream/patches/*.patch | sort -u)
mapfile -t TOUCHED_PY < <(printf '%s\n' "${TOUCHED[@]}" | grep '\.py$')
mapfile -t SERIES_TESTS < <(printf '%s\n' "${TOUCHED_PY[@]}" | grep '^tests/.*_on_cpu\.py$')
# verl's existing CPU tests of the touched modules (core_algos, losses, engine_workers, actor config, YAMLs)
EXISTING_TESTS=(
    tests/trainer/ppo/test_core_algos_on_cpu.py
    tests/trainer/ppo/test_loss_aggregation_on_cpu.py
    tests/trainer/ppo/test_dynamic_policy_losses_on_cpu.py
    tests/workers/config/test_actor_config_on_cpu.py
    tests/workers/test_engine_workers_mini_batch_trace_on_cpu.py
    tests/workers/test_engine_return_model_output_on_cpu.py
    tests/special_sanity/test_config_docs.py
)
PR_TITLE_LINE=$(sed -n 's/^\*\*Title:\*\* `\(.*\)`$/\1/p' upstream/PR.md | head -1)
[[ -n $PR_TITLE_LINE ]] || die "upstream/PR.md has no '**Title:** \`...\`' line"

check_tree() {
    local name=$1 t=$WORK/$1 n out
    step "[$name] apply the series"
    make_tree "$name"
    n=0
    while read -r p; do
        [[ -n $p ]] || continue
        git -C "$t" apply --check "$REPO/upstream/patches/$p" || die "[$name] $p does not apply"
        git -C "$t" apply "$REPO/upstream/patches/$p"
        n=$((n + 1))
    done < upstream/patches/series
    git -C "$t" add -A
    git -C "$t" -c user.name=ci -c user.email=ci@localhost commit -q -m "STAPO series"
    COUNTS[$name.patches]=$n

    export PYTHONPATH=$t VERL_USE_EXTERNAL_PLUGINS=none
    step "[$name] pytest: ${#SERIES_TESTS[@]} series test files + ${#EXISTING_TESTS[@]} existing verl test files"
    out=$(cd "$t" && timeout 900 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" --junitxml="$WORK/$name.xml" \
        "${SERIES_TESTS[@]}" "${EXISTING_TESTS[@]}" 2>&1) || { echo "$out" | tail -60; die "[$name] pytest failed"; }
    echo "$out" | tail -1
    COUNTS[$name.tests]=$("$PY" "$REPO/upstream/count_junit.py" "$WORK/$name.xml" "${SERIES_TESTS[@]}") ||
        die "[$name] ${COUNTS[$name.tests]:-junit count failed}"
    echo "${COUNTS[$name.tests]}"

    step "[$name] mask maths in the tree == stapo_verl/s2t.py (AST, docstrings aside)"
    "$PY" - "$t/verl/trainer/ppo/stapo_mask.py" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, "upstream")
import build_series as b
tree = b.code_ast(Path(sys.argv[1]).read_text(), b.S2T_NAMES + b.DIST_NAMES)
plugin = b.code_ast(Path("stapo_verl/s2t.py").read_text(), b.S2T_NAMES)
plugin.update(b.code_ast(Path("stapo_verl/dist_utils.py").read_text(), b.DIST_NAMES))
bad = sorted(k for k in plugin if tree.get(k) != plugin[k])
if bad or set(tree) != set(plugin):
    sys.exit(f"stapo_mask.py drifted from stapo_verl (s2t.py/dist_utils.py): {bad or sorted(set(tree) ^ set(plugin))}")
print(f"{len(tree)} definitions identical")
EOF

    step "[$name] autogen-trainer-cfg (scripts/generate_trainer_config.sh)"
    out=$(cd "$t" && PATH="$REPO/.venv/bin:$PATH" bash scripts/generate_trainer_config.sh 2>&1) || {
        echo "$out" | tail -20
        git -C "$t" diff --stat
        die "[$name] generated trainer YAMLs are out of date"
    }
    echo "$out" | tail -1

    step "[$name] ruff $RUFF_VERSION (verl pyproject.toml) on ${#TOUCHED_PY[@]} files; mypy on core_algos.py"
    (cd "$t" && "$WORK/tools/bin/ruff" check --no-cache "${TOUCHED_PY[@]}" && "$WORK/tools/bin/ruff" format --no-cache --check "${TOUCHED_PY[@]}")
    (cd "$t" && "$WORK/tools/bin/mypy" --no-incremental --cache-dir=/dev/null verl/trainer/ppo/core_algos.py)

    step "[$name] tests/special_sanity"
    local fails=0 runs=0 cmd subject
    sanity() {  # run one check in the tree; print its last line, or all of it on failure
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
    # recipe/ is a submodule that the snapshot leaves out
    sanity "$PY" tests/special_sanity/check_uv_gpu_only.py --roots examples tests scripts
    sanity "$PY" tests/special_sanity/validate_structure.py
    sanity env PR_TITLE="$PR_TITLE_LINE" "$PY" tests/special_sanity/check_pr_title.py
    "$PY" -c 'import json, sys; body = open(sys.argv[1]).read().split("### What does this PR do?", 1)[1]
json.dump({"pull_request": {"body": "### What does this PR do?" + body}}, open(sys.argv[2], "w"))' \
        "$REPO/upstream/PR.md" "$WORK/pr_event.json"
    sanity env GITHUB_EVENT_PATH="$WORK/pr_event.json" GITHUB_WORKSPACE="$t" "$PY" tests/special_sanity/check_pr_description.py
    while read -r p; do
        subject=$(git mailinfo -b /dev/null /dev/null <"$REPO/upstream/patches/$p" | sed -n 's/^Subject: //p')
        sanity env PR_TITLE="$subject" "$PY" tests/special_sanity/check_pr_title.py
    done < upstream/patches/series
    ((fails == 0)) || die "[$name] $fails of $runs special_sanity runs failed"
    COUNTS[$name.sanity]="$runs special_sanity runs passed (+ test_config_docs in pytest)"
    unset PYTHONPATH VERL_USE_EXTERNAL_PLUGINS
}

check_tree verl-main
check_tree "verl-$VERL_VERSION"

step "summary"
for name in verl-main "verl-$VERL_VERSION"; do
    echo "$name: ${COUNTS[$name.patches]} patches applied; ${COUNTS[$name.tests]}; ${COUNTS[$name.sanity]}; ruff+format on ${#TOUCHED_PY[@]} files; mypy core_algos; autogen-trainer-cfg up to date"
done
echo "series touches ${#TOUCHED[@]} files; wall time $(($(date +%s) - START)) s"
