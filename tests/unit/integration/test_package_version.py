"""One version: ``setup.cfg`` holds it, the installed metadata carries it, ``stapo_verl.__version__`` reads it."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys

from support.procs import REPO

import stapo_verl


def test_pip_show_setup_cfg_and_the_package_agree():
    out = subprocess.run([sys.executable, "-m", "pip", "show", "--disable-pip-version-check", "stapo-verl"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    (shown,) = re.findall(r"^Version: (\S+)$", out, flags=re.M)
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg", encoding="utf-8")
    assert shown == stapo_verl.__version__ == cfg["metadata"]["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", shown)


def test_no_other_file_of_the_package_states_a_version():
    # the version lives in setup.cfg only; the package reads it from the installed metadata
    pkg = REPO / "stapo_verl"
    hits = [str(p.relative_to(REPO)) for p in pkg.rglob("*.py")
            if re.search(r"^\s*__version__\s*=\s*['\"]\d+\.\d+", p.read_text(encoding="utf-8"), flags=re.M)]
    assert hits == []
