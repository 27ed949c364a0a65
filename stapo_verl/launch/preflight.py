"""The preflight: what would otherwise fail minutes into a GPU run, checked in seconds before Ray starts.

Usage (what ``recipes/run.sh`` runs before ``main_ppo`` for the GPU sizes)::

    python -m stapo_verl.launch.preflight <hydra overrides...>

verl meets each of these only after Ray, the models and vLLM are up (wandb's ``init`` runs when ``fit()`` starts;
CUDA initialises in the workers). Every check takes its facts as arguments (:class:`GpuFacts`, :class:`RouteFacts`,
the environment), so it is tested with the facts stubbed, and raises :class:`PreflightError` naming the value found,
the value needed and the fix:

* :func:`check_driver`: the NVIDIA driver against the CUDA the image's torch is built for (CUDA 13.x needs a driver
  ≥ 580, 12.x ≥ 525: NVIDIA's CUDA compatibility guide, https://docs.nvidia.com/deploy/cuda-compatibility/);
* :func:`check_gpu_count`: GPUs visible on this node against ``trainer.n_gpus_per_node`` (and the world size);
* :func:`check_route`: the production route imports (vLLM, Megatron-Core, Transformer Engine, Megatron-Bridge and the
  modelopt it imports) at the versions verl 0.9.1's own ``[vllm]`` / ``[megatron]`` extras pin;
* :func:`check_trackers`: every tracker in ``trainer.logger`` can start without a prompt (wandb: ``WANDB_API_KEY``,
  a ``wandb login`` netrc entry, or ``WANDB_MODE=offline|disabled``);
* :func:`check_paths`: ``model.path`` and the data files readable, the checkpoint directory writable;
* :func:`check_generation_config`: the stop-token ``generation_config`` folder readable (or writable, where the
  recipe writes it at launch), on storage every node sees;
* :func:`check_memory`: the memory plan (:mod:`stapo_verl.launch.memory_plan`) under the GPU's memory.

:func:`gpu_free_checks` are the ones a laptop can run (``--dry-run`` prints them as warnings: they would stop the
launch on the cluster); :func:`run` runs all and returns :data:`~stapo_verl.launch.errors.EXIT_CONFIG` on a failure.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import netrc
import os
import shutil
import subprocess
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlparse

from stapo_verl.launch.compose import data_files
from stapo_verl.launch.errors import EXIT_CONFIG
from stapo_verl.launch.recipe_rules import STOP_KEY, Check

PREFIX = "[stapo preflight]"
#: the lowest driver branch each CUDA major version runs on (minor-version compatibility; NVIDIA CUDA compatibility
#: guide, Table "CUDA Toolkit and Minimum Required Driver Version")
MIN_DRIVER = types.MappingProxyType({13: 580, 12: 525, 11: 450})
#: modules the production route imports, by distribution (import name, when the config needs it)
ROUTE_MODULES = types.MappingProxyType({
    "vllm": "vllm", "megatron-core": "megatron.core", "transformer-engine": "transformer_engine",
    "megatron-bridge": "megatron.bridge", "nvidia-modelopt": "modelopt"})
#: wandb modes that need no credentials
WANDB_OFFLINE = ("offline", "disabled", "dryrun")


class PreflightError(RuntimeError):
    """A check failed; the message names the value found, the value needed and the fix."""


@dataclass(frozen=True)
class GpuFacts:
    """What the GPUs of this node are (gathered by :func:`gather_gpu_facts`, stubbed in tests).

    Attributes:
        driver: the NVIDIA driver version (``"570.124.06"``), None when no driver answers.
        cuda: the CUDA version this torch is built for (``torch.version.cuda``, ``"13.0"``), None for a CPU build.
        count: GPUs visible to this process (``CUDA_VISIBLE_DEVICES`` applied).
        memory_gb: total memory of the smallest visible GPU, 10⁹ bytes (None when none is visible).
        capability: the CUDA compute capability of the first visible GPU (``(9, 0)`` Hopper, ``(10, 0)`` Blackwell;
            None when none is visible).
    """

    driver: str | None
    cuda: str | None
    count: int
    memory_gb: float | None
    capability: tuple[int, int] | None = None


@dataclass(frozen=True)
class RouteFacts:
    """The installed route (gathered by :func:`gather_route_facts`, stubbed in tests).

    Attributes:
        versions: distribution name → installed version (None: not installed).
        import_errors: module → the error its import raised (None: it imports).
        verl_requires: verl's ``Requires-Dist`` lines (``importlib.metadata.requires("verl")``).
    """

    versions: Mapping[str, str | None]
    import_errors: Mapping[str, str | None]
    verl_requires: tuple[str, ...] = field(default=())


def _major(version: str) -> int:
    return int(str(version).split(".")[0])


def check_driver(gpu: GpuFacts) -> str:
    """The driver runs this torch's CUDA.

    Raises:
        PreflightError: no driver answers, or its branch is below :data:`MIN_DRIVER` of torch's CUDA major version.
    """
    if gpu.cuda is None:
        raise PreflightError("torch here is a CPU build (torch.version.cuda is None); needed: the image's CUDA torch. "
                             "Fix: run in the recipe's image (docker/) or install verl's [vllm,megatron] extras")
    need = MIN_DRIVER.get(_major(gpu.cuda))
    if gpu.driver is None:
        raise PreflightError(f"no NVIDIA driver answers (nvidia-smi); needed: a driver >= {need} for CUDA {gpu.cuda}. "
                             "Fix: run on a GPU node (srun/sbatch), with the NVIDIA container runtime (--gpus all)")
    if need is not None and _major(gpu.driver) < need:
        raise PreflightError(
            f"NVIDIA driver {gpu.driver} < {need}, which CUDA {gpu.cuda} (this torch's) needs: CUDA fails to initialise "
            f"in every worker. Fix: a node with driver >= {need}, or an image built for the driver's CUDA")
    return f"driver {gpu.driver} runs CUDA {gpu.cuda} (needs >= {need})"


def check_gpu_count(gpu: GpuFacts, nnodes: int, per_node: int) -> str:
    """GPUs visible here against ``trainer.n_gpus_per_node`` (every node must have as many).

    Raises:
        PreflightError: fewer visible than ``per_node`` (naming both, ``CUDA_VISIBLE_DEVICES`` and ``GPUS_PER_NODE``).
    """
    if gpu.count < per_node:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise PreflightError(
            f"{gpu.count} GPUs visible on this node (CUDA_VISIBLE_DEVICES={visible!r}); needed: "
            f"trainer.n_gpus_per_node={per_node} on each of trainer.nnodes={nnodes}. Fix: GPUS_PER_NODE={gpu.count} "
            "(the recipes' variable), or allocate the GPUs (e.g. --gpus-per-node)")
    extra = f"; {gpu.count - per_node} more visible than used" if gpu.count > per_node else ""
    return f"{gpu.count} GPUs visible = trainer.n_gpus_per_node; world {nnodes} x {per_node}{extra}"


def route_distributions(config) -> tuple[str, ...]:
    """verl's extras the config's route needs: ``vllm`` for ``rollout.name=vllm``, ``megatron`` for the Megatron
    actor."""
    arr = config.actor_rollout_ref
    return tuple(x for x, on in (("vllm", arr.rollout.name == "vllm"), ("megatron", arr.actor.strategy == "megatron"))
                 if on)


def route_modules(config) -> tuple[str, ...]:
    """The distributions of :data:`ROUTE_MODULES` the config imports (Megatron-Bridge unless ``vanilla_mbridge``)."""
    arr, out = config.actor_rollout_ref, []
    if arr.rollout.name == "vllm":
        out.append("vllm")
    if arr.actor.strategy == "megatron":
        out += ["megatron-core", "transformer-engine"]
        mg = arr.actor.megatron
        if mg.get("use_mbridge", False) and not mg.get("vanilla_mbridge", True):
            out += ["megatron-bridge", "nvidia-modelopt"]
    return tuple(out)


def check_route(route: RouteFacts, extras: tuple[str, ...], distributions: tuple[str, ...]) -> str:
    """The route's modules import, and every ``==`` pin of verl's ``extras`` holds.

    Args:
        route: the facts.
        extras: verl's extras the route needs (:func:`route_distributions`).
        distributions: distributions whose module must import (:func:`route_modules`).

    Raises:
        PreflightError: a module does not import, or an installed version differs from verl's pin.
    """
    from packaging.requirements import Requirement

    for dist in distributions:
        err = route.import_errors.get(ROUTE_MODULES[dist])
        if err:
            raise PreflightError(f"`import {ROUTE_MODULES[dist]}` ({dist}) fails: {err}; needed by this config's "
                                 f"route. Fix: install {dist} as verl's [{','.join(extras)}] extra pins it (docker/)")
    checked = []
    for line in route.verl_requires:
        req = Requirement(line)
        if req.marker is None or not any(req.marker.evaluate({"extra": x}) for x in extras):
            continue
        pins = [s for s in req.specifier if s.operator == "=="]
        found = route.versions.get(req.name)
        if not pins or found is None and req.name not in distributions:
            continue
        if found is None or not req.specifier.contains(found, prereleases=True):
            raise PreflightError(f"{req.name} {found or 'not installed'}; verl 0.9.1's [{','.join(extras)}] extra "
                                 f"needs {req.name}{req.specifier}. Fix: pip install '{req.name}{req.specifier}'")
        checked.append(f"{req.name}=={found}")
    return f"imports {list(distributions)}; pins hold: {', '.join(checked) or 'none'}"


def check_trackers(loggers: list[str], env: Mapping[str, str], netrc_hosts: tuple[str, ...],
                   importable: Callable[[str], bool]) -> str:
    """Every tracker of ``trainer.logger`` starts without a prompt (verl's ``Tracking`` creates them in ``fit()``).

    Args:
        loggers: ``trainer.logger``.
        env: the environment the trainer sees (the driver's, merged with ``ray_init.runtime_env.env_vars``).
        netrc_hosts: hosts with a ``~/.netrc`` entry (where ``wandb login`` stores the key).
        importable: ``module -> bool``.

    Raises:
        PreflightError: a tracker's package is missing, or wandb has no credentials and no offline mode.
    """
    for name, module in (("wandb", "wandb"), ("mlflow", "mlflow"), ("swanlab", "swanlab"),
                         ("tensorboard", "tensorboardX")):
        if name in loggers and not importable(module):
            raise PreflightError(f"trainer.logger has {name!r} but `import {module}` fails. Fix: pip install {module}, "
                                 f"or drop it from trainer.logger (LOGGER=... in the recipes)")
    if "wandb" in loggers:
        mode = env.get("WANDB_MODE", "")
        host = urlparse(env.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
        if not (env.get("WANDB_API_KEY") or mode in WANDB_OFFLINE or host in netrc_hosts):
            raise PreflightError(
                f"trainer.logger has 'wandb' but there are no credentials (WANDB_API_KEY unset, no {host} entry in "
                f"~/.netrc, WANDB_MODE={mode!r}); a batch job would stop at wandb.init after Ray and vLLM start. "
                "Fix: export WANDB_API_KEY=..., or `wandb login` on this node, or WANDB_MODE=offline, or "
                "LOGGER=\"['console']\"")
    return f"trackers {list(loggers)} start without a prompt"


def _readable(path: str) -> bool:
    return os.path.exists(path) and os.access(path, os.R_OK)


def _writable_dir(path: str) -> tuple[bool, str]:
    """Whether ``path`` (or the nearest existing parent it would be created in) is writable; that directory."""
    cur = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(cur) and os.path.dirname(cur) != cur:
        cur = os.path.dirname(cur)
    return os.path.isdir(cur) and os.access(cur, os.W_OK | os.X_OK), cur


def looks_local(path: str) -> bool:
    """A filesystem path rather than a HF hub id (``Qwen/Qwen3-8B-Base``)."""
    return path.startswith(("/", "./", "../", "~")) or os.path.exists(os.path.expanduser(path))


def check_paths(config, env: Mapping[str, str]) -> str:
    """``model.path`` and the data files readable, ``trainer.default_local_dir`` writable.

    Raises:
        PreflightError: naming the key, the path and the fix.
    """
    model = str(config.actor_rollout_ref.model.path)
    if looks_local(model):
        if not _readable(os.path.join(os.path.expanduser(model), "config.json")):
            raise PreflightError(f"actor_rollout_ref.model.path={model!r}: no readable config.json there. Fix: "
                                 "MODEL_PATH=<a HF model directory every node can read> or a HF hub id")
    elif env.get("HF_HUB_OFFLINE", "") in ("1", "true", "True"):
        raise PreflightError(f"actor_rollout_ref.model.path={model!r} is a HF hub id but HF_HUB_OFFLINE=1. Fix: "
                             "MODEL_PATH=<local directory> or unset HF_HUB_OFFLINE")
    for key in ("train_files", "val_files"):
        for f in data_files(config.data.get(key)):
            if not _readable(os.path.expanduser(f)):
                raise PreflightError(f"data.{key}: {f!r} is not a readable file here. Fix: DATA_DIR=<the folder "
                                     "python -m stapo_verl.data.prepare wrote> (readable on every node)")
    ckpt = str(config.trainer.default_local_dir)
    ok, where = _writable_dir(ckpt)
    if not ok:
        raise PreflightError(f"trainer.default_local_dir={ckpt!r}: {where!r} is not writable. Fix: CKPT_DIR=<a "
                             "writable folder on storage every node sees>")
    return f"model {model!r}, {len(data_files(config.data.get('train_files')))} train file(s) readable; " \
           f"checkpoints writable under {where}"


def check_generation_config(config) -> str:
    """The stop-token ``generation_config`` folder the rollout loads (``engine_kwargs.vllm.generation_config``).

    Raises:
        PreflightError: the folder holds no readable ``generation_config.json`` and cannot be written (the recipe
            writes it at launch); or, on several nodes, it is under ``/tmp`` (not seen by the other nodes).
    """
    from omegaconf import OmegaConf

    gc = OmegaConf.select(config, STOP_KEY, default=None)
    if gc in (None, "", "auto", "vllm"):
        return f"{STOP_KEY}={gc!r}: the model's own generation config"
    path = os.path.expanduser(str(gc))
    nodes = int(config.trainer.nnodes)
    if nodes > 1 and os.path.abspath(path).startswith("/tmp/"):
        raise PreflightError(f"{STOP_KEY}={gc!r} is under /tmp, which the other {nodes - 1} node(s) do not see. Fix: "
                             "GEN_CONFIG_DIR=<a folder on shared storage> (default: next to the checkpoints)")
    if _readable(os.path.join(path, "generation_config.json")):
        return f"{STOP_KEY}={gc!r} readable"
    ok, where = _writable_dir(path)
    if not ok:
        raise PreflightError(f"{STOP_KEY}={gc!r}: no generation_config.json there and {where!r} is not writable. "
                             "Fix: GEN_CONFIG_DIR=<a writable shared folder>, or STOP_AT_END_OF_TURN=0")
    return f"{STOP_KEY}={gc!r} is written at launch (under {where}, writable)"


_TC = "actor_rollout_ref.actor.megatron.override_transformer_config"
#: the GPU generation each of Megatron-Core's FP8 recipes (``override_transformer_config.fp8_recipe``) is written
#: for, as compute-capability majors: Transformer Engine's block scalings are per generation — ``Float8BlockScaling``
#: (``blockwise``, DeepSeek-V3's 1x128 / 128x128 scales) on Hopper (9.x), ``MXFP8BlockScaling`` (``mxfp8``, the OCP
#: microscaling format with hardware scale support) on Blackwell (10.x and later); ``delayed`` and ``tensorwise`` run
#: on every FP8 GPU (Ada 8.9 and later). Source: Transformer Engine's FP8 recipes
#: (https://docs.nvidia.com/deeplearning/transformer-engine/user-guide/examples/fp8_primer.html) and verl's
#: docs/low_precision/fp8.md ("blockwise" on Hopper).
FP8_RECIPE_GPUS = types.MappingProxyType({"blockwise": (9, 9), "mxfp8": (10, 99)})
#: the first compute capability with FP8 tensor cores (Ada, 8.9)
FP8_MIN_CAPABILITY = (8, 9)


def check_fp8_recipe(config, gpu: GpuFacts) -> str:
    """The FP8 recipe of ``config`` against the GPU generation of this node (:data:`FP8_RECIPE_GPUS`).

    Raises:
        PreflightError: FP8 on a GPU without FP8 tensor cores, ``blockwise`` on a GPU other than Hopper, ``mxfp8`` on
            a GPU older than Blackwell (naming the recipe, the GPU's compute capability and the fix).
    """
    from omegaconf import OmegaConf

    tc = OmegaConf.select(config, "actor_rollout_ref.actor.megatron.override_transformer_config", default=None) or {}
    fp8, recipe = tc.get("fp8", None), tc.get("fp8_recipe", None)
    if fp8 in (None, False):
        return "BF16: no FP8 recipe"
    if gpu.capability is None:
        return f"fp8_recipe={recipe!r} not matched: no GPU visible here"
    cap = tuple(gpu.capability)
    shown = f"{cap[0]}.{cap[1]}"
    if cap < FP8_MIN_CAPABILITY:
        raise PreflightError(f"{_TC}.fp8={fp8!r}: this node's GPUs (compute capability {shown}) have no FP8 tensor "
                             f"cores (Ada 8.9 or later needed). Fix: PRECISION=bf16")
    low, high = FP8_RECIPE_GPUS.get(str(recipe), (0, 99))
    if not low <= cap[0] <= high:
        other = [r for r, (lo, hi) in FP8_RECIPE_GPUS.items() if lo <= cap[0] <= hi]
        fix = f"FP8_RECIPE={other[0]} (this GPU's block scaling)" if other else "FP8_RECIPE=tensorwise"
        generation = {9: "Hopper", 10: "Blackwell"}.get(low, f"compute capability {low}.x")
        raise PreflightError(f"{_TC}.fp8_recipe={recipe!r} is Transformer Engine's recipe for {generation} GPUs; this "
                             f"node's are compute capability {shown}. Fix: {fix}, or PRECISION=bf16")
    return f"fp8_recipe={recipe!r} on compute capability {shown}"


def check_data_files(config) -> str:
    """:func:`stapo_verl.launch.data_checks.check_data` on the data files present on this node (the tokenizer of a
    local ``model.path`` counts the prompts).

    Raises:
        PreflightError: the message of its ``DataCheckError`` (file, rows, fields and the fix).
    """
    from stapo_verl.launch.data_checks import DataCheckError, check_data
    from stapo_verl.launch.recipe_rules import local_model

    try:
        return check_data(config, local_model(config)).detail
    except (DataCheckError, OSError) as exc:
        raise PreflightError(" ".join(str(exc).split())) from exc


def check_memory(config, gpu_memory_gb: float) -> str:
    """The memory plan of ``config`` on a GPU of ``gpu_memory_gb`` (:func:`stapo_verl.launch.memory_plan.
    plan_for_config`).

    Raises:
        PreflightError: a phase exceeds the GPU's memory (the plan, with the options that lower it, is the message).
    """
    from stapo_verl.launch.memory_plan import plan_for_config

    plan, why = plan_for_config(config, gpu_memory_gb)
    if plan is None:
        return f"not planned: {why}"
    if not plan.fits:
        raise PreflightError(f"the memory plan's {plan.peak.name} needs {plan.peak.total_gb:.1f} GB > the GPU's "
                             f"{gpu_memory_gb:.1f} GB. Fix: the options below\n" + "\n".join(plan.lines()))
    return f"peak {plan.peak.name} {plan.peak.total_gb:.1f} of {gpu_memory_gb:.1f} GB"


def trainer_env(config, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with ``ray_kwargs.ray_init.runtime_env.env_vars`` on top (what the TaskRunner sees)."""
    from omegaconf import OmegaConf

    shipped = OmegaConf.select(config, "ray_kwargs.ray_init.runtime_env.env_vars", default=None) or {}
    return {**env, **{str(k): str(v) for k, v in shipped.items()}}


def netrc_hosts(path: str | None = None) -> tuple[str, ...]:
    """Hosts of ``~/.netrc`` (or ``$NETRC``); () when there is none or it does not parse."""
    path = path or os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return tuple(netrc.netrc(path).hosts)
    except (OSError, netrc.NetrcParseError):
        return ()


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def gpu_free_checks(config, env: Mapping[str, str], hosts: tuple[str, ...],
                    importable: Callable[[str], bool] = _importable) -> list[tuple[str, Callable[[], str]]]:
    """The checks that need no GPU: ``(name, thunk)`` in order (each thunk raises :class:`PreflightError`)."""
    loggers = list(config.trainer.logger) if not isinstance(config.trainer.logger, str) else [config.trainer.logger]
    return [
        ("trackers", lambda: check_trackers(loggers, trainer_env(config, env), hosts, importable)),
        ("paths", lambda: check_paths(config, env)),
        ("stop-token generation config", lambda: check_generation_config(config)),
    ]


def gather_gpu_facts() -> GpuFacts:
    """This node's :class:`GpuFacts`: ``nvidia-smi`` for the driver, torch for CUDA, count and memory. Raises
    nothing (a missing piece is None / 0)."""
    driver = None
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            driver = out.stdout.split()[0] if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            driver = None
    try:
        import torch

        cuda = torch.version.cuda
        count = torch.cuda.device_count() if cuda else 0
        mem = min((torch.cuda.get_device_properties(i).total_memory for i in range(count)), default=None)
        capability = tuple(torch.cuda.get_device_capability(0)) if count else None
    except Exception:  # noqa: BLE001  (a broken CUDA setup: reported by check_driver)
        cuda, count, mem, capability = None, 0, None, None
    return GpuFacts(driver, cuda, count, None if mem is None else mem / 1e9, capability)


def gather_route_facts(distributions: tuple[str, ...]) -> RouteFacts:
    """This environment's :class:`RouteFacts` for ``distributions`` (imports their modules). Raises nothing."""
    versions, errors = {}, {}
    requires = tuple(importlib.metadata.requires("verl") or ())
    names = {line.split(";")[0].split("=")[0].split("<")[0].split(">")[0].split("[")[0].strip() for line in requires}
    for name in names | set(distributions):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    for dist in distributions:
        try:
            importlib.import_module(ROUTE_MODULES[dist])
            errors[ROUTE_MODULES[dist]] = None
        except Exception as exc:  # noqa: BLE001  (any import failure is the finding)
            errors[ROUTE_MODULES[dist]] = f"{type(exc).__name__}: {exc}"
    return RouteFacts(versions, errors, requires)


def all_checks(config, gpu: GpuFacts, route: RouteFacts, env: Mapping[str, str],
               hosts: tuple[str, ...]) -> list[tuple[str, Callable[[], str]]]:
    """Every check, GPU ones first: ``(name, thunk)``."""
    tr = config.trainer
    return [
        ("CUDA driver", lambda: check_driver(gpu)),
        ("GPUs", lambda: check_gpu_count(gpu, int(tr.nnodes), int(tr.n_gpus_per_node))),
        ("production route", lambda: check_route(route, route_distributions(config), route_modules(config))),
        ("FP8 recipe for this GPU", lambda: check_fp8_recipe(config, gpu)),
        *gpu_free_checks(config, env, hosts),
        ("data files (columns, every row's ground truth and prompt, routes, prompt lengths)",
         lambda: check_data_files(config)),
        ("memory plan", lambda: check_memory(config, gpu.memory_gb or 0.0)),
    ]


def as_dry_run_check(config, env: Mapping[str, str] | None = None) -> Check:
    """:func:`gpu_free_checks` for ``--dry-run``: PASS, or their failures as warnings (they stop the launch on the
    cluster, not the dry-run on a laptop)."""
    env = dict(os.environ if env is None else env)
    passed, warnings = [], []
    for name, thunk in gpu_free_checks(config, env, netrc_hosts()):
        try:
            passed.append(f"{name}: {thunk()}")
        except PreflightError as exc:
            warnings.append(f"the launch would stop here ({name}): {exc}")
    return Check("; ".join(passed) or "every check would stop the launch (warnings)", warnings=tuple(warnings))


def run(config, gpu: GpuFacts, route: RouteFacts, env: Mapping[str, str], hosts: tuple[str, ...], out=None) -> int:
    """Run :func:`all_checks`, print one line each; 0 when all pass, :data:`EXIT_CONFIG` at the first failure."""
    out = out or sys.stderr
    for name, thunk in all_checks(config, gpu, route, env, hosts):
        try:
            print(f"{PREFIX} PASS {name}: {thunk()}", file=out, flush=True)
        except PreflightError as exc:
            print(f"{PREFIX} ERROR {name}: {exc}", file=out, flush=True)
            return EXIT_CONFIG
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry: compose the overrides, gather this node's facts, :func:`run`."""
    from stapo_verl.launch.compose import compose_config

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        config = compose_config(argv)
    except Exception as exc:  # noqa: BLE001  (Hydra / OmegaConf: one line)
        print(f"{PREFIX} ERROR: the overrides do not compose: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_CONFIG
    from stapo_verl.launch.override_types import OverrideTypeError, check_composed

    try:
        check_composed(argv, config)
    except OverrideTypeError as exc:
        print(f"{PREFIX} ERROR: invalid config: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    route = gather_route_facts(route_modules(config))
    return run(config, gather_gpu_facts(), route, os.environ, netrc_hosts())


if __name__ == "__main__":
    sys.exit(main())
