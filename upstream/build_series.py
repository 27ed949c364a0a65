"""Build (or check) the upstream patch series ``upstream/patches/`` that adds policy token masks and STAPO to verl.

A pull request is ``upstream/src/<key>.diff`` (line 1 its name, line 2 the commit subject, a blank line, the body,
then a diff that ``git apply --recount`` applies to verl 0.9.1's sdist + ``upstream/verl_overlay/tree/``) plus the new
files in ``upstream/src/<key>/``. A diff line ``#@shared <plugin module> [<name> ...]`` becomes those top-level
definitions of the plugin (without names: the whole module), copied through :mod:`ast` source segments, replacing
the target's definitions of the same names. A line ``#@methods <plugin module> <Class> <name> ...`` is removed, and
the named methods of the target's class ``<Class>`` are replaced by those of the plugin module's class of the same
name (verl's decorators stay): the worker wiring has one source too. The generated trainer YAMLs come from verl's own generator script.

Usage::

    python upstream/build_series.py                     # rewrite upstream/patches/ from the sources
    python upstream/build_series.py --check             # exit 1 if upstream/patches/ differs from a fresh build
    python upstream/build_series.py --check-tree TREE   # exit 1 if a patched verl tree drifted from the plugin
    python upstream/build_series.py --sizes             # +/- per patch: production / tests / docs
    python upstream/build_series.py --base-tree DIR     # write verl 0.9.1 + overlay (unpatched) into DIR
    python upstream/build_series.py --check-overlay     # the vendored files match the sha256 in their README
    python upstream/build_series.py --check-docs        # PR.md: a section per patch, current sizes; no outside refs

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
AUTHOR = {"NAME": "stapo-verl contributors", "EMAIL": "stapo-verl@users.noreply.github.com",
          "DATE": "2026-12-01T00:00:00+00:00"}

#: the pull requests in order: ``upstream/src/<key>.diff`` and ``upstream/src/<key>/``
SERIES = ("license", "a", "b", "example")
#: ``PolicyLossConfig`` fields the series adds -> the patch; the plugin's config class declares them identically
SHARED_CONFIG = {"token_mask": "a", "s2t_tau_p": "b", "s2t_entropy_quantile": "b"}
PLUGIN_CONFIG = ("stapo_verl/integration/verl_0_9_1/policy_loss/config.py", "StapoPolicyLossConfig")
#: words a copy must not contain (it would point at the plugin): shared code is written in verl's terms
FORBIDDEN_IN_COPIES = ("stapo_verl", "plugin")
SHARED_MARKER = re.compile(r"^#@shared (\S+)((?: \w+)*)$", flags=re.M)
METHODS_MARKER = re.compile(r"^#@methods (\S+) (\w+)((?: \w+)+)\n", flags=re.M)


@dataclass(frozen=True)
class Patch:
    """One pull request: ``pr`` (its name in the sizes table), commit ``subject`` and ``body``, the ``diff``."""

    key: str
    pr: str
    subject: str
    body: str
    diff: str


def load_patch(key: str) -> Patch:
    """Parse ``upstream/src/<key>.diff``: the header, then the diff from its first ``diff --git`` line."""
    head, diff = (SRC / f"{key}.diff").read_text(encoding="utf-8").split("\ndiff --git ", 1)
    pr, subject, _, body = head.split("\n", 3)
    return Patch(key, pr, subject, body.strip("\n") + "\n", "diff --git " + diff)


PATCHES = tuple(load_patch(key) for key in SERIES)


def _name(node: ast.stmt) -> str | None:
    if isinstance(node, ast.FunctionDef | ast.ClassDef):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def _span(lines: list[str], node: ast.stmt) -> tuple[int, int]:
    """0-based ``[start, end)`` lines of a top-level statement with its decorators and ``#:`` comments above."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    while start > 0 and lines[start - 1].startswith("#") and not SHARED_MARKER.match(lines[start - 1].rstrip("\n")):
        start -= 1
    return start, node.end_lineno


def shared_text(plugin: str, names: tuple[str, ...]) -> str:
    """The named top-level definitions of a plugin module, in module order (consecutive ones verbatim, with what
    lies between them), or the whole module without names. Exits if one is missing or the copy names the plugin."""
    text = (REPO / plugin).read_text(encoding="utf-8")
    if names:
        lines, body = text.splitlines(keepends=True), ast.parse(text).body
        index = {_name(node): i for i, node in enumerate(body)}
        if any(n not in index for n in names) or [index[n] for n in names] != sorted(index[n] for n in names):
            raise SystemExit(f"build_series: {plugin} must define {names} at top level, in this order")
        stretches: list[list[int]] = []
        for n in names:
            start, end = _span(lines, body[index[n]])
            if stretches and index[n] - 1 == stretches[-1][2]:
                stretches[-1][1:] = [end, index[n]]
            else:
                stretches.append([start, end, index[n]])
        text = "\n\n\n".join("".join(lines[a:b]).strip("\n") for a, b, _ in stretches) + "\n"
    for word in FORBIDDEN_IN_COPIES:
        if word in text:
            raise SystemExit(f"build_series: the copy of {plugin} {names} mentions {word!r}; reword it there")
    return text


def expand_shared(path: Path) -> None:
    """Replace each ``#@shared`` line of ``path`` with the plugin's definitions, dropping its own of the same names."""
    text = path.read_text(encoding="utf-8")
    for m in reversed(list(SHARED_MARKER.finditer(text))):
        names = tuple(m.group(2).split())
        lines = text.splitlines(keepends=True)
        marker_line = text[: m.start()].count("\n")
        drop = [_span(lines, n) for n in ast.parse(text).body if names and _name(n) in names]
        block = shared_text(m.group(1), names).splitlines(keepends=True)
        for start, end in sorted(drop + [(marker_line, marker_line + 1)], reverse=True):
            lines[start:end] = block if start == marker_line else []
            if start != marker_line:  # the blank lines that separated the dropped definition
                while start < len(lines) and not lines[start].strip():
                    del lines[start]
        text = "".join(lines)
    path.write_text(text, encoding="utf-8")


def _methods(source: str, cls: str) -> dict[str, ast.FunctionDef]:
    """The methods of top-level class ``cls`` of ``source``, by name (empty when there is no such class)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
    return {}


def expand_methods(path: Path) -> None:
    """Replace the methods each ``#@methods`` line of ``path`` names with the plugin's (from their ``def`` line to
    their end, so the target's decorators stay), then drop the marker lines. Exits when a method is missing on either
    side or the copy names the plugin."""
    text = path.read_text(encoding="utf-8")
    markers = list(METHODS_MARKER.finditer(text))
    text = METHODS_MARKER.sub("", text)
    lines, spans = text.splitlines(keepends=True), []
    for m in markers:
        plugin, cls, names = m.group(1), m.group(2), m.group(3).split()
        ours_text = (REPO / plugin).read_text(encoding="utf-8")
        ours, ours_lines, theirs = _methods(ours_text, cls), ours_text.splitlines(keepends=True), _methods(text, cls)
        for name in names:
            if name not in ours or name not in theirs:
                raise SystemExit(f"build_series: {cls}.{name} must be a method in {plugin} and in {path.name}")
            block = "".join(ours_lines[ours[name].lineno - 1 : ours[name].end_lineno])
            if any(word in block for word in FORBIDDEN_IN_COPIES):
                raise SystemExit(f"build_series: the copy of {plugin} {cls}.{name} names the plugin; reword it there")
            spans.append((theirs[name].lineno - 1, theirs[name].end_lineno, block))
    for start, end, block in sorted(spans, reverse=True):
        lines[start:end] = block.splitlines(keepends=True)
    path.write_text("".join(lines), encoding="utf-8")


def method_entries(upto: str | None = None) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """``(plugin module, target file, class, names)`` of every ``#@methods`` line in the patches up to ``upto``."""
    out = []
    for patch in PATCHES[: SERIES.index(upto) + 1 if upto else None]:
        for part in patch.diff.split("diff --git a/")[1:]:
            target = part.split(" ", 1)[0]
            for m in re.finditer(r"^\+#@methods (\S+) (\w+)((?: \w+)+)$", part, flags=re.M):
                out.append((m.group(1), target, m.group(2), tuple(m.group(3).split())))
    return out


def method_ast(source: str, cls: str, names: tuple[str, ...]) -> dict[str, str]:
    """``ast.dump`` of the named methods of class ``cls``, without their docstrings and decorators."""
    out = {}
    for name, node in _methods(source, cls).items():
        if name in names:
            body = node.body[1:] if isinstance(node.body[0], ast.Expr) and isinstance(
                getattr(node.body[0], "value", None), ast.Constant) else node.body
            node.body, node.decorator_list = body or [ast.Pass()], []
            out[name] = ast.dump(node)
    return out


def shared_entries(upto: str | None = None) -> list[tuple[str, str, tuple[str, ...]]]:
    """``(plugin module, target file, names)`` of every placeholder in the patches up to ``upto`` (default all)."""
    out = []
    for patch in PATCHES[: SERIES.index(upto) + 1 if upto else None]:
        for part in patch.diff.split("diff --git a/")[1:]:
            target = part.split(" ", 1)[0]
            for m in re.finditer(r"^\+#@shared (\S+)((?: \w+)*)$", part, flags=re.M):
                out.append((m.group(1), target, tuple(m.group(2).split())))
    return out


def code_ast(source: str, names: tuple[str, ...]) -> dict[str, str]:
    """``ast.dump`` of the named top-level statements (without names: all of them), docstrings removed."""
    out = {}
    for node in ast.parse(source).body:
        name = _name(node)
        if name is None or (names and name not in names):
            continue
        for sub in ast.walk(node):
            body = getattr(sub, "body", None)
            if isinstance(sub, ast.FunctionDef | ast.ClassDef) and body and isinstance(body[0], ast.Expr):
                if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                    sub.body = body[1:] or [ast.Pass()]
        out[name] = ast.dump(node)
    return out


def config_fields(source: str, cls: str) -> dict[str, tuple[str, str]]:
    """``{field: (annotation, default)}`` (``ast.unparse``) of the :data:`SHARED_CONFIG` fields of class ``cls``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {
                s.target.id: (ast.unparse(s.annotation), ast.unparse(s.value) if s.value else "")
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id in SHARED_CONFIG
            }
    return {}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run(cmd: list[str], cwd: Path, env: dict | None = None) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"build_series: {' '.join(cmd)} failed in {cwd}:\n{res.stdout}\n{res.stderr}")
    return res.stdout


def fetch_sdist(dest: Path) -> Path:
    """``$VERL_SDIST`` or a fresh ``pip download`` of verl's sdist into ``dest``; exits unless its sha256 matches."""
    if "VERL_SDIST" not in os.environ:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps"]
        _run([*cmd, "--no-binary", ":all:", f"verl=={VERL_VERSION}", "-d", str(dest)], REPO)
    path = Path(os.environ.get("VERL_SDIST", dest / f"verl-{VERL_VERSION}.tar.gz"))
    if not path.is_file() or _sha256(path) != VERL_SDIST_SHA256:
        raise SystemExit(f"build_series: {path} is not verl {VERL_VERSION}'s sdist (sha256 {VERL_SDIST_SHA256})")
    return path


def make_base_tree(dst: Path, sdist: Path) -> None:
    """Write verl 0.9.1 + overlay into ``dst`` (created; must not exist)."""
    dst.mkdir(parents=True)
    prefix = f"verl-{VERL_VERSION}/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
        for m in members:
            m.name = m.name[len(prefix) :]
        members = [m for m in members if m.name.split("/")[0] in SDIST_KEEP]
        tar.extractall(dst, members=members, filter="data")
    shutil.copytree(OVERLAY / "tree", dst, dirs_exist_ok=True)


def check_overlay() -> int:
    """1 unless every file of ``verl_overlay/`` (but its README) is listed in the README with its sha256."""
    row = re.compile(r"^\| `([^`]+)`( \(beside `tree/`\))? \| `([0-9a-f]{64})` \|", flags=re.M)
    rows = row.findall((OVERLAY / "README.md").read_text(encoding="utf-8"))
    listed = {(OVERLAY / rel if beside else OVERLAY / "tree" / rel): sha for rel, beside, sha in rows}
    files = {p for p in OVERLAY.rglob("*") if p.is_file() and p != OVERLAY / "README.md"}
    bad = [f"{p.relative_to(OVERLAY)}: {_sha256(p) if p.exists() else 'missing'}, listed {listed.get(p)}"
           for p in sorted(files | set(listed)) if not p.exists() or listed.get(p) != _sha256(p)]
    if bad:
        print("build_series --check-overlay: verl_overlay/README.md differs from the files:\n  " + "\n  ".join(bad))
        return 1
    print(f"build_series --check-overlay: {len(files)} vendored files match their sha256")
    return 0


def apply_patch(tree: Path, patch: Patch) -> None:
    """Apply one patch to a verl tree: its diff, the shared definitions, its new files, the generated YAMLs."""
    (tree / ".series.diff").write_text(patch.diff, encoding="utf-8")
    _run(["git", "apply", "--recount", ".series.diff"], tree)
    (tree / ".series.diff").unlink()
    for target in re.findall(r"^\+\+\+ b/(\S+)", patch.diff, flags=re.M):
        expand_shared(tree / target)
        expand_methods(tree / target)
    if (SRC / patch.key).is_dir():
        shutil.copytree(SRC / patch.key, tree, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    if "verl/trainer/config/" in patch.diff:  # verl's autogen-trainer-cfg hook; exits 1 when files changed
        env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}", VERL_USE_EXTERNAL_PLUGINS="none")
        cmd = ["bash", "scripts/generate_trainer_config.sh"]
        res = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        if res.returncode not in (0, 1) or "Generated:" not in res.stdout + res.stderr:
            raise SystemExit(f"build_series: generate_trainer_config.sh failed:\n{res.stdout}\n{res.stderr}")


def build(out_dir: Path, sdist: Path) -> list[str]:
    """Write the series into ``out_dir`` (old ``*.patch`` removed); return the patch file names in order."""
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    env.update({f"GIT_{who}_{key}": value for who in ("AUTHOR", "COMMITTER") for key, value in AUTHOR.items()})
    with tempfile.TemporaryDirectory(prefix="stapo_series_") as tmp:
        tree = Path(tmp) / "verl"
        make_base_tree(tree, sdist)
        for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", f"verl {VERL_VERSION} + overlay"]):
            _run(["git", *cmd], tree, env)
        for patch in PATCHES:
            apply_patch(tree, patch)
            _run(["git", "add", "-A"], tree, env)
            _run(["git", "commit", "-q", "-m", f"{patch.subject}\n\n{patch.body}"], tree, env)
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in out_dir.glob("*.patch"):
            old.unlink()
        cmd = ["git", "format-patch", "--zero-commit", "--no-signature", "--full-index", "--no-numbered"]
        names = [Path(p).name for p in _run([*cmd, "-o", str(out_dir), f"HEAD~{len(PATCHES)}"], tree, env).split()]
    (out_dir / "series").write_text("".join(n + "\n" for n in names), encoding="utf-8")
    return names


def check_patches(sdist: Path) -> int:
    """0 if ``upstream/patches/`` equals a fresh build byte for byte, else 1 (with a diff)."""
    with tempfile.TemporaryDirectory() as d:
        build(Path(d), sdist)
        names = sorted({p.name for p in Path(d).iterdir()} | {p.name for p in PATCH_DIR.iterdir()})
        texts = {f: [(p / f).read_text() if (p / f).exists() else "" for p in (PATCH_DIR, Path(d))] for f in names}
    bad = [f for f, (ours, fresh) in texts.items() if ours != fresh]
    for f in bad:
        sys.stdout.writelines(difflib.unified_diff(*(t.splitlines(True) for t in texts[f]), f, "fresh"))
    if bad:
        print(f"\nbuild_series --check: {bad} differ from a fresh build; run .venv/bin/python upstream/build_series.py")
        return 1
    print(f"build_series --check: {len(list(PATCH_DIR.glob('*.patch')))} patches equal a fresh build")
    return 0


def check_tree(tree: Path, upto: str | None = None) -> int:
    """0 if a patched verl tree (all patches, or up to ``upto``) holds the plugin's definitions (AST, docstrings
    aside) and declares the :data:`SHARED_CONFIG` keys as the plugin does (``PolicyLossConfig``, ``actor.yaml``)."""
    import yaml

    problems, n_defs = [], 0
    for plugin, target, names in shared_entries(upto):
        ours = code_ast((REPO / plugin).read_text(encoding="utf-8"), names)
        theirs, n_defs = code_ast((tree / target).read_text(encoding="utf-8"), tuple(ours)), n_defs + len(ours)
        problems += [f"{target}::{n} differs from {plugin}::{n}" for n in ours if theirs.get(n) != ours[n]]
    for plugin, target, cls, names in method_entries(upto):
        ours = method_ast((REPO / plugin).read_text(encoding="utf-8"), cls, names)
        theirs, n_defs = method_ast((tree / target).read_text(encoding="utf-8"), cls, names), n_defs + len(ours)
        problems += [f"{target}::{cls}.{n} differs from {plugin}::{cls}.{n}" for n in names
                     if n not in ours or theirs.get(n) != ours[n]]
    applied = SERIES[: SERIES.index(upto) + 1 if upto else None]
    fields = [f for f, key in SHARED_CONFIG.items() if key in applied]
    ours_cfg = config_fields((REPO / PLUGIN_CONFIG[0]).read_text(encoding="utf-8"), PLUGIN_CONFIG[1])
    theirs_cfg = config_fields((tree / "verl/workers/config/actor.py").read_text(), "PolicyLossConfig")
    policy_loss = yaml.safe_load((tree / "verl/trainer/config/actor/actor.yaml").read_text())["policy_loss"]
    for f in fields:
        if f not in ours_cfg or theirs_cfg.get(f) != ours_cfg[f]:
            problems.append(f"PolicyLossConfig.{f} is {theirs_cfg.get(f)}, {PLUGIN_CONFIG[1]}.{f} {ours_cfg.get(f)}")
        elif policy_loss.get(f, "<missing>") != ast.literal_eval(ours_cfg[f][1]):
            problems.append(f"actor.yaml policy_loss.{f} = {policy_loss.get(f, '<missing>')!r}, not {ours_cfg[f][1]}")
    print("build_series --check-tree: " + ("the patched tree drifted from the plugin:\n  " + "\n  ".join(problems)
          if problems else f"{n_defs} definitions and the config keys {fields} identical to the plugin's"))
    return int(bool(problems))


def sizes(patch_dir: Path = PATCH_DIR) -> str:
    """Markdown table: per patch, +added/−removed lines of production code (``verl/``; Python and YAML apart, the
    regenerated ``_generated_*.yaml`` separately), tests (``tests/``) and docs (``docs/``, ``examples/``)."""
    rows = ["| patch (PR) | production .py | production .yaml (+ generated) | tests | docs/examples |",
            "|---|---|---|---|---|"]
    for patch, name in zip(PATCHES, (patch_dir / "series").read_text().split(), strict=True):
        count = {k: [0, 0] for k in ("py", "yaml", "gen", "tests", "docs")}
        kind = ""
        for line in (patch_dir / name).read_text(encoding="utf-8").splitlines():
            if m := re.match(r"^diff --git a/(([^/\s]*)\S*) b/", line):
                kind = {"verl": "py" if m[1].endswith(".py") else "yaml", "tests": "tests"}.get(m[2], "docs")
                kind = "gen" if "/_generated_" in m[1] else kind
            elif kind and line[:1] in ("+", "-") and not line.startswith(("+++ ", "--- ")):
                count[kind][line[0] == "-"] += 1
        cell = {k: f"+{added} / −{removed}" for k, (added, removed) in count.items()}
        rows.append(f"| {name[:4]} {patch.pr} | {cell['py']} | {cell['yaml']} ({cell['gen']}) | {cell['tests']} "
                    f"| {cell['docs']} |")
    return "\n".join(rows) + "\n"


def file_sizes(patch_dir: Path = PATCH_DIR) -> str:
    """Markdown table: per patch with production code, +added/−removed lines of each production file (``verl/``,
    the regenerated ``_generated_*.yaml`` left out), so that a text describing where the lines go quotes numbers
    that a build regenerates."""
    rows = ["| patch (PR) | production file | lines |", "|---|---|---|"]
    for patch, name in zip(PATCHES, (patch_dir / "series").read_text().split(), strict=True):
        count: dict[str, list[int]] = {}
        path = None
        for line in (patch_dir / name).read_text(encoding="utf-8").splitlines():
            if m := re.match(r"^diff --git a/(\S+) b/", line):
                path = m[1] if m[1].startswith("verl/") and "/_generated_" not in m[1] else None
            elif path and line[:1] in ("+", "-") and not line.startswith(("+++ ", "--- ")):
                count.setdefault(path, [0, 0])[line[0] == "-"] += 1
        rows += [f"| {name[:4]} {patch.pr} | `{f}` | +{a} / −{r} |" for f, (a, r) in sorted(count.items())]
    return "\n".join(rows) + "\n"


#: references a committed text must not make (a reader of this repository cannot open them); spelt in pieces
FORBIDDEN_REFERENCES = re.compile("issue [0-9]|spec" + " §|verl" + "_notes|shared" + "/docs|\\.\\./shared|/wo" + "rk/")
OWN_TEXTS = ("upstream/README.md", "upstream/RFC.md", "upstream/PR.md", "upstream/verl_overlay/README.md")


def pr_sections(text: str) -> dict[str, str]:
    """``{title: body}`` of the pull requests in PR.md: a ``**Title:** `...` `` line, then the body (from ``###
    What does this PR do?``, as verl's PR template) up to the next level-2 heading."""
    out = {}
    for m in re.finditer(r"^\*\*Title:\*\* `([^`]+)`\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S):
        body = m.group(2)
        out[m.group(1)] = body[body.index("### What does this PR do?") :] if "### What" in body else ""
    return out


def check_docs() -> int:
    """1 unless PR.md has a section per patch (title = commit subject), PR.md and RFC.md the current sizes table,
    and no committed text here (nor the check script) makes a :data:`FORBIDDEN_REFERENCES` reference."""
    sections = pr_sections((HERE / "PR.md").read_text(encoding="utf-8"))
    problems = [f"PR.md has no '**Title:** `{p.subject}`' section with a PR body" for p in PATCHES
                if not sections.get(p.subject)]
    problems += [f"{doc} lacks the current sizes table (build_series.py --sizes)" for doc in ("PR.md", "RFC.md")
                 if sizes() not in (HERE / doc).read_text(encoding="utf-8")]
    if file_sizes() not in (HERE / "RFC.md").read_text(encoding="utf-8"):
        problems.append("RFC.md lacks the current per-file sizes table (build_series.py --sizes)")
    own = [REPO / t for t in OWN_TEXTS] + [REPO / "scripts/check_upstream.sh", Path(__file__)]
    own += [f for f in SRC.rglob("*") if f.is_file() and "__pycache__" not in f.parts]
    for path in own:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if FORBIDDEN_REFERENCES.search(line):
                problems.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    if problems:
        print("build_series --check-docs:\n  " + "\n  ".join(problems))
        return 1
    print(f"build_series --check-docs: PR.md has the {len(PATCHES)} PR sections and the current sizes; "
          f"no outside references in {len(own)} files")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = ap.add_mutually_exclusive_group()
    for flag in ("--check", "--sizes", "--check-overlay", "--check-docs"):
        group.add_argument(flag, action="store_true")
    group.add_argument("--check-tree", type=Path, metavar="TREE")
    group.add_argument("--base-tree", type=Path, metavar="DIR")
    ap.add_argument("--upto", choices=SERIES, help="with --check-tree: the patches applied so far")
    args = ap.parse_args(argv)
    if args.check_tree:
        return check_tree(args.check_tree, args.upto)
    if args.sizes:
        print(sizes() + "\n" + file_sizes(), end="")
        return 0
    if args.check_overlay or args.check_docs:
        return check_overlay() if args.check_overlay else check_docs()
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
