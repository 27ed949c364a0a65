"""Build (or check) the upstream patch series ``upstream/patches/`` that adds policy token masks and STAPO to verl.

The series is generated, never edited by hand. Its base is **verl 0.9.1 + overlay**: the verl 0.9.1 source
distribution from PyPI (``verl/``, ``tests/``, ``scripts/``, ``pyproject.toml``; pinned by sha256) with the few
verl-main files it lacks copied over it from ``upstream/verl_overlay/tree/`` (pre-commit pins, the trainer-YAML
generator, ``tests/special_sanity/``, the docs index, the examples index, the existing CPU tests of the files the
series touches; provenance and sha256 in ``upstream/verl_overlay/README.md``). No verl checkout is needed.

One source: the definitions the series adds to verl are copied from this repository's plugin through :mod:`ast`
source segments (table :data:`SHARED`), so the plugin and the series share ONE implementation of the extension
point (registry, pre-pass, masked ``ppo_loss``) and of the S2T mask maths. Only docstrings and ``#:`` comments may be
rewritten on the way (:data:`DOC_REWRITES`; a rewrite whose text is gone fails the build). Everything else of the
series is in :data:`PATCHES` (anchored edits of existing verl files) and ``upstream/src/<patch>/`` (new files,
laid out as in verl's tree). The generated trainer YAMLs are regenerated with verl's own
``scripts/generate_trainer_config.sh``.

Usage::

    python upstream/build_series.py                     # rewrite upstream/patches/ from the sources
    python upstream/build_series.py --check             # exit 1 if upstream/patches/ differs from a fresh build
    python upstream/build_series.py --check-tree TREE   # exit 1 if a patched verl tree drifted from the plugin
    python upstream/build_series.py --sizes             # +/- per patch: production / tests / docs
    python upstream/build_series.py --base-tree DIR     # write verl 0.9.1 + overlay (unpatched) into DIR
    python upstream/build_series.py --check-overlay     # the vendored files match their recorded sha256
    python upstream/build_series.py --check-docs        # PR.md: a section per patch, current sizes; no outside refs
    python upstream/build_series.py --refresh-overlay VERL_MAIN_TREE   # re-vendor the overlay (maintainers)

``VERL_SDIST=<path to verl-0.9.1.tar.gz>`` skips the download (``pip download --no-deps --no-binary :all:``).
Needs ``git`` and the project ``.venv`` (hydra-core/omegaconf/torch for the YAML regeneration).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SRC = HERE / "src"
PATCH_DIR = HERE / "patches"
OVERLAY = HERE / "verl_overlay"

VERL_VERSION = "0.9.1"
#: sha256 of verl-0.9.1.tar.gz on PyPI (the base of the series; PyPI files are immutable)
VERL_SDIST_SHA256 = "3e03d8816b2546b2c5580705671b8d0bb3f79b8364e7b5c56dbfc1245536ba22"
#: the sdist's top-level entries that are part of verl's repository (the rest are packaging artefacts)
SDIST_KEEP = ("LICENSE", "README.md", "pyproject.toml", "setup.py", "scripts", "tests", "verl")
VERL_MAIN_URL = "https://github.com/verl-project/verl"
VERL_MAIN_COMMIT = "1dda039b9c6311889a9c9a26040677e1254814f9"
#: verl-main files vendored into the overlay (paths in verl's tree), and why
OVERLAY_FILES = {
    ".pre-commit-config.yaml": "ruff/mypy pins and the pre-commit hooks the check runs",
    ".github/PULL_REQUEST_TEMPLATE.md": "read by tests/special_sanity/check_pr_description.py",
    "scripts/generate_trainer_config.sh": "regenerates verl/trainer/config/_generated_*.yaml (autogen-trainer-cfg)",
    "docs/index.rst": "the docs index PR B adds docs/algo/stapo.md to",
    "examples/README.md": "the examples index the example PR adds a row to",
    "tests/special_sanity/check_license.py": "edited by the licence-header PR; license check",
    "tests/special_sanity/check_pr_title.py": "PR title / commit subject format",
    "tests/special_sanity/check_pr_description.py": "PR body filled in",
    "tests/special_sanity/check_docstrings.py": "docstring coverage of core_algos.py",
    "tests/special_sanity/check_docs_time_info.py": "docs carry 'Last updated'",
    "tests/special_sanity/check_example_naming.py": "example script naming",
    "tests/special_sanity/check_uv_gpu_only.py": "uv only on the GPU branch of shell scripts",
    "tests/special_sanity/check_device_api_usage.py": "no raw CUDA API in verl/",
    "tests/special_sanity/validate_structure.py": "tests/ mirrors verl/",
    "tests/special_sanity/test_config_docs.py": "every actor.yaml key documented",
    "tests/workers/config/test_actor_config_on_cpu.py": "existing test of verl/workers/config/actor.py",
    "tests/workers/test_engine_workers_mini_batch_trace_on_cpu.py": "existing test of engine_workers.py",
    "tests/workers/test_engine_return_model_output_on_cpu.py": "existing test of the engine workers' loss path",
}
#: licence files of verl kept beside the overlay (Apache-2.0 §4: a copy of the licence and the NOTICE)
OVERLAY_LICENSE_FILES = ("LICENSE", "Notice.txt")

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
# 1. One source: plugin definitions copied into verl
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shared:
    """Top-level definitions of a plugin module that a patch copies into a verl file.

    Attributes:
        plugin: the module in this repository (path from the repository root).
        names: the top-level names copied, in this order.
        target: the verl file they land in.
        patch: the patch (key of :data:`PATCHES`) that adds them.
    """

    plugin: str
    names: tuple[str, ...]
    target: str
    patch: str


SHARED = (
    Shared(
        "stapo_verl/core/registry.py",
        (
            "PolicyTokenMaskFn",
            "PolicyTokenMask",
            "POLICY_TOKEN_MASK_REGISTRY",
            "register_policy_token_mask",
            "get_policy_token_mask",
        ),
        "verl/trainer/ppo/core_algos.py",
        "A",
    ),
    Shared(
        "stapo_verl/core/losses.py",
        (
            "POLICY_LOSS_MASK_KEY",
            "POLICY_BATCH_NUM_TOKENS_KEY",
            "apply_policy_token_mask",
            "get_policy_batch_num_tokens",
            "compute_masked_policy_loss",
            "ppo_loss",
        ),
        "verl/workers/utils/losses.py",
        "A",
    ),
    Shared(
        "stapo_verl/algo/s2t.py",
        (
            "TORCH_QUANTILE_MAX_NUMEL",
            "CandidateSelection",
            "linear_quantile",
            "S2TStats",
            "candidate_mask",
            "low_entropy_selection",
            "_gather_population",
            "_sum_over_group",
            "s2t_keep_mask",
        ),
        "verl/trainer/ppo/s2t_mask.py",
        "B",
    ),
    Shared("stapo_verl/core/masks.py", ("S2T_FIELDS", "compute_s2t_token_mask"), "verl/trainer/ppo/core_algos.py", "B"),
)

#: ``PolicyLossConfig`` fields the series adds, which the plugin's ``StapoPolicyLossConfig`` must declare with the
#: same type and default (and ``actor.yaml`` with the same default): field -> patch
SHARED_CONFIG = {"token_mask": "A", "tau_p": "B", "entropy_quantile": "B"}
PLUGIN_CONFIG = ("stapo_verl/core/config.py", "StapoPolicyLossConfig")

#: docstring / comment text of the copied definitions that names this plugin -> verl's wording (exact, must exist)
DOC_REWRITES = {
    "stapo_verl/core/losses.py": {
        ":mod:`stapo_verl.core.registry`).": "``register_policy_token_mask`` in ``verl.trainer.ppo.core_algos``).",
    },
    "stapo_verl/core/masks.py": {
        "#: the mini-batch fields every S2T-family mask reads": "#: the mini-batch fields the S2T mask reads",
    },
}
#: words a copied definition must not contain after the rewrites (it would point at this plugin)
FORBIDDEN_IN_COPIES = ("stapo_verl", "plugin")


def _top_level_name(node: ast.stmt) -> str | None:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def _spans(path: Path, names: tuple[str, ...]) -> tuple[list[str], dict[str, tuple[int, int, int]]]:
    """Lines of ``path`` and, per named top-level statement, ``(index in the module body, first line, end line)``.

    The first line includes decorators and the ``#:`` comment lines right above the statement (0-based, end
    exclusive).

    Raises:
        SystemExit: a name is not defined at the top level of ``path``.
    """
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    spans: dict[str, tuple[int, int, int]] = {}
    for index, node in enumerate(ast.parse(text).body):
        name = _top_level_name(node)
        if name not in names:
            continue
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        while start > 0 and lines[start - 1].lstrip().startswith("#"):
            start -= 1
        spans[name] = (index, start, node.end_lineno)
    missing = [n for n in names if n not in spans]
    if missing:
        raise SystemExit(f"build_series: {path.relative_to(REPO)} lacks top-level definitions {missing}")
    return lines, spans


def _rewrite(shared: Shared, text: str, label: str) -> str:
    """``text`` with :data:`DOC_REWRITES` applied; refuses text that still names the plugin."""
    for old, new in DOC_REWRITES.get(shared.plugin, {}).items():
        text = text.replace(old, new)
    for word in FORBIDDEN_IN_COPIES:
        if word in text:
            raise SystemExit(
                f"build_series: {shared.plugin}::{label} mentions {word!r}; reword it in the plugin (or add a "
                "DOC_REWRITES entry for a docstring)"
            )
    return text


def block(shared: Shared, names: tuple[str, ...] | None = None) -> str:
    """The named definitions of ``shared`` (default: all) as verl source, ending in a newline.

    Definitions that are consecutive statements in the plugin module are copied as one verbatim stretch (blank
    lines and ``#:`` comments included); stretches are joined by two blank lines. Names must be in module order.

    Raises:
        SystemExit: a name is missing or out of order, or a :data:`DOC_REWRITES` text of the module is gone.
    """
    names = shared.names if names is None else names
    lines, spans = _spans(REPO / shared.plugin, names)
    order = [spans[n][0] for n in names]
    if order != sorted(order):
        raise SystemExit(f"build_series: {shared.plugin}: {names} are not in the module's order")
    module_text = "".join(lines)
    for old in DOC_REWRITES.get(shared.plugin, {}):
        if old not in module_text:
            raise SystemExit(f"build_series: {shared.plugin} no longer contains {old!r}; update DOC_REWRITES")
    stretches: list[tuple[int, int]] = []
    previous = None
    for name in names:
        index, start, end = spans[name]
        if previous is not None and index == previous + 1:
            stretches[-1] = (stretches[-1][0], end)
        else:
            stretches.append((start, end))
        previous = index
    text = "\n\n\n".join("".join(lines[a:b]).strip("\n") for a, b in stretches) + "\n"
    return _rewrite(shared, text, ", ".join(names))


def code_ast(source: str, names: tuple[str, ...]) -> dict[str, str]:
    """``ast.dump`` of the named top-level definitions, docstrings removed (comments never reach the AST)."""
    out = {}
    for node in ast.parse(source).body:
        name = _top_level_name(node)
        if name not in names:
            continue
        for sub in ast.walk(node):
            body = getattr(sub, "body", None)
            if (
                isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                sub.body = body[1:] or [ast.Pass()]
        out[name] = ast.dump(node, include_attributes=False)
    return out


def config_fields(source: str, cls: str, names) -> dict[str, tuple[str, str]]:
    """``{field: (annotation, default)}`` (both ``ast.unparse``) of the named fields of dataclass ``cls``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {
                s.target.id: (ast.unparse(s.annotation), ast.unparse(s.value) if s.value is not None else "")
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id in names
            }
    return {}


def s2t_mask_module() -> str:
    """Text of ``verl/trainer/ppo/s2t_mask.py``: a licence header, then the plugin module's docstring, its import
    block and its :data:`SHARED` definitions, verbatim.

    Raises:
        SystemExit: the plugin module has no docstring, or imports anything but the standard library and torch.
    """
    shared = next(s for s in SHARED if s.target == "verl/trainer/ppo/s2t_mask.py")
    text = (REPO / shared.plugin).read_text(encoding="utf-8")
    tree = ast.parse(text)
    doc = ast.get_docstring(tree, clean=False)
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    if doc is None or not imports:
        raise SystemExit(f"build_series: {shared.plugin} has no module docstring or no imports")
    for node in imports:
        module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
        if (module or "").split(".")[0] not in sys.stdlib_module_names | {"torch", "__future__"}:
            raise SystemExit(f"build_series: {shared.plugin} imports {module}; the S2T maths must be torch only")
    lines, spans = _spans(REPO / shared.plugin, shared.names[:1])
    # the imports and the blank lines after them, as in the plugin module
    import_block = "".join(lines[imports[0].lineno - 1 : spans[shared.names[0]][1]])
    header = f"# {LICENSE_HOLDER}\n{APACHE}" + f'"""{doc}"""\n\n'
    return _rewrite(shared, header + import_block + block(shared), "module")


# ----------------------------------------------------------------------------------------------------------------
# 2. The patches: one commit per pull request
# ----------------------------------------------------------------------------------------------------------------


def _insert(path: Path, anchor: str, text: str, where: str) -> None:
    """Insert ``text`` ``after``/``before`` the one occurrence of ``anchor`` in ``path``, or ``replace`` it."""
    content = path.read_text(encoding="utf-8")
    count = content.count(anchor)
    if count != 1:
        raise SystemExit(f"build_series: anchor occurs {count} times (need 1) in {path.name}: {anchor[:90]!r}")
    new = {"after": anchor + text, "before": text + anchor, "replace": text}[where]
    path.write_text(content.replace(anchor, new), encoding="utf-8")


def _replace_def(path: Path, name: str, source: str) -> None:
    """Replace the top-level definition ``name`` of ``path`` (its full source segment) with ``source``."""
    text = path.read_text(encoding="utf-8")
    nodes = [n for n in ast.parse(text).body if _top_level_name(n) == name]
    if len(nodes) != 1:
        raise SystemExit(f"build_series: {path.name} defines {name} {len(nodes)} times (need 1)")
    lines = text.splitlines(keepends=True)
    node = nodes[0]
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    path.write_text("".join(lines[:start]) + source.strip("\n") + "\n" + "".join(lines[node.end_lineno :]))


def _copy_new_files(tree: Path, key: str) -> None:
    root = SRC / key
    if root.exists():
        for f in sorted(root.rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                dst = tree / f.relative_to(root)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, dst)
                if os.access(f, os.X_OK):
                    dst.chmod(0o755)


def patch_license(tree: Path) -> None:
    """Side PR: ``check_license.py`` accepts 2026 "Individual Contributor" headers (the new files carry one)."""
    path = tree / "tests/special_sanity/check_license.py"
    _insert(
        path,
        'license_head_individual = "Copyright 2025 Individual Contributor:"\n',
        'license_head_individual_26 = "Copyright 2026 Individual Contributor:"\n',
        "after",
    )
    _insert(path, "    license_head_individual,\n", "    license_head_individual_26,\n", "after")


def patch_a(tree: Path) -> None:
    """PR A: the policy-token-mask extension point (registry, pre-pass, masked ppo_loss, worker wiring, config)."""
    core = tree / "verl/trainer/ppo/core_algos.py"
    _insert(core, "from collections import defaultdict\n", "from dataclasses import dataclass\n", "after")
    _insert(core, "\n\nclass AdvantageEstimator(str, Enum):\n", "\n\n" + block(SHARED[0]), "before")

    losses = tree / "verl/workers/utils/losses.py"
    _insert(
        losses,
        "\nimport torch\nfrom tensordict",
        "\nfrom functools import partial\n\nimport torch\nimport torch.distributed as dist\nfrom tensordict",
        "replace",
    )
    _insert(
        losses,
        "from verl.trainer.ppo.core_algos import agg_loss, compute_value_loss, get_policy_loss_fn, kl_penalty\n",
        "from verl.trainer.ppo.core_algos import (\n    agg_loss,\n    compute_value_loss,\n    get_policy_loss_fn,\n"
        "    get_policy_token_mask,\n    kl_penalty,\n)\n",
        "replace",
    )
    _insert(
        losses,
        "from verl.workers.utils.padding import no_padding_2_padding\n",
        "from verl.workers.utils.padding import no_padding_2_padding, response_to_nested\n",
        "replace",
    )
    _insert(losses, "\n\ndef ppo_loss(", "\n\n" + block(SHARED[1], SHARED[1].names[:-1]), "before")
    _replace_def(losses, "ppo_loss", block(SHARED[1], ("ppo_loss",)))

    workers = tree / "verl/workers/engine_workers.py"
    _insert(
        workers,
        "from verl.workers.utils.losses import ppo_loss\n",
        "from verl.workers.utils.losses import apply_policy_token_mask, ppo_loss\n",
        "replace",
    )
    _insert(
        workers,
        "        self.loss_fn = None\n\n    @register(dispatch_mode=Dispatch.ONE_TO_ALL)\n    def to(",
        "        self.loss_fn = None\n        self.pre_loss_fn = None\n\n"
        "    @register(dispatch_mode=Dispatch.ONE_TO_ALL)\n    def to(",
        "replace",
    )
    _insert(
        workers,
        "    @register(dispatch_mode=Dispatch.ONE_TO_ALL)\n    def set_loss_fn(self, loss_fn):\n"
        "        self.loss_fn = loss_fn\n",
        '''    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_loss_fn(self, loss_fn, pre_loss_fn=None):
        """Set the loss and, optionally, a pre-pass run on each optimizer mini-batch before the engine splits it.

        Args:
            loss_fn: ``loss_fn(model_output, data, dp_group)``, called by the engine on every micro-batch.
            pre_loss_fn: ``pre_loss_fn(data, dp_group=...) -> metrics``, called by ``train_batch`` on the whole
                mini-batch, e.g. ``partial(verl.workers.utils.losses.apply_policy_token_mask, actor_config)``.
        """
        self.loss_fn = loss_fn
        self.pre_loss_fn = pre_loss_fn
''',
        "replace",
    )
    _insert(
        workers,
        "                    update_lr_scheduler=batch_idx == total_num_iterations - 1,\n",
        "                    mini_batch_index=batch_idx,\n",
        "after",
    )
    _insert(
        workers,
        "        with (\n            self.engine.train_mode(disable_auto_offload=disable_auto_offload),\n"
        '            Timer(name="train_batch", logger=None) as timer,\n',
        "        # pre-pass over the whole mini-batch (e.g. policy_loss.token_mask), before the engine counts tokens\n"
        "        pre_loss_metrics = {}\n"
        "        if self.pre_loss_fn is not None:\n"
        "            pre_loss_metrics = self.pre_loss_fn(data, dp_group=self.engine.get_data_parallel_group())\n\n",
        "before",
    )
    _insert(
        workers,
        '            if lr is not None:\n                output["metrics"]["lr"] = lr\n',
        '            output["metrics"].update(pre_loss_metrics)\n',
        "after",
    )
    _insert(
        workers,
        "            self.actor.set_loss_fn(self.loss_fn)\n",
        "            token_mask = actor_config.policy_loss.token_mask\n"
        "            pre_loss_fn = partial(apply_policy_token_mask, actor_config) if token_mask is not None else None\n"
        "            self.actor.set_loss_fn(self.loss_fn, pre_loss_fn=pre_loss_fn)\n",
        "replace",
    )

    actor = tree / "verl/workers/config/actor.py"
    _insert(
        actor,
        "        dro_beta (Optional[float]): Quadratic log-ratio penalty for DRO. Required when loss_mode is 'dro'.\n",
        "        token_mask (Optional[str]): Registered policy token mask (``register_policy_token_mask``) applied to\n"
        "            the policy-gradient term of any loss_mode; the KL and entropy terms are not masked. "
        "None: no mask.\n",
        "after",
    )
    _insert(actor, "    dro_beta: Optional[float] = None\n", "    token_mask: Optional[str] = None\n", "after")
    _insert(
        actor,
        "    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)\n\n\n"
        "@dataclass\nclass ActorConfig(BaseConfig):\n",
        '''    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)

    def __post_init__(self):
        """Validate the policy token mask, only when one is selected."""
        if self.token_mask is not None:
            from verl.trainer.ppo.core_algos import get_policy_token_mask  # core_algos imports this module

            get_policy_token_mask(self.token_mask)  # raises ValueError naming the registered masks


@dataclass
class ActorConfig(BaseConfig):
''',
        "replace",
    )
    _insert(
        tree / "verl/trainer/config/actor/actor.yaml",
        '  # Must be set to a positive value when policy_loss.loss_mode is "dro".\n  dro_beta: null\n',
        "\n  # Registered policy token mask applied to the policy-gradient term of any loss_mode, e.g. s2t (STAPO).\n"
        "  # The KL and entropy terms are not masked. null: no mask.\n  token_mask: null\n",
        "after",
    )
    regenerate_trainer_yamls(tree)
    _copy_new_files(tree, "a")


def patch_b(tree: Path) -> None:
    """PR B: STAPO's S2T mask (``s2t_mask.py``, ``token_mask=s2t``, ``tau_p``/``entropy_quantile``, doc page)."""
    (tree / "verl/trainer/ppo/s2t_mask.py").write_text(s2t_mask_module(), encoding="utf-8")
    core = tree / "verl/trainer/ppo/core_algos.py"
    _insert(
        core,
        "from verl.trainer.config import AlgoConfig\n",
        "from verl.trainer.ppo.s2t_mask import s2t_keep_mask\n",
        "after",
    )
    _insert(
        core,
        '\n\ndef compute_entropy_loss(logits, response_mask, loss_agg_mode: str = "token-mean"):\n',
        "\n\n" + block(SHARED[3]),
        "before",
    )
    actor = tree / "verl/workers/config/actor.py"
    _insert(
        actor,
        "            the policy-gradient term of any loss_mode; the KL and entropy terms are not masked. "
        "None: no mask.\n",
        "        tau_p (float): S2T mask (token_mask 's2t'): spurious-token candidates have probability < tau_p; "
        "in (0, 1).\n"
        "        entropy_quantile (float): S2T: candidates with entropy below this quantile of theirs are "
        "silenced; in (0, 1].\n",
        "after",
    )
    _insert(
        actor,
        "    token_mask: Optional[str] = None\n",
        "    tau_p: float = 0.002\n    entropy_quantile: float = 0.75\n",
        "after",
    )
    _insert(
        actor,
        "            get_policy_token_mask(self.token_mask)  # raises ValueError naming the registered masks\n",
        '        if self.token_mask == "s2t" and not (0.0 < self.tau_p < 1.0 and 0.0 < self.entropy_quantile <= 1.0):\n'
        "            raise ValueError(\n"
        '                "policy_loss.token_mask=s2t needs 0 < tau_p < 1 and 0 < entropy_quantile <= 1, "\n'
        '                f"got tau_p={self.tau_p!r}, entropy_quantile={self.entropy_quantile!r}"\n'
        "            )\n",
        "after",
    )
    _insert(
        tree / "verl/trainer/config/actor/actor.yaml",
        "  # The KL and entropy terms are not masked. null: no mask.\n  token_mask: null\n",
        "\n  # S2T mask (token_mask: s2t, STAPO): positive-advantage tokens with probability < tau_p are candidates.\n"
        "  tau_p: 0.002\n\n"
        "  # S2T mask: candidates with entropy below this quantile of the mini-batch's candidates are silenced.\n"
        "  entropy_quantile: 0.75\n",
        "after",
    )
    regenerate_trainer_yamls(tree)
    _insert(tree / "docs/index.rst", "   algo/dro.md\n", "   algo/stapo.md\n", "after")
    _copy_new_files(tree, "b")


def patch_example(tree: Path) -> None:
    """Side PR: ``examples/stapo_trainer/`` (README, run script) and its row in ``examples/README.md``."""
    _insert(
        tree / "examples/README.md",
        "| `sapo_trainer/`                    | SAPO                 "
        "          | `loss_mode=sapo`                                    |\n",
        "| `stapo_trainer/`                   | STAPO                "
        "          | `policy_loss.token_mask=s2t`                        |\n",
        "after",
    )
    _copy_new_files(tree, "example")


@dataclass(frozen=True)
class Patch:
    """One commit of the series, i.e. one pull request (verl squash-merges PRs).

    Attributes:
        key: short name (``upstream/src/<key>/`` holds its new files). pr: the pull request it is.
        subject: commit subject = PR title, verl's ``[modules] type: description`` format.
        body: commit message body. apply: edits a verl tree in place.
    """

    key: str
    pr: str
    subject: str
    body: str
    apply: Callable[[Path], None]


PATCHES = (
    Patch(
        "license",
        "side PR (licence header)",
        "[ci] chore: accept 2026 Individual Contributor license headers",
        "check_license.py accepts 'Copyright 2025 Individual Contributor:' only; new files written in\n"
        "2026 by individual contributors need the 2026 form (as bytedance/amazon/huawei/nvidia have).\n",
        patch_license,
    ),
    Patch(
        "a",
        "PR A (extension point)",
        "[trainer, worker, cfg] feat: policy token masks for the policy-gradient term of any policy loss",
        "A registry of policy token masks (register_policy_token_mask, next to register_policy_loss),\n"
        "selected with actor.policy_loss.token_mask (default null: no behaviour change).\n\n"
        "TrainingWorker.train_batch runs the selected mask once per optimizer mini-batch, before the\n"
        "engine splits it into micro-batches and counts batch_num_tokens (set_loss_fn(loss_fn,\n"
        "pre_loss_fn=...)). The mask sees the mini-batch fields it declares (padded (bs, T)) and the DP\n"
        "group, and writes policy_loss_mask plus its global count policy_batch_num_tokens. ppo_loss\n"
        "applies them to the policy-gradient term only, around any registered policy loss and every\n"
        "loss_agg_mode; the KL and entropy terms keep response_mask and batch_num_tokens. A configured\n"
        "mask that did not run raises instead of training without it. train_mini_batch passes\n"
        "mini_batch_index so that a mask can be seeded reproducibly.\n",
        patch_a,
    ),
    Patch(
        "b",
        "PR B (STAPO)",
        "[algo, trainer, cfg, doc] feat: add the S2T spurious-token mask of STAPO (token_mask=s2t)",
        "STAPO (arXiv 2602.15620) silences spurious tokens: positive-advantage tokens with probability\n"
        "below tau_p and entropy below tau_h = Quantile_q of all such candidates in the optimizer\n"
        "mini-batch (over DP), then renormalises the policy-gradient token-mean over the kept tokens.\n\n"
        "verl/trainer/ppo/s2t_mask.py holds the maths (torch only; the DP collectives are\n"
        "torch.distributed's all_gather_object and all_reduce). core_algos registers it as the policy\n"
        "token mask 's2t', which composes with any loss_mode. PolicyLossConfig gains tau_p (0.002) and\n"
        "entropy_quantile (0.75), validated only when token_mask=s2t; actor.yaml documents them; the\n"
        "generated trainer YAMLs are regenerated. docs/algo/stapo.md describes the algorithm.\n",
        patch_b,
    ),
    Patch(
        "example",
        "side PR (example)",
        "[doc] feat: add the STAPO example script (examples/stapo_trainer)",
        "examples/stapo_trainer/ (README, run_qwen3_8b_megatron.sh) and its row in examples/README.md.\n",
        patch_example,
    ),
)


# ----------------------------------------------------------------------------------------------------------------
# 3. The base tree: verl 0.9.1 (PyPI sdist) + overlay
# ----------------------------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_sdist(dest: Path) -> Path:
    """``$VERL_SDIST`` or a fresh ``pip download`` of verl 0.9.1's sdist into ``dest``; sha256 verified.

    Raises:
        SystemExit: the download failed or the file's sha256 is not :data:`VERL_SDIST_SHA256`.
    """
    given = os.environ.get("VERL_SDIST")
    if given:
        path = Path(given)
    else:
        dest.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps"]
        cmd += ["--no-binary", ":all:", f"verl=={VERL_VERSION}", "-d", str(dest)]
        _run(cmd, REPO)
        path = dest / f"verl-{VERL_VERSION}.tar.gz"
    if not path.is_file() or _sha256(path) != VERL_SDIST_SHA256:
        raise SystemExit(f"build_series: {path} is not verl {VERL_VERSION}'s sdist (sha256 {VERL_SDIST_SHA256})")
    return path


def make_base_tree(dst: Path, sdist: Path) -> None:
    """Write verl 0.9.1 + overlay into ``dst`` (created; must not exist)."""
    dst.mkdir(parents=True)
    prefix = f"verl-{VERL_VERSION}/"
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            rel = m.name[len(prefix) :] if m.name.startswith(prefix) else ""
            if rel and rel.split("/")[0] in SDIST_KEEP and (m.isfile() or m.isdir()):
                m.name = rel
                members.append(m)
        tar.extractall(dst, members=members, filter="data")
    for rel in OVERLAY_FILES:
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(OVERLAY / "tree" / rel, target)
        if rel.endswith(".sh"):
            target.chmod(0o755)


def overlay_table() -> str:
    """The provenance table of the overlay README (path, sha256, why), one row per vendored file."""
    rows = ["| path in verl's tree | sha256 | needed for |", "|---|---|---|"]
    for rel, why in OVERLAY_FILES.items():
        rows.append(f"| `{rel}` | `{_sha256(OVERLAY / 'tree' / rel)}` | {why} |")
    for rel in OVERLAY_LICENSE_FILES:
        rows.append(f"| `{rel}` (beside `tree/`) | `{_sha256(OVERLAY / rel)}` | verl's licence and notice |")
    return "\n".join(rows) + "\n"


def check_overlay() -> int:
    """1 unless every vendored file is listed in the overlay README with its current sha256 (and nothing else)."""
    readme = (OVERLAY / "README.md").read_text(encoding="utf-8")
    if overlay_table() not in readme:
        print("build_series --check-overlay: upstream/verl_overlay/README.md's table differs from the files:")
        print(overlay_table())
        return 1
    listed = {OVERLAY / "tree" / r for r in OVERLAY_FILES} | {OVERLAY / r for r in OVERLAY_LICENSE_FILES}
    extra = sorted(
        str(p.relative_to(OVERLAY))
        for p in OVERLAY.rglob("*")
        if p.is_file() and p not in listed and p.name != "README.md"
    )
    if extra:
        print(f"build_series --check-overlay: files not in OVERLAY_FILES: {extra}")
        return 1
    print(f"build_series --check-overlay: {len(listed)} vendored files match their sha256")
    return 0


def refresh_overlay(verl_main: Path) -> None:
    """Copy :data:`OVERLAY_FILES` (and verl's licence files) from a verl main tree; rewrite the README's table."""
    for rel in OVERLAY_FILES:
        target = OVERLAY / "tree" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(verl_main / rel, target)
    for rel in OVERLAY_LICENSE_FILES:
        shutil.copyfile(verl_main / rel, OVERLAY / rel)
    readme = OVERLAY / "README.md"
    text = readme.read_text(encoding="utf-8")
    start, end = text.index("| path in verl's tree |"), text.index("\n\n", text.index("| path in verl's tree |"))
    readme.write_text(text[:start] + overlay_table().rstrip("\n") + text[end:], encoding="utf-8")


# ----------------------------------------------------------------------------------------------------------------
# 4. Build, check, sizes
# ----------------------------------------------------------------------------------------------------------------


def _run(cmd: list[str], cwd: Path, env: dict | None = None) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"build_series: {' '.join(cmd)} failed in {cwd}:\n{res.stdout}\n{res.stderr}")
    return res.stdout


def _git_env() -> dict:
    env = dict(os.environ)
    name, email = AUTHOR.split(" <")
    env.update(
        GIT_AUTHOR_NAME=name,
        GIT_AUTHOR_EMAIL=email.rstrip(">"),
        GIT_COMMITTER_NAME=name,
        GIT_COMMITTER_EMAIL=email.rstrip(">"),
        GIT_AUTHOR_DATE=DATE,
        GIT_COMMITTER_DATE=DATE,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
    )
    return env


def regenerate_trainer_yamls(tree: Path) -> None:
    """Run verl's ``scripts/generate_trainer_config.sh`` in ``tree`` (the tree first on ``PYTHONPATH``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["VERL_USE_EXTERNAL_PLUGINS"] = "none"  # an installed plugin must not change the composed config
    res = subprocess.run(
        ["bash", "scripts/generate_trainer_config.sh"], cwd=tree, env=env, capture_output=True, text=True
    )
    # the script exits 1 when the regenerated files differ from git HEAD, which is expected while building
    if res.returncode not in (0, 1) or "Generated:" not in res.stdout + res.stderr:
        raise SystemExit(f"build_series: generate_trainer_config.sh failed:\n{res.stdout}\n{res.stderr}")


def build(out_dir: Path, sdist: Path) -> list[str]:
    """Write the series into ``out_dir`` (old ``*.patch`` removed); return the patch file names in order."""
    with tempfile.TemporaryDirectory(prefix="stapo_series_") as tmp:
        tree = Path(tmp) / "verl"
        make_base_tree(tree, sdist)
        env = _git_env()
        _run(["git", "init", "-q"], tree, env)
        _run(["git", "add", "-A"], tree, env)
        _run(["git", "commit", "-q", "-m", f"verl {VERL_VERSION} + overlay"], tree, env)
        for patch in PATCHES:
            patch.apply(tree)
            _run(["git", "add", "-A"], tree, env)
            _run(["git", "commit", "-q", "-m", patch.subject + "\n\n" + patch.body], tree, env)
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in out_dir.glob("*.patch"):
            old.unlink()
        cmd = ["git", "format-patch", "--zero-commit", "--no-signature", "--full-index", "--no-numbered"]
        names = _run([*cmd, "-o", str(out_dir), f"HEAD~{len(PATCHES)}"], tree, env).split()
    names = [Path(p).name for p in names]
    (out_dir / "series").write_text("".join(n + "\n" for n in names), encoding="utf-8")
    return names


def check_patches(sdist: Path) -> int:
    """0 if ``upstream/patches/`` equals a fresh build byte for byte, else 1 (with a diff)."""
    with tempfile.TemporaryDirectory() as d:
        fresh = Path(d)
        build(fresh, sdist)
        bad = []
        for f in sorted({p.name for p in fresh.iterdir()} | {p.name for p in PATCH_DIR.iterdir()}):
            a, b = PATCH_DIR / f, fresh / f
            ta = a.read_bytes() if a.exists() else b""
            tb = b.read_bytes() if b.exists() else b""
            if ta != tb:
                bad.append(f)
                sys.stdout.writelines(
                    difflib.unified_diff(
                        ta.decode().splitlines(keepends=True),
                        tb.decode().splitlines(keepends=True),
                        f"committed/{f}",
                        f"fresh/{f}",
                        n=1,
                    )
                )
    if bad:
        print(
            f"\nbuild_series --check: {bad} differ from a fresh build (the plugin or upstream/ changed?). "
            "Run: .venv/bin/python upstream/build_series.py"
        )
        return 1
    print(f"build_series --check: {len(list(PATCH_DIR.glob('*.patch')))} patches equal a fresh build")
    return 0


def check_tree(tree: Path, upto: str | None = None) -> int:
    """0 if a patched verl tree holds the plugin's definitions and config keys unchanged, else 1.

    Compares, for every :data:`SHARED` entry of the patches applied (all, or up to and including ``upto``), the
    AST of each definition (docstrings aside) in the tree with the plugin's; and the :data:`SHARED_CONFIG` fields
    of ``PolicyLossConfig`` (type and default) and their ``actor.yaml`` defaults with ``StapoPolicyLossConfig``.
    """
    import yaml

    keys = [p.key for p in PATCHES]
    applied = set(keys[: keys.index(upto) + 1] if upto else keys)
    problems = []
    n_defs = 0
    for shared in SHARED:
        if shared.patch.lower() not in applied:
            continue
        ours = code_ast((REPO / shared.plugin).read_text(encoding="utf-8"), shared.names)
        theirs = code_ast((tree / shared.target).read_text(encoding="utf-8"), shared.names)
        for name in shared.names:
            n_defs += 1
            if theirs.get(name) != ours[name]:
                problems.append(f"{shared.target}::{name} differs from {shared.plugin}::{name}")
    fields = [f for f, p in SHARED_CONFIG.items() if p.lower() in applied]
    plugin_src = (REPO / PLUGIN_CONFIG[0]).read_text(encoding="utf-8")
    ours_cfg = config_fields(plugin_src, PLUGIN_CONFIG[1], fields)
    theirs_cfg = config_fields((tree / "verl/workers/config/actor.py").read_text(), "PolicyLossConfig", fields)
    policy_loss = yaml.safe_load((tree / "verl/trainer/config/actor/actor.yaml").read_text())["policy_loss"]
    for f in fields:
        if f not in ours_cfg:
            problems.append(f"{PLUGIN_CONFIG[1]} has no field {f!r}")
        elif theirs_cfg.get(f) != ours_cfg[f]:
            problems.append(f"PolicyLossConfig.{f} is {theirs_cfg.get(f)}, {PLUGIN_CONFIG[1]}.{f} is {ours_cfg[f]}")
        elif f not in policy_loss or policy_loss[f] != ast.literal_eval(ours_cfg[f][1]):
            problems.append(
                f"actor.yaml policy_loss.{f} = {policy_loss.get(f, '<missing>')!r}, plugin default {ours_cfg[f][1]}"
            )
    if problems:
        print("build_series --check-tree: the patched tree drifted from the plugin:\n  " + "\n  ".join(problems))
        return 1
    print(
        f"build_series --check-tree: {n_defs} definitions identical to the plugin's (AST, docstrings aside); "
        f"config keys {fields} identical (PolicyLossConfig, actor.yaml, {PLUGIN_CONFIG[1]})"
    )
    return 0


def _kind(path: str) -> str:
    if path.startswith("verl/"):
        return "production"
    if path.startswith("tests/"):
        return "tests"
    return "docs"  # docs/, examples/


def sizes(patch_dir: Path = PATCH_DIR) -> str:
    """Markdown table: per patch, +added/−removed lines of production code (``verl/``; Python and YAML apart, the
    regenerated ``_generated_*.yaml`` separately), tests (``tests/``) and docs (``docs/``, ``examples/``)."""
    rows = [
        "| patch (PR) | production .py | production .yaml (+ generated) | tests | docs/examples |",
        "|---|---|---|---|---|",
    ]
    for patch, name in zip(PATCHES, (patch_dir / "series").read_text().split(), strict=True):
        count: dict[str, list[int]] = {k: [0, 0] for k in ("py", "yaml", "gen", "tests", "docs")}
        path, in_hunk = "", False
        for line in (patch_dir / name).read_text(encoding="utf-8").splitlines():
            m = re.match(r"^diff --git a/(\S+) b/", line)
            if m:
                path, in_hunk = m.group(1), False
                continue
            in_hunk = in_hunk or line.startswith("@@")
            if not in_hunk or line[:1] not in ("+", "-"):
                continue
            kind = _kind(path)
            if kind == "production":
                kind = "gen" if "/_generated_" in path else ("py" if path.endswith(".py") else "yaml")
            count[kind][line[0] == "-"] += 1

        def cell(*ks: str, count=count) -> str:
            return f"+{sum(count[k][0] for k in ks)} / −{sum(count[k][1] for k in ks)}"

        rows.append(
            f"| {name[:4]} {patch.pr} | {cell('py')} | {cell('yaml')} (+{count['gen'][0]} / −{count['gen'][1]}) "
            f"| {cell('tests')} | {cell('docs')} |"
        )
    return "\n".join(rows) + "\n"


#: references a committed text must not make (things a reader of this repository cannot open)
#: (spelt in pieces so that this line does not match itself)
FORBIDDEN_REFERENCES = re.compile(
    "|".join(("issue [0-9]", "spec" + " §", "verl" + "_notes", "shared" + "/docs", r"\.\./shared", "/wo" + "rk/"))
)
#: the texts checked for them (the generated patches' verl content is not ours and is left out)
OWN_TEXTS = ("upstream/README.md", "upstream/RFC.md", "upstream/PR.md", "upstream/verl_overlay/README.md")


def pr_sections(text: str) -> dict[str, str]:
    """``{title: body}`` of the pull requests in PR.md: a ``**Title:** `...` `` line, then the body up to the next
    level-2 heading (verl's PR template starts the body with ``### What does this PR do?``)."""
    out = {}
    for m in re.finditer(r"^\*\*Title:\*\* `([^`]+)`\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S):
        body = m.group(2)
        out[m.group(1)] = body[body.index("### What does this PR do?") :] if "### What" in body else ""
    return out


def check_docs() -> int:
    """1 unless PR.md has a section per patch (title = commit subject) and the current sizes table, and no committed
    text under ``upstream/`` (nor the check script) makes a :data:`FORBIDDEN_REFERENCES` reference."""
    problems = []
    pr_md = (HERE / "PR.md").read_text(encoding="utf-8")
    sections = pr_sections(pr_md)
    for patch in PATCHES:
        if not sections.get(patch.subject):
            problems.append(f"PR.md has no '**Title:** `{patch.subject}`' section with a PR body")
    for doc in ("PR.md", "RFC.md"):
        if sizes() not in (HERE / doc).read_text(encoding="utf-8"):
            problems.append(f"{doc} does not contain the current sizes table (python upstream/build_series.py --sizes)")
    own = [REPO / t for t in OWN_TEXTS] + [REPO / "scripts/check_upstream.sh", Path(__file__)]
    own += [f for f in SRC.rglob("*") if f.is_file()]
    for path in own:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if FORBIDDEN_REFERENCES.search(line):
                problems.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    if problems:
        print("build_series --check-docs:\n  " + "\n  ".join(problems))
        return 1
    print(
        f"build_series --check-docs: PR.md has the {len(PATCHES)} PR sections and the current sizes; "
        f"no outside references in {len(own)} files"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="fail if upstream/patches/ differs from a fresh build")
    group.add_argument("--check-tree", type=Path, metavar="TREE", help="fail if a patched tree drifted")
    group.add_argument("--sizes", action="store_true", help="print the +/- table of the committed patches")
    group.add_argument("--base-tree", type=Path, metavar="DIR", help="write verl 0.9.1 + overlay into DIR")
    group.add_argument("--check-overlay", action="store_true", help="vendored files match their sha256")
    group.add_argument("--check-docs", action="store_true", help="PR.md sections/sizes; no outside references")
    group.add_argument("--refresh-overlay", type=Path, metavar="VERL_MAIN", help="re-vendor from a verl main tree")
    ap.add_argument("--upto", choices=[p.key for p in PATCHES], help="with --check-tree: patches applied so far")
    args = ap.parse_args(argv)
    if args.check_tree:
        return check_tree(args.check_tree, args.upto)
    if args.sizes:
        sys.stdout.write(sizes())
        return 0
    if args.check_overlay:
        return check_overlay()
    if args.check_docs:
        return check_docs()
    if args.refresh_overlay:
        refresh_overlay(args.refresh_overlay)
        return check_overlay()
    with tempfile.TemporaryDirectory() as d:
        sdist = fetch_sdist(Path(d))
        if args.base_tree:
            make_base_tree(args.base_tree, sdist)
            return 0
        if args.check:
            return check_patches(sdist)
        print("\n".join(build(PATCH_DIR, sdist)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
