"""Build (or check) the upstream patch series ``upstream/patches/`` that adds STAPO to verl.

The series is generated, never edited by hand, so that the mask maths has ONE implementation:
``verl/trainer/ppo/stapo_mask.py`` in the series is derived from this repository's ``stapo_verl/s2t.py``
(``linear_quantile``, ``MaskStats``, ``candidate_mask``, the S2T selection ``_select_global``,
``s2t_keep_mask``) and ``stapo_verl/dist_utils.py`` (the DP collectives it imports, inlined because verl has no
variable-length all-gather helper). Function bodies are copied verbatim through :mod:`ast` source segments;
only docstring citations of this project's internal spec are rewritten to public sources
(:data:`DOC_REWRITES`; a rewrite whose text is missing fails the build, so a docstring edit is noticed).

Everything else of the series lives in ``upstream/src/`` (new files, laid out as in verl's tree) and in
:data:`EDITS` (anchored insertions into existing verl files). The generated trainer YAMLs are regenerated with
verl's own ``scripts/generate_trainer_config.sh`` (pre-commit hook ``autogen-trainer-cfg``).

Usage::

    python upstream/build_series.py            # rewrite upstream/patches/ from the sources
    python upstream/build_series.py --check    # exit 1 if upstream/patches/ differs from a fresh build

The base tree is ``$VERL_MAIN`` (default ``../shared/upstream/verl-main`` next to this checkout, else
``/work/shared/upstream/verl-main``; read-only, copied to a temp dir).
Needs ``git`` and a Python with hydra-core/omegaconf/torch (the project ``.venv``) for the YAML regeneration.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SRC = HERE / "src"
PATCH_DIR = HERE / "patches"
#: verl main snapshot (issue 10: ../shared/upstream/verl-main next to the checkout), else the shared path
_SNAPSHOTS = (REPO.parent / "shared/upstream/verl-main", Path("/work/shared/upstream/verl-main"))
VERL_MAIN = Path(os.environ.get("VERL_MAIN") or next((p for p in _SNAPSHOTS if p.is_dir()), _SNAPSHOTS[0]))

AUTHOR = "stapo-verl contributors <stapo-verl@users.noreply.github.com>"
DATE = "2026-12-01T00:00:00+00:00"
LICENSE_HOLDER = "Copyright 2026 Individual Contributor: stapo-verl contributors"

APACHE = """#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""

# ----------------------------------------------------------------------------------------------------------------
# 1. verl/trainer/ppo/stapo_mask.py, derived from stapo_verl/s2t.py + stapo_verl/dist_utils.py
# ----------------------------------------------------------------------------------------------------------------

#: top-level names copied from stapo_verl/dist_utils.py, in this order
DIST_NAMES = ("_active", "all_reduce_sum", "all_gather_rows", "group_rank")
#: top-level names copied from stapo_verl/s2t.py, in this order (the plugin-only loss-mode table and the
#: 20-Entropy baseline are not part of the contribution)
S2T_NAMES = (
    "TORCH_QUANTILE_MAX_NUMEL",
    "MASK_MODES",
    "linear_quantile",
    "MaskStats",
    "_check_shapes",
    "candidate_mask",
    "_select_global",
    "s2t_keep_mask",
)
#: the import the copied code needs in place of ``from stapo_verl.dist_utils import ...``
DIST_IMPORT = "from stapo_verl.dist_utils import all_gather_rows, all_reduce_sum, group_rank"

#: docstring citations of the project's internal spec/bug list → public sources (exact text, must exist)
DOC_REWRITES = {
    "Source: spec A4 (torch.quantile's linear rule; ``kthvalue`` above torch's size limit).": (
        "Source: ``torch.quantile`` (``interpolation='linear'``); ``kthvalue`` above torch's size limit."
    ),
    "Source: spec §2.2 (C1, C2), §2.4 (non-finite values are excluded and dropped).": (
        "Source: STAPO paper §3 (conditions Â > 0 and p < τ_p); non-finite values are excluded and dropped."
    ),
    "Source: spec §2.5 reference implementation, generalised to DP; paper Algorithm 1.": (
        "Source: STAPO paper §3 and Algorithm 1, generalised to data parallelism."
    ),
    "seeded permutation) agrees on every rank (bug D8).": "seeded permutation) agrees on every rank.",
    "#: S2T variants: the paper's mask and its ablations (paper §4.4 / spec §8.1).": (
        "#: S2T variants: the paper's mask and its ablations (paper §4.4)."
    ),
}

STAPO_MASK_DOC = '''"""S2T (Silencing Spurious Tokens) mask of STAPO: candidates, the entropy threshold τ_h, the keep mask.

STAPO: "Spurious-Token-Aware Policy Optimization" (https://arxiv.org/abs/2602.15620), §3 and Algorithm 1.
A response token (i, t) is *spurious* iff  Â_i > 0  and  p_{i,t} < τ_p  and  H_{i,t} < τ_h  (all strict), where
τ_h = Quantile_q(P) with linear interpolation over the candidate population
P = {H_{i,t} : valid, Â_i > 0, p_{i,t} < τ_p}, gathered over the data-parallel group. Spurious tokens are removed
from the policy-gradient loss and the token-mean denominator (the keep mask K replaces ``response_mask``).

Pure tensor code; the only side effects are the data-parallel collectives below (``group=None`` or an
uninitialised process group means this process holds the whole population). ``mode`` selects the paper's
ablations (§4): ``high_entropy`` (silence candidates above the (1 − q) quantile), ``random`` (as many candidates
as STAPO would silence, drawn uniformly) and ``full`` (all candidates).
"""'''


def _segments(path: Path, names: tuple[str, ...]) -> dict[str, str]:
    """Source text of the named top-level statements of ``path``, with the ``#:`` comments right above them."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text)
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            name = node.name
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        else:
            continue
        if name not in names:
            continue
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        while start > 0 and lines[start - 1].lstrip().startswith("#"):
            start -= 1
        out[name] = "".join(lines[start : node.end_lineno])
    missing = [n for n in names if n not in out]
    if missing:
        raise SystemExit(f"build_series: {path} lacks top-level definitions {missing}")
    return out


def build_stapo_mask() -> str:
    """Text of verl/trainer/ppo/stapo_mask.py derived from stapo_verl/s2t.py and stapo_verl/dist_utils.py."""
    s2t_path = REPO / "stapo_verl" / "s2t.py"
    s2t_text = s2t_path.read_text(encoding="utf-8")
    if DIST_IMPORT not in s2t_text:
        raise SystemExit(f"build_series: {s2t_path} no longer imports {DIST_IMPORT!r}; update DIST_IMPORT")
    for name in ("math", "torch"):
        if f"import {name}\n" not in s2t_text:
            raise SystemExit(f"build_series: {s2t_path} no longer has 'import {name}'; update the module header")
    dist = _segments(REPO / "stapo_verl" / "dist_utils.py", DIST_NAMES)
    s2t = _segments(s2t_path, S2T_NAMES)
    body = "\n\n".join(s2t[n].rstrip("\n") + "\n" for n in S2T_NAMES[:2])
    header = (
        f"# {LICENSE_HOLDER}\n" + APACHE + STAPO_MASK_DOC + "\n\nfrom __future__ import annotations\n\n"
        "import math\nfrom dataclasses import dataclass\n\nimport torch\nimport torch.distributed as dist\n\n"
    )
    parts = [body, *[dist[n] for n in DIST_NAMES], *[s2t[n] for n in S2T_NAMES[2:]]]
    text = header + "\n\n".join(p.rstrip("\n") + "\n" for p in parts)
    for old, new in DOC_REWRITES.items():
        if old not in text:
            raise SystemExit(
                f"build_series: docstring text to rewrite not found (s2t.py/dist_utils.py changed?): {old!r}"
            )
        text = text.replace(old, new)
    return text


def code_ast(source: str, names: tuple[str, ...]) -> dict[str, str]:
    """``ast.dump`` of the named top-level definitions with docstrings removed (for the drift check)."""
    tree = ast.parse(source)
    out = {}
    for node in tree.body:
        name = getattr(node, "name", None)
        if name is None and isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        if name not in names:
            continue
        for sub in ast.walk(node):
            body = getattr(sub, "body", None)
            if (
                isinstance(sub, ast.FunctionDef | ast.ClassDef)
                and body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                sub.body = body[1:] or [ast.Pass()]
        out[name] = ast.dump(node, include_attributes=False)
    return out


# ----------------------------------------------------------------------------------------------------------------
# 2. Edits of existing verl files: (path, anchor, text, "after"|"before"); each anchor must occur exactly once
# ----------------------------------------------------------------------------------------------------------------


def _read(rel: str) -> str:
    return (SRC / "edits" / rel).read_text(encoding="utf-8")


EDITS: dict[int, list[tuple[str, str, str, str]]] = {
    1: [
        (
            "tests/special_sanity/check_license.py",
            'license_head_individual = "Copyright 2025 Individual Contributor:"\n',
            'license_head_individual_26 = "Copyright 2026 Individual Contributor:"\n',
            "after",
        ),
        (
            "tests/special_sanity/check_license.py",
            "    license_head_individual,\n",
            "    license_head_individual_26,\n",
            "after",
        ),
    ],
    2: [
        (
            "verl/trainer/ppo/core_algos.py",
            "\n\nclass AdvantageEstimator(str, Enum):\n",
            _read("core_algos_mask_registry.py"),
            "before",
        ),
        (
            "verl/workers/utils/losses.py",
            "from verl.trainer.ppo.core_algos import agg_loss, compute_value_loss, get_policy_loss_fn, kl_penalty\n",
            "from verl.trainer.ppo.core_algos import (\n    agg_loss,\n    compute_value_loss,\n"
            "    get_policy_loss_fn,\n    get_policy_loss_mask_fn,\n    kl_penalty,\n)\n",
            "replace",
        ),
        (
            "verl/workers/utils/losses.py",
            "from verl.workers.utils.padding import no_padding_2_padding\n",
            "from verl.workers.utils.padding import no_padding_2_padding, response_to_nested\n",
            "replace",
        ),
        (
            "verl/workers/utils/losses.py",
            "\n\ndef value_loss(config: CriticConfig, model_output, data: TensorDict, dp_group=None):\n",
            _read("losses_apply_policy_loss_mask.py"),
            "before",
        ),
        (
            "verl/workers/engine_workers.py",
            "from verl.workers.utils.losses import ppo_loss\n",
            "from verl.workers.utils.losses import apply_policy_loss_mask, ppo_loss\n",
            "replace",
        ),
        (
            "verl/workers/engine_workers.py",
            "        self.loss_fn = None\n\n    @register(dispatch_mode=Dispatch.ONE_TO_ALL)\n"
            "    def to(self, device, model=True, optimizer=True, grad=True):\n"
            '        """Manual control of load/offload"""\n        assert device in ["cpu", "device"]\n',
            "        self.loss_fn = None\n"
            "        # optional loss-mask pre-pass, run on each optimizer mini-batch (see set_loss_fn)\n"
            "        self.loss_mask_fn = None\n\n    @register(dispatch_mode=Dispatch.ONE_TO_ALL)\n"
            "    def to(self, device, model=True, optimizer=True, grad=True):\n"
            '        """Manual control of load/offload"""\n        assert device in ["cpu", "device"]\n',
            "replace",
        ),
        (
            "verl/workers/engine_workers.py",
            "    @register(dispatch_mode=Dispatch.ONE_TO_ALL)\n    def set_loss_fn(self, loss_fn):\n"
            "        self.loss_fn = loss_fn\n",
            _read("engine_workers_set_loss_fn.py"),
            "replace",
        ),
        (
            "verl/workers/engine_workers.py",
            "        with (\n            self.engine.train_mode(disable_auto_offload=disable_auto_offload),\n"
            '            Timer(name="train_batch", logger=None) as timer,\n',
            _read("engine_workers_pre_pass.py"),
            "before",
        ),
        (
            "verl/workers/engine_workers.py",
            "            if lr is not None:\n"
            '                output["metrics"]["lr"] = lr\n            final_output = self._postprocess_output(\n',
            "            if lr is not None:\n"
            '                output["metrics"]["lr"] = lr\n'
            '            output["metrics"].update(loss_mask_metrics)\n'
            "            final_output = self._postprocess_output(\n",
            "replace",
        ),
        (
            "verl/workers/engine_workers.py",
            "            self.actor.set_loss_fn(self.loss_fn)\n",
            "            self.actor.set_loss_fn(self.loss_fn, loss_mask_fn=partial(apply_policy_loss_mask, actor_config))\n",
            "replace",
        ),
    ],
    3: [
        (
            "verl/trainer/ppo/core_algos.py",
            "from verl.trainer.config import AlgoConfig\n",
            "from verl.trainer.ppo.stapo_mask import s2t_keep_mask\n",
            "after",
        ),
        (
            "verl/trainer/ppo/core_algos.py",
            '\n\ndef compute_entropy_loss(logits, response_mask, loss_agg_mode: str = "token-mean"):\n',
            _read("core_algos_stapo.py"),
            "before",
        ),
        (
            "verl/workers/config/actor.py",
            "            'gpg', 'clip_cov', 'kl_cov', 'geo_mean', 'dro', 'cispo', and 'bypass_mode'.\n",
            "            'gpg', 'clip_cov', 'kl_cov', 'geo_mean', 'dro', 'cispo', 'stapo', and 'bypass_mode'.\n",
            "replace",
        ),
        (
            "verl/workers/config/actor.py",
            "        dro_beta (Optional[float]): Quadratic log-ratio penalty for DRO. Required when loss_mode is 'dro'.\n",
            _read("actor_config_doc.txt"),
            "after",
        ),
        (
            "verl/workers/config/actor.py",
            "    dro_beta: Optional[float] = None\n"
            "    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)\n",
            _read("actor_config_fields.py"),
            "replace",
        ),
        (
            "verl/trainer/config/actor/actor.yaml",
            '  # Must be set to a positive value when policy_loss.loss_mode is "dro".\n  dro_beta: null\n',
            _read("actor_yaml.txt"),
            "after",
        ),
    ],
    4: [
        (
            "docs/index.rst",
            "   algo/dro.md\n",
            "   algo/stapo.md\n",
            "after",
        ),
        (
            "examples/README.md",
            "| `sapo_trainer/`                    | SAPO                           | `loss_mode=sapo`                                    |\n",
            "| `stapo_trainer/`                   | STAPO (spurious-token mask)    | `loss_mode=stapo`                                   |\n",
            "after",
        ),
    ],
}

#: one commit per patch: (subject, body); the new files of patch N live in upstream/src/new/<N>/
PATCHES = {
    1: (
        "[trainer] feat: add the S2T spurious-token mask of STAPO",
        "Adds verl/trainer/ppo/stapo_mask.py: the candidate set, the entropy threshold\n"
        "tau_h = Quantile_q(P) (linear interpolation, exact above torch.quantile's size limit)\n"
        "and the keep mask of STAPO's S2T step (arXiv 2602.15620, Sec. 3, Algorithm 1), with the\n"
        "candidate population gathered over the data-parallel group. Pure tensor code, no caller yet.\n"
        "Also accepts 2026 'Individual Contributor' license headers in check_license.py.\n",
    ),
    2: (
        "[worker, trainer] feat: loss-mask pre-pass for policy losses before batch_num_tokens",
        "Policy losses see one micro-batch and no entropy, and the engines count the\n"
        "mini-batch's tokens (batch_num_tokens) from loss_mask before the micro-batch loop.\n"
        "A token selection that needs statistics of the whole optimizer mini-batch (STAPO) can\n"
        "therefore neither compute its threshold nor renormalise token-mean over the kept tokens.\n\n"
        "register_policy_loss_mask(name) registers a pre-pass for a loss mode.\n"
        "TrainingWorker.train_batch runs it once per optimizer mini-batch, on padded\n"
        "response_mask/old_log_probs/advantages/entropy, and writes the returned keep mask into\n"
        "response_mask and loss_mask, so batch_num_tokens is the kept-token count. Loss modes\n"
        "without a pre-pass are unchanged (one dict lookup per mini-batch).\n",
    ),
    3: (
        "[trainer, cfg] feat: add the STAPO policy loss (loss_mode=stapo)",
        "loss_mode=stapo: verl's vanilla PPO surrogate (clipping, dual clip, rollout_is_weights,\n"
        "every loss_agg_mode) on the tokens kept by the S2T mask, which the stapo pre-pass computes\n"
        "from the old-policy log-probs and entropy of the whole optimizer mini-batch across DP.\n"
        "New PolicyLossConfig fields stapo_tau_p (0.002) and stapo_entropy_quantile (0.75), validated\n"
        "at construction; actor.yaml documents them; generated trainer YAMLs regenerated with\n"
        "scripts/generate_trainer_config.sh.\n",
    ),
    4: (
        "[doc] feat: STAPO algorithm page and example",
        "docs/algo/stapo.md (+ index entry) and examples/stapo_trainer/ (README,\nrun_qwen3_8b_megatron.sh).\n",
    ),
}


def _insert(path: Path, anchor: str, text: str, where: str) -> None:
    content = path.read_text(encoding="utf-8")
    count = content.count(anchor)
    if count != 1:
        raise SystemExit(f"build_series: anchor occurs {count} times (need 1) in {path}: {anchor[:80]!r}")
    new = {"after": anchor + text, "before": text + anchor, "replace": text}[where]
    path.write_text(content.replace(anchor, new), encoding="utf-8")


def _run(cmd: list[str], cwd: Path, env: dict | None = None) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"build_series: {' '.join(cmd)} failed in {cwd}:\n{res.stdout}\n{res.stderr}")
    return res.stdout


def _git_env() -> dict:
    env = dict(os.environ)
    env.update(
        GIT_AUTHOR_NAME=AUTHOR.split(" <")[0],
        GIT_AUTHOR_EMAIL=AUTHOR.split("<")[1].rstrip(">"),
        GIT_COMMITTER_NAME=AUTHOR.split(" <")[0],
        GIT_COMMITTER_EMAIL=AUTHOR.split("<")[1].rstrip(">"),
        GIT_AUTHOR_DATE=DATE,
        GIT_COMMITTER_DATE=DATE,
        GIT_CONFIG_NOSYSTEM="1",
        HOME=str(Path(tempfile.gettempdir())),
    )
    return env


def regenerate_trainer_yamls(tree: Path) -> None:
    """Run verl's scripts/generate_trainer_config.sh in ``tree`` with ``tree`` first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["VERL_USE_EXTERNAL_PLUGINS"] = "none"  # the installed stapo_verl plugin must not shadow the patched tree
    res = subprocess.run(
        ["bash", "scripts/generate_trainer_config.sh"], cwd=tree, env=env, capture_output=True, text=True
    )
    # the script exits 1 when the regenerated files differ from git HEAD, which is expected while building
    if res.returncode not in (0, 1) or "Generated:" not in res.stdout + res.stderr:
        raise SystemExit(f"build_series: generate_trainer_config.sh failed:\n{res.stdout}\n{res.stderr}")


def build(out_dir: Path) -> list[str]:
    """Write the series into ``out_dir``; return the patch file names in order."""
    tmp = Path(tempfile.mkdtemp(prefix="stapo_series_"))
    try:
        tree = tmp / "verl"
        shutil.copytree(VERL_MAIN, tree, symlinks=True)
        _run(["chmod", "-R", "u+w", "."], tree)  # the snapshot is read-only
        env = _git_env()
        _run(["git", "init", "-q"], tree, env)
        _run(["git", "add", "-A"], tree, env)
        _run(["git", "commit", "-q", "-m", "base"], tree, env)
        for n, (subject, body) in PATCHES.items():
            if n == 1:
                (tree / "verl/trainer/ppo/stapo_mask.py").write_text(build_stapo_mask(), encoding="utf-8")
            new_root = SRC / "new" / str(n)
            if new_root.exists():
                for f in sorted(new_root.rglob("*")):
                    if f.is_file():
                        dst = tree / f.relative_to(new_root)
                        dst.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(f, dst)
            for rel, anchor, text, where in EDITS.get(n, []):
                _insert(tree / rel, anchor, text, where)
            if n == 3:
                regenerate_trainer_yamls(tree)
            _run(["git", "add", "-A"], tree, env)
            _run(["git", "commit", "-q", "-m", subject + "\n\n" + body], tree, env)
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in out_dir.glob("*.patch"):
            old.unlink()
        names = _run(
            [
                "git",
                "format-patch",
                "--zero-commit",
                "--no-signature",
                "--full-index",
                "--no-numbered",
                "-o",
                str(out_dir),
                f"HEAD~{len(PATCHES)}",
            ],
            tree,
            env,
        ).split()
        names = [Path(p).name for p in names]
        (out_dir / "series").write_text("".join(n + "\n" for n in names), encoding="utf-8")
        return names
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point: build into upstream/patches/, or with ``--check`` compare a fresh build with it."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="fail if upstream/patches/ differs from a fresh build")
    args = ap.parse_args(argv)
    if not args.check:
        names = build(PATCH_DIR)
        print("\n".join(names))
        return 0
    with tempfile.TemporaryDirectory() as d:
        fresh = Path(d)
        build(fresh)
        bad = []
        for f in sorted(set(p.name for p in fresh.iterdir()) | set(p.name for p in PATCH_DIR.iterdir())):
            a, b = PATCH_DIR / f, fresh / f
            ta = a.read_text(encoding="utf-8").splitlines(keepends=True) if a.exists() else []
            tb = b.read_text(encoding="utf-8").splitlines(keepends=True) if b.exists() else []
            if ta != tb:
                bad.append(f)
                sys.stdout.writelines(difflib.unified_diff(ta, tb, f"committed/{f}", f"fresh/{f}", n=1))
        if bad:
            print(
                f"\nbuild_series --check: {bad} differ from a fresh build (stapo_verl/s2t.py or upstream/src changed?)."
                " Run: python upstream/build_series.py"
            )
            return 1
    print(f"build_series --check: {len(list(PATCH_DIR.glob('*.patch')))} patches match a fresh build")
    return 0


if __name__ == "__main__":
    sys.exit(main())
