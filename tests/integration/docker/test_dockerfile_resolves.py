"""Every package docker/Dockerfile installs exists on PyPI for the image's Python and platform.

The image is verl's stable vLLM image (Python 3.12, x86_64, glibc 2.39: manylinux_2_28 wheels install). A pin that
PyPI lacks stops ``docker build`` at its ``pip install``; this test finds it without Docker: it reads every
``pip install`` of the Dockerfile's RUN instructions (ARGs substituted) and asks uv to resolve each requirement
alone (``uv pip compile --no-deps --only-binary :all:``) for that interpreter and platform. That reads the
package index's metadata only: no wheel is downloaded. It needs the network (CI reaches PyPI).
"""

from __future__ import annotations

import io
import re
import shlex
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

from support.procs import REPO

DOCKERFILE = REPO / "docker" / "Dockerfile"
#: the base image's interpreter and platform (docker/Dockerfile's header)
PYTHON_VERSION = "3.12"
PLATFORM = "x86_64-manylinux_2_28"


def dockerfile_requirements(text: str) -> list[str]:
    """The requirement strings of every ``pip install`` in ``text``'s RUN instructions, ARG defaults substituted.

    Options (``--no-deps``, ``--no-cache-dir``) and local paths (this package's ``/opt/stapo-verl``) are left out.
    Raises ValueError for a ``${NAME}`` without an ARG default (the build would install an empty name).
    """
    import dockerfile_parse  # test extra (setup.cfg)

    parser = dockerfile_parse.DockerfileParser(fileobj=io.BytesIO(text.encode()))  # in memory: writes no file
    args = {}
    for ins in parser.structure:
        if ins["instruction"] == "ARG" and "=" in ins["value"]:
            k, v = ins["value"].split("=", 1)
            args[k.strip()] = v.strip().strip('"')
    out = []
    for ins in parser.structure:
        if ins["instruction"] != "RUN":
            continue
        commands = [[]]
        for word in shlex.split(ins["value"]):
            commands.append([]) if word in ("&&", "||", ";") else commands[-1].append(word)
        for words in commands:
            if "install" not in words or not any(w == "pip" or w.endswith("/pip") for w in words):
                continue
            for word in words[words.index("install") + 1:]:
                if word.startswith("-") or word.startswith("/") or word.startswith("."):
                    continue

                def sub(m):
                    if m.group(1) not in args:
                        raise ValueError(f"docker/Dockerfile: ${{{m.group(1)}}} in `{word}` has no ARG default")
                    return args[m.group(1)]

                out.append(re.sub(r"\$\{(\w+)\}", sub, word))
    return out


def resolve(requirements: list[str]) -> subprocess.CompletedProcess:
    """``uv pip compile`` of ``requirements``, each without its dependencies, for the image's Python and platform."""
    return subprocess.run(
        [sys.executable, "-m", "uv", "pip", "compile", "-", "--no-deps", "--only-binary", ":all:", "--no-header",
         "--no-annotate", "--python-version", PYTHON_VERSION, "--python-platform", PLATFORM,
         "--index-url", "https://pypi.org/simple"],
        input="\n".join(requirements) + "\n", capture_output=True, text=True, timeout=300)


PINS = dockerfile_requirements(DOCKERFILE.read_text())


def test_the_dockerfile_installs_exact_pins():
    names = [Requirement(r).name.lower() for r in PINS]
    assert {"verl", "torch", "transformers", "nvidia-modelopt", "megatron-bridge", "transferqueue",
            "tensordict"} <= set(names), names
    for r in PINS:
        spec = str(Requirement(r).specifier)
        assert spec.startswith("==") and "," not in spec and "*" not in spec, f"{r}: pin an exact version"


def test_every_pin_resolves_for_python_312_manylinux():
    """One resolution of all pins (uv names the first that PyPI lacks), each resolved to itself."""
    r = resolve(PINS)
    assert r.returncode == 0, f"a pin of docker/Dockerfile does not resolve from PyPI for Python {PYTHON_VERSION} / " \
                              f"{PLATFORM}:\n{r.stderr[-2000:]}"
    resolved = {Requirement(li).name.lower(): Requirement(li).specifier for li in r.stdout.splitlines() if li.strip()}
    assert resolved == {Requirement(p).name.lower(): Requirement(p).specifier for p in PINS}, r.stdout


def test_a_pin_pypi_lacks_fails_naming_it():
    """The pin this image once had: verl's [megatron] extra names megatron-bridge 0.5.2, which only verl's own wheel
    index serves. The check must refuse it and name it."""
    text = DOCKERFILE.read_text()
    bad = dockerfile_requirements(re.sub(r"ARG MEGATRON_BRIDGE_VERSION=\S+", "ARG MEGATRON_BRIDGE_VERSION=0.5.2", text))
    assert "megatron-bridge==0.5.2" in bad
    r = resolve(bad)
    assert r.returncode != 0 and "megatron-bridge==0.5.2" in r.stderr, r.stderr


def test_an_arg_without_default_is_refused():
    with pytest.raises(ValueError, match="NOPE"):
        dockerfile_requirements('FROM x\nRUN pip install "a==${NOPE}"\n')
