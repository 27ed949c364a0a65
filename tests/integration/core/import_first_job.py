"""Job for ``test_import_order.py``: for every stapo_verl module that loading the plugin imports, a fresh process
whose first import is that module, then ``import verl``. Prints one JSON object:
``{"modules": [...], "results": {module: {"plugin": bool, "validate_config": bool, "errors": [str]}}}``.

Each process is a ``fork`` of this one after it imported every third-party module ``import verl`` imports (so a
child only runs verl's and stapo_verl's own module bodies: about 1.5 s each instead of 10 s), with no verl or
stapo_verl module imported yet. Run with ``VERL_PLATFORM=cpu`` to include the CPU platform's modules.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys


def _after_plain_import_verl() -> dict[str, list[str]]:
    code = ("import json, sys, verl\n"
            "print(json.dumps(list(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names = json.loads(out.stdout.strip().splitlines()[-1])
    ours = ("verl", "stapo_verl")
    return {"stapo_verl": sorted(n for n in names if n == "stapo_verl" or n.startswith("stapo_verl.")),
            "third_party": [n for n in names
                            if n.split(".")[0] not in ours and n != "__main__" and not n.startswith("_")]}


def _child(module: str, write_fd: int) -> None:
    errors: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record):
            errors.append(record.getMessage())

    logging.getLogger("stapo_verl").addHandler(_Collect(level=logging.ERROR))
    result = {"plugin": False, "validate_config": False, "errors": errors}
    try:
        importlib.import_module(module)
        import verl.utils.config as verl_config

        result["plugin"] = "stapo_verl.plugin" in sys.modules  # the plugin module ran to its end
        result["validate_config"] = bool(getattr(verl_config.validate_config, "__stapo_integration__", False))
    except BaseException as e:  # noqa: BLE001 (reported, the test fails on it)
        errors.append(f"{type(e).__name__}: {e}")
    os.write(write_fd, json.dumps(result).encode())
    os._exit(0)


def main() -> None:
    found = _after_plain_import_verl()
    for name in found["third_party"]:
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 (a module that only imports inside its package's own import)
            pass
    leaked = [n for n in sys.modules if n.split(".")[0] in ("verl", "stapo_verl")]
    if leaked:
        raise SystemExit(f"a third-party module imported {leaked[:5]}: the children would not start clean")
    results = {}
    for module in found["stapo_verl"]:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _child(module, write_fd)
        os.close(write_fd)
        chunks = []
        while chunk := os.read(read_fd, 1 << 16):
            chunks.append(chunk)
        os.close(read_fd)
        os.waitpid(pid, 0)
        results[module] = json.loads(b"".join(chunks) or b'{"plugin": false, "validate_config": false, '
                                                         b'"errors": ["the child died"]}')
    print(json.dumps({"modules": found["stapo_verl"], "results": results}))


if __name__ == "__main__":
    main()
