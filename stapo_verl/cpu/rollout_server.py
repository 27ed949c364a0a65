"""Token-in/token-out generation server on CPU with Hugging Face ``transformers``.

Mirrors the server half of verl's vLLM backend (``verl.workers.rollout.vllm_rollout.vllm_async_server.vLLMHttpServer``:
``generate`` and the control methods) without HTTP/ZMQ: a Ray actor holds its own HF copy of the policy, samples
with its own loop (so the returned log-probs are exactly ``log_softmax`` of the processed logits), micro-batches
concurrent requests that share sampling settings, and takes new weights through the Ray object store
(:meth:`CPURolloutServer.update_weights`). A request with a ``seed`` (vLLM's per-request seed) samples the same
whatever it is batched with (:class:`HFGenerator`).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional

import torch

from stapo_verl.stop_tokens import effective_stop_ids

logger = logging.getLogger(__name__)


def _cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    """Read ``key`` from a dataclass, DictConfig or dict (verl hands either, depending on the caller)."""
    if cfg is None:
        return default
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    try:
        return cfg.get(key, default)  # DictConfig and verl's BaseConfig both implement .get
    except Exception:
        return getattr(cfg, key, default)


@dataclass(frozen=True)
class SamplingSettings:
    """Sampling settings of one request, normalised to verl/vLLM semantics.

    Attributes:
        temperature: 0 → greedy (argmax); > 0 divides the logits.
        top_p: nucleus threshold in (0, 1]; 1 → off.
        top_k: keep the k largest logits; ``-1`` or ``0`` → off (vLLM's "disabled").
        logprobs: return one log-prob per generated token.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    logprobs: bool = False

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "SamplingSettings":
        """Build from the agent loop's ``sampling_params`` dict (``verl.trainer.ppo.v1.agent_loop_tq``).

        Raises:
            ValueError: a key with an invalid value (message names key and value), or ``n`` > 1 (the agent
                loop expands ``rollout.n`` into separate calls, so a server-side n would be a bug), or a
                ``repetition_penalty`` other than 1.0 (not implemented).
        """
        temperature = float(params.get("temperature", 1.0))
        if temperature < 0:
            raise ValueError(f"sampling_params['temperature']={temperature!r}: must be >= 0")
        top_p = float(params.get("top_p", 1.0))
        if not (0.0 < top_p <= 1.0):
            raise ValueError(f"sampling_params['top_p']={top_p!r}: must be in (0, 1]")
        top_k = params.get("top_k", -1)
        top_k = -1 if top_k is None else int(top_k)
        if top_k < -1:
            raise ValueError(f"sampling_params['top_k']={top_k!r}: must be -1 (off), 0 (off) or > 0")
        n = int(params.get("n", 1) or 1)
        if n != 1:
            raise ValueError(f"sampling_params['n']={n!r}: the CPU server returns one sequence per call")
        rep = float(params.get("repetition_penalty", 1.0) or 1.0)
        if rep != 1.0:
            raise ValueError(f"sampling_params['repetition_penalty']={rep!r}: only 1.0 is supported on CPU")
        return cls(temperature=temperature, top_p=top_p, top_k=0 if top_k in (-1, 0) else top_k,
                   logprobs=bool(params.get("logprobs", False)))

    @property
    def greedy(self) -> bool:
        """True when ``temperature == 0`` (argmax decoding, as verl's ``val_kwargs`` default)."""
        return self.temperature == 0.0


def generation_config_setting(config: Any) -> Optional[str]:
    """``rollout.engine_kwargs.vllm.generation_config`` of a rollout config (None when unset).

    The CPU server stands in for verl's vLLM server, so it honours the vLLM engine argument that selects the
    generation config (and with it the stop ids): ``auto`` (the model's), ``vllm`` (none) or a folder.
    """
    engine_kwargs = _cfg_get(config, "engine_kwargs", None) or {}
    vllm_kwargs = _cfg_get(engine_kwargs, "vllm", None) or {}
    value = _cfg_get(vllm_kwargs, "generation_config", None)
    return None if value is None else str(value)


def process_logits(logits: torch.Tensor, s: SamplingSettings) -> torch.Tensor:
    """Apply temperature, top-k and top-p to raw next-token logits, in vLLM's order.

    Args:
        logits: float tensor ``[B, V]`` (raw last-position logits).
        s: the request's :class:`SamplingSettings`. Greedy requests are returned unscaled (their log-probs
            are those of the raw distribution, like vLLM at temperature 0).
    Returns:
        float32 tensor ``[B, V]``; filtered entries are ``-inf``. ``log_softmax`` of it is the
        "processed_logprobs" distribution verl's default ``rollout.logprobs_mode`` expects.
    """
    x = logits.float()
    if s.greedy:
        return x
    if s.temperature != 1.0:
        x = x / s.temperature
    if s.top_k > 0 and s.top_k < x.shape[-1]:
        kth = torch.topk(x, s.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_x, idx = torch.sort(x, dim=-1, descending=False)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(dim=-1)
        drop = cum <= (1.0 - s.top_p)
        drop[..., -1] = False  # always keep the most likely token
        x = x.masked_fill(drop.scatter(-1, idx, drop), float("-inf"))
    return x


def derive_max_tokens(prompt_len: int, prompt_length: int, response_length: int,
                      max_model_len: Optional[int], params: dict[str, Any]) -> int:
    """Number of tokens a request may generate, derived like vLLM (``verl.workers.rollout.vllm_rollout.vllm_async_server.vLLMHttpServer.generate``).

    ``max_tokens`` / ``max_new_tokens`` in ``params`` win; otherwise
    ``min(response_length, prompt_length + response_length - prompt_len)``; then clamped to
    ``[1, max_model_len - prompt_len]`` with ``max_model_len`` defaulting to ``prompt_length + response_length``.

    Raises:
        ValueError: the prompt leaves no room for a single token.
    """
    max_model_len = int(max_model_len or (prompt_length + response_length))
    room = max_model_len - prompt_len
    if room < 1:
        raise ValueError(f"prompt of {prompt_len} tokens leaves no room within max_model_len={max_model_len}")
    if params.get("max_tokens") is not None:
        mt = int(params["max_tokens"])
    elif params.get("max_new_tokens") is not None:
        mt = int(params["max_new_tokens"])
    else:
        mt = min(response_length, prompt_length + response_length - prompt_len)
    return max(1, min(mt, room))


def request_seed(params: dict[str, Any]) -> Optional[int]:
    """The per-request ``seed`` of a ``sampling_params`` dict (vLLM's ``SamplingParams.seed``), or None.

    Raises:
        ValueError: ``seed`` is not an integer in ``[0, 2**63)`` (the range of ``torch.Generator.manual_seed``).
    """
    seed = params.get("seed")
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"sampling_params['seed']={seed!r}: must be an integer in [0, 2**63)")
    return seed


class HFGenerator:
    """Batched sampler over a Hugging Face causal LM (KV cache, left padding to a fixed length, fixed-size row blocks).

    Batch invariance by construction: the requests of a call are cut into blocks of exactly :attr:`block_rows` rows
    (the last block filled with dummy rows), every block is left-padded to the same length ``pad_to`` (the rollout's
    ``prompt_length``) and decoded on its own, with its own KV cache. So the model sees the same sequence of tensor
    shapes, ``[block_rows, pad_to]`` for the prompt and then ``[block_rows, 1]`` per token, whatever the number of
    requests that arrived together, and a row's logits cannot depend on it through the choice of CPU kernels (which
    do depend on the shapes: measured with torch 2.13 in fp32, ``F.linear`` moves a row's logits by about 1e-6 between
    8 and 40 rows on an Intel Xeon with AVX-512, and between 1-7 and 8 rows on an AMD EPYC; a ragged pad changes the
    columns CPU SDPA reduces over). Within one shape, a row's result does not depend on the other rows or on its
    position in the block (GEMM and SDPA compute rows independently; checked on the Xeon for blocks of 1-64 rows).
    Together with a per-request seed this makes what a request samples a function of its prompt, its seed and the
    weights alone, as vLLM's batch-invariant mode with ``SamplingParams.seed`` does on GPUs.

    Args:
        model: a ``transformers`` causal LM on CPU, in eval mode.
        eos_token_ids: ids that end a sequence (the EOS is included in the output, as vLLM does).
        pad_token_id: id used for left padding of the prompt batch.
        seed: seed of the generator shared by requests without a seed of their own (each such call advances it,
            so those draws depend on batching, as unseeded requests do in vLLM).
        pad_to: fixed left-padded prompt length; a block with a longer prompt is padded to that prompt (and loses
            batch invariance). 0 pads to the longest prompt of each block.
        block_rows: rows of every model call (:attr:`BLOCK_ROWS` by default; the cost against one call over all
            rows is measured by ``benchmarks/bench_rollout_blocks.py``). 0 computes all requests of a call as one
            block of their own number of rows (shapes then depend on the batch: not batch-invariant).
    Raises:
        ValueError: ``block_rows`` < 0.
    """

    #: default rows of every model call (dummy rows fill the last block; see the class docstring)
    BLOCK_ROWS = 32

    def __init__(self, model, eos_token_ids: list[int], pad_token_id: int, seed: int = 0, pad_to: int = 0,
                 block_rows: int = BLOCK_ROWS):
        if int(block_rows) < 0:
            raise ValueError(f"HFGenerator: block_rows={block_rows!r}: must be >= 1 (or 0: one block per call)")
        self.model = model
        self.eos = torch.tensor(sorted(set(int(e) for e in eos_token_ids)), dtype=torch.long)
        self.pad_token_id = int(pad_token_id)
        self.rng = torch.Generator().manual_seed(int(seed))
        self.pad_to = int(pad_to)
        self.block_rows = int(block_rows)
        #: blocks decoded, their rows that carried a request, their dummy rows (counted in :meth:`_generate_block`)
        self.num_blocks = 0
        self.real_rows = 0
        self.padding_rows = 0

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_tokens: list[int], s: SamplingSettings,
                 seeds: Optional[list[Optional[int]]] = None) -> list[tuple[list[int], Optional[list[float]]]]:
        """Generate one continuation per prompt, block by block (see the class docstring).

        Args:
            prompts: B token-id lists (no padding).
            max_tokens: per-prompt generation limits (>= 1).
            s: shared sampling settings.
            seeds: per-prompt seeds (None: the shared generator). A seeded row draws its tokens from its own
                ``torch.Generator`` seeded with it, one ``torch.multinomial`` per generated token.
        Returns:
            B pairs ``(token_ids, log_probs)`` in the order of ``prompts``; ``token_ids`` ends with the EOS when
            generation stopped on it, ``log_probs`` is ``None`` unless ``s.logprobs``.
        Raises:
            ValueError: ``seeds`` or ``max_tokens`` not of length B.
        """
        n_req = len(prompts)
        seeds = list(seeds) if seeds is not None else [None] * n_req
        if len(seeds) != n_req or len(max_tokens) != n_req:
            raise ValueError(f"HFGenerator.generate: {len(seeds)} seeds and {len(max_tokens)} limits for "
                             f"{n_req} prompts")
        rows = self.block_rows or max(1, n_req)
        results: list[tuple[list[int], Optional[list[float]]]] = []
        for lo in range(0, n_req, rows):
            block = slice(lo, lo + rows)
            results += self._generate_block(list(prompts[block]), list(max_tokens[block]), s, seeds[block], rows)
        return results

    def _generate_block(self, prompts: list[list[int]], max_tokens: list[int], s: SamplingSettings,
                        seeds: list[Optional[int]], rows: int) -> list[tuple[list[int], Optional[list[float]]]]:
        """Decode up to ``rows`` requests as one block of exactly ``rows`` rows (dummy rows: own seed, one token)."""
        n_req = len(prompts)
        fill = rows - n_req
        self.num_blocks += 1
        self.real_rows += n_req
        self.padding_rows += fill
        prompts = prompts + [prompts[0]] * fill
        max_tokens = max_tokens + [1] * fill
        seeds = seeds + [0] * fill
        B = rows
        rngs = [None if sd is None else torch.Generator().manual_seed(int(sd)) for sd in seeds]
        T = max(self.pad_to, max(len(p) for p in prompts))
        ids = torch.full((B, T), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((B, T), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, T - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, T - len(p):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        limits = torch.tensor(max_tokens)
        steps = int(limits.max())
        out_tok = torch.full((B, steps), self.pad_token_id, dtype=torch.long)
        out_lp = torch.zeros((B, steps), dtype=torch.float32)
        done = torch.zeros(B, dtype=torch.bool)
        n_gen = torch.zeros(B, dtype=torch.long)
        past = None
        cur_ids, cur_pos = ids, pos
        for t in range(steps):
            out = self.model(input_ids=cur_ids, attention_mask=mask, position_ids=cur_pos,
                             past_key_values=past, use_cache=True)
            past = out.past_key_values
            x = process_logits(out.logits[:, -1, :], s)
            if s.greedy:
                nxt = torch.argmax(x, dim=-1)
            else:
                probs = torch.softmax(x, dim=-1)
                nxt = torch.empty(B, dtype=torch.long)
                shared = [i for i in range(B) if rngs[i] is None]
                if shared:
                    nxt[shared] = torch.multinomial(probs[shared], 1, generator=self.rng).squeeze(-1)
                for i, rng in enumerate(rngs):
                    if rng is not None:
                        nxt[i] = torch.multinomial(probs[i], 1, generator=rng)[0]
            lp = torch.log_softmax(x, dim=-1).gather(-1, nxt[:, None]).squeeze(-1)
            active = ~done
            out_tok[active, t] = nxt[active]
            out_lp[active, t] = lp[active]
            n_gen += active.long()
            done = done | torch.isin(nxt, self.eos) | (n_gen >= limits)
            if bool(done.all()):
                break
            cur_ids = nxt[:, None]
            cur_pos = cur_pos[:, -1:] + 1
            mask = torch.cat([mask, torch.ones((B, 1), dtype=torch.long)], dim=-1)
        results = []
        for i in range(n_req):
            k = int(n_gen[i])
            toks = out_tok[i, :k].tolist()
            results.append((toks, out_lp[i, :k].tolist() if s.logprobs else None))
        return results


def load_hf_model(path: str, dtype: str = "float32"):
    """Load a causal LM for CPU generation with SDPA attention.

    Raises:
        OSError: ``path`` is not a local HF model directory (no hub download is attempted).
    """
    from transformers import AutoModelForCausalLM

    torch_dtype = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                   "bf16": torch.bfloat16}.get(str(dtype), torch.float32)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation="sdpa",
                                                 local_files_only=True)
    model.eval()
    return model


def glibc_malloc_trim() -> Optional[Any]:
    """glibc's ``malloc_trim`` (``int malloc_trim(size_t pad)``), or ``None`` where the C library is not glibc.

    Why: generation allocates and frees tens of MiB of activations and KV cache per batch, and glibc keeps freed
    chunks in its arenas (64 MiB regions, one set per allocating thread) instead of returning them to the system.
    ``malloc_trim(0)`` returns the free pages of every arena (https://man7.org/linux/man-pages/man3/malloc_trim.3.html).
    Measured with ``benchmarks/bench_long_run.py`` (docs/results.md, "Long runs"): the server's private memory at step
    34 was 846 MiB without it and about 650 MiB with it (and one generation thread). The growth that remained was
    not freed memory but oneDNN's kernel caches (:func:`onednn_cache_env`).

    Returns:
        the C function (call it with ``0``), or ``None``.
    """
    name = ctypes.util.find_library("c")
    if not name:
        return None
    libc = ctypes.CDLL(name)
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


#: entries kept by each of oneDNN's two kernel caches in the server process (:func:`onednn_cache_env`)
ONEDNN_CACHE_CAPACITY = 64


def onednn_cache_env(capacity: int = ONEDNN_CACHE_CAPACITY) -> dict[str, str]:
    """Environment variables that cap the compiled matmul kernels oneDNN keeps in the server process.

    Why: on x86 CPUs a bfloat16 matmul (verl's default ``rollout.dtype``) runs through oneDNN (``ideep``), which
    compiles one kernel per shape and keeps it in two caches of up to 1,024 entries each: ideep's (env
    ``LRU_CACHE_CAPACITY``) and oneDNN's primitive cache (env ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``). Generation
    changes the shapes with the number of rows of every batch and with every decoded token (the KV length), so the
    caches keep filling, at hundreds of KiB an entry. Measured on the tiny model in bfloat16, 200 batches of 2-128
    rows: private memory 279 -> 820 MiB with the default capacities, flat at 310 MiB with 64 each (and no slower).
    Float32 matmuls use MKL and are not cached. Both variables are read once, at the process's first oneDNN matmul,
    so the replica sets them in the server actor's ``runtime_env``, i.e. from the process's start.

    Returns:
        ``{"LRU_CACHE_CAPACITY": ..., "ONEDNN_PRIMITIVE_CACHE_CAPACITY": ...}``: ``capacity``, or the value already
        set in this process's environment.
    """
    return {k: os.environ.get(k, str(int(capacity)))
            for k in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")}


class CPURolloutServer:
    """Ray actor (one per replica node) serving ``generate`` for verl's agent loop on CPU.

    Constructor arguments are those ``vLLMReplica.launch_servers`` passes (``verl.workers.rollout.vllm_rollout.vllm_async_server``);
    only ``config`` (``RolloutConfig``), ``model_config`` and ``replica_rank`` are used.

    Public methods (all async, called through Ray): :meth:`launch_server`, :meth:`generate`,
    :meth:`update_weights`, :meth:`set_global_steps`, :meth:`get_global_steps`, and no-op control methods
    ``wake_up``, ``sleep``, ``abort_all_requests``, ``resume_generation``, ``clear_kv_cache``,
    ``release_kv_cache``, ``resume_kv_cache``, ``start_profile``, ``stop_profile``.
    """

    #: seconds without a new request after which a partly filled block is decoded anyway (:meth:`_drain`). On a
    #: loaded machine the agent loop's requests paused for more than 0.2 s in 3-6 of a tiny run's 18 training steps
    #: (each a partly filled block, costing a whole one); a request count that is not a multiple of the block waits
    #: this long at the end of a generation.
    IDLE_GAP_S = 0.5
    #: most requests one call of the generation thread decodes (whole blocks); the rest wait for the next call
    MAX_BATCH = 256

    def __init__(self, config, model_config, replica_rank: int = 0, node_rank: int = 0, **_kwargs):
        self.config = config
        self.model_config = model_config
        self.replica_rank = int(replica_rank)
        self.node_rank = int(node_rank)
        self.global_steps = 0  # an int from the start: the trainer casts it with np.array(dtype=int)
        self.generator: Optional[HFGenerator] = None
        self.generation_config: Optional[str] = None  # engine_kwargs.vllm.generation_config, set at launch
        self.stop_token_ids: list[int] = []  # ids generation stops at, set at launch
        self._lock = threading.Lock()
        self._pending: list[tuple[list[int], int, SamplingSettings, Optional[int], asyncio.Future]] = []
        self._batch_task: Optional[asyncio.Task] = None
        self._arrived: Optional[asyncio.Event] = None  # set by every request; created with the _drain task
        self._last_arrival = 0.0  # event-loop time of the latest request
        # Every batch runs on this one thread (not asyncio's default pool, whose threads each grow their own glibc
        # arena), and returns its freed memory afterwards (glibc_malloc_trim).
        self._generation_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cpu-rollout-generate")
        self._malloc_trim = glibc_malloc_trim()
        self.num_requests = 0
        self.num_batches = 0
        self.generation_s = 0.0  # seconds the generation thread spent in HFGenerator.generate
        self.generation_cpu_s = 0.0  # CPU seconds of that thread in it
        self._reported: dict[str, float] = {}  # get_stats() at the last weight update (the per-step log line)

    # ------------------------------------------------------------------ lifecycle
    async def launch_server(self, **_kwargs) -> None:
        """Load the model and tokenizer from ``model_config.path`` and fix the stop ids (idempotent).

        Raises:
            ValueError: no model path, or no stop id at all.
            FileNotFoundError: ``engine_kwargs.vllm.generation_config`` names a folder without
                ``generation_config.json`` (:func:`stapo_verl.stop_tokens.effective_stop_ids`).
        """
        if self.generator is not None:
            return
        from transformers import AutoTokenizer

        path = _cfg_get(self.model_config, "local_path") or _cfg_get(self.model_config, "path")
        if not path:
            raise ValueError(f"CPU rollout: actor_rollout_ref.model.path is empty ({self.model_config!r})")
        threads = int(os.environ.get("STAPO_CPU_ROLLOUT_THREADS", "0") or 0)
        if threads > 0:
            torch.set_num_threads(threads)
        model = load_hf_model(path, _cfg_get(self.config, "dtype", "float32"))
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        # Stop ids as vLLM derives them: the tokenizer's EOS + eos_token_id of the generation config chosen by
        # vLLM's `generation_config` engine argument, read from the same key verl passes to `vllm serve`.
        self.generation_config = generation_config_setting(self.config)
        eos = set(effective_stop_ids(path, self.generation_config, tokenizer=tok))
        if not eos:
            raise ValueError(f"CPU rollout: tokenizer at {path} defines no eos_token_id and the generation config "
                             f"({self.generation_config or 'auto'}) no eos_token_id")
        self.stop_token_ids = sorted(eos)
        pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
        seed = int(_cfg_get(self.config, "seed", 0) or 0) + 1000 * self.replica_rank
        self.prompt_length = int(_cfg_get(self.config, "prompt_length", 512))
        self.generator = HFGenerator(model, sorted(eos), pad, seed=seed, pad_to=self.prompt_length)
        self.response_length = int(_cfg_get(self.config, "response_length", 512))
        self.max_model_len = _cfg_get(self.config, "max_model_len", None)

    async def get_master_address(self):
        """Mirror of vLLM's method (unused on CPU): ``(None, None, None)``."""
        return None, None, None

    async def get_server_address(self) -> tuple[str, int]:
        """A unique pseudo address; the sync trainer uses it only as a load-balancer key."""
        return f"cpu-rollout-{self.replica_rank}-{self.node_rank}", 0

    # ------------------------------------------------------------------ generation
    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                       image_data=None, video_data=None, audio_data=None, mm_processor_kwargs=None,
                       priority: int = 0, **_kwargs):
        """Generate one response (``TokenOutput``), like ``vLLMHttpServer.generate``.

        Args:
            prompt_ids: prompt token ids.
            sampling_params: ``temperature``, ``top_p``, ``top_k``, ``repetition_penalty``, ``logprobs``
                (bool), optional ``max_tokens``/``max_new_tokens`` and ``seed`` (vLLM's per-request seed: the
                request's draws then depend on it alone, not on which requests share its batch).
            request_id: opaque id (logged only).
        Returns:
            ``verl.workers.rollout.replica.TokenOutput`` with ``token_ids`` (EOS included when hit),
            ``log_probs`` (processed log-probs or ``None``), ``stop_reason="completed"`` and
            ``extra_fields={"global_steps": int}``.
        Raises:
            ValueError: multimodal input, or an invalid sampling value (including ``seed``).
        """
        from verl.workers.rollout.replica import TokenOutput

        if image_data or video_data or audio_data:
            raise ValueError(f"CPU rollout (request {request_id}): multimodal input is not supported")
        if self.generator is None:
            await self.launch_server()
        params = dict(sampling_params)
        s = SamplingSettings.from_params(params)
        seed = request_seed(params)
        prompt_ids = [int(t) for t in prompt_ids]
        mt = derive_max_tokens(len(prompt_ids), self.prompt_length, self.response_length, self.max_model_len, params)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((prompt_ids, mt, s, seed, fut))
        self._last_arrival = loop.time()
        if self._batch_task is None or self._batch_task.done():
            self._arrived = asyncio.Event()
            self._batch_task = asyncio.create_task(self._drain())
        self._arrived.set()
        toks, lps = await fut
        self.num_requests += 1
        return TokenOutput(token_ids=toks, log_probs=lps, stop_reason="completed",
                           extra_fields={"global_steps": int(self.global_steps)})

    async def _drain(self) -> None:
        """Decode the pending requests, whole blocks first, until none is left (one task at a time).

        A sampling-settings group with at least ``block_rows`` pending requests is decoded at once, in whole blocks
        (at most :attr:`MAX_BATCH` requests a call); its remainder waits. A group with fewer waits until it fills a
        block or no request has arrived for :attr:`IDLE_GAP_S` (the agent loop has handed over what it had), and is
        then decoded as one partly filled block. verl's agent loop hands requests over one at a time (tens of ms of
        its CPU each); decoding whatever had arrived within 20 ms (the earlier rule) ran a partly filled block or two
        a step (the tiny run: 5-6 blocks and 32-64 dummy rows for its 128 requests, against 4 and 0 now; a block
        costs the same whatever its number of real rows).

        Which requests share a block depends on timing; what a seeded request samples does not: every block has
        ``block_rows`` rows and each seeded row draws from its own generator (:class:`HFGenerator`). Timing decides
        the speed only.
        """
        loop = asyncio.get_running_loop()
        while self._pending:
            idle = loop.time() - self._last_arrival >= self.IDLE_GAP_S
            items = self._take(idle)
            if not items:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(),
                                           max(1e-3, self._last_arrival + self.IDLE_GAP_S - loop.time()))
                except asyncio.TimeoutError:
                    pass
                continue
            try:
                res = await loop.run_in_executor(self._generation_thread, self._run_batch, [i[0] for i in items],
                                                 [i[1] for i in items], items[0][2], [i[3] for i in items])
                for item, r in zip(items, res):
                    if not item[4].done():
                        item[4].set_result(r)
            except Exception as e:  # hand the error to every waiting request
                for item in items:
                    if not item[4].done():
                        item[4].set_exception(e)

    def _take(self, idle: bool) -> list:
        """Remove from the queue and return the requests to decode next (one settings group, arrival order).

        Args:
            idle: no request arrived for :attr:`IDLE_GAP_S`.
        Returns:
            the whole blocks of the first group (by first arrival) that fills one, at most :attr:`MAX_BATCH`
            requests; else, when ``idle``, the first group's requests (at most :attr:`MAX_BATCH`); else ``[]``. With
            ``block_rows=0`` (one block per call, not batch-invariant) a block is "full" at :attr:`MAX_BATCH`.
        """
        rows = self.generator.block_rows or self.MAX_BATCH
        groups: dict[SamplingSettings, list[int]] = {}
        for k, item in enumerate(self._pending):
            groups.setdefault(item[2], []).append(k)
        chosen: list[int] = []
        for idx in groups.values():
            if len(idx) >= rows:
                chosen = idx[: max(rows, self.MAX_BATCH // rows * rows)][: len(idx) // rows * rows]
                break
        if not chosen and idle:
            chosen = next(iter(groups.values()))[: self.MAX_BATCH]
        taken = set(chosen)
        items = [self._pending[k] for k in chosen]
        self._pending = [item for k, item in enumerate(self._pending) if k not in taken]
        return items

    def _run_batch(self, prompts, max_tokens, s, seeds):
        with self._lock:
            self.num_batches += 1
            start, start_cpu = time.perf_counter(), time.thread_time()
            try:
                return self.generator.generate(prompts, max_tokens, s, seeds)
            finally:
                self.generation_s += time.perf_counter() - start
                self.generation_cpu_s += time.thread_time() - start_cpu
                if self._malloc_trim is not None:
                    self._malloc_trim(0)

    # ------------------------------------------------------------------ weights
    async def update_weights(self, state_dict: dict[str, torch.Tensor]) -> int:
        """Copy HF-named tensors into the server model (dtype cast; tied embeddings handled by HF).

        Args:
            state_dict: ``{hf_name: tensor}`` (Ray resolves the adapter's ``ray.put`` reference).
        Returns:
            number of tensors loaded.
        Raises:
            KeyError: a name that the server model does not have, or a model parameter left unassigned
                (message lists up to 5 names).
        """
        if self.generator is None:
            await self.launch_server()
        model = self.generator.model
        # state_dict (not named_parameters) so tied weights appear under both names, as the actor sends them
        params = model.state_dict(keep_vars=True)
        unknown = [k for k in state_dict if k not in params]
        if unknown:
            raise KeyError(f"CPU rollout update_weights: unknown parameter names {unknown[:5]}")
        missing = [k for k, v in model.named_parameters() if k not in state_dict]
        if missing:
            raise KeyError(f"CPU rollout update_weights: parameters not sent {missing[:5]}")
        with self._lock, torch.no_grad():
            for k, v in state_dict.items():
                p = params[k]
                if tuple(p.shape) != tuple(v.shape):
                    raise KeyError(f"CPU rollout update_weights: shape of {k} is {tuple(v.shape)}, "
                                   f"expected {tuple(p.shape)}")
                p.copy_(v.to(p.dtype))
        return len(state_dict)

    async def set_global_steps(self, global_steps: int) -> None:
        """Record the policy version stamped into ``extra_fields['global_steps']`` (as ``vLLMHttpServer`` does).

        Also prints one line of what was sampled since the previous call (requests, blocks, dummy rows, generation
        seconds) to the server's stdout, which Ray forwards to the run's log (``train.log``; not the console).
        """
        stats = await self.get_stats()
        delta = {k: v - self._reported.get(k, 0) for k, v in stats.items()}
        self._reported = stats
        if delta["num_requests"] or delta["num_blocks"]:
            rows = delta["real_rows"] + delta["padding_rows"]
            print(f"[cpu rollout] before step {int(global_steps)}: {delta['num_requests']} requests, "
                  f"{delta['num_blocks']} blocks, {delta['padding_rows']} of {rows} rows padding, "
                  f"generation {delta['generation_s']:.2f} s ({delta['generation_cpu_s']:.2f} CPU-s), "
                  f"server process {delta['process_cpu_s']:.2f} CPU-s", flush=True)
        self.global_steps = int(global_steps)

    async def get_global_steps(self) -> int:
        """Current policy version."""
        return self.global_steps

    async def get_stats(self) -> dict[str, float]:
        """Counters since launch: requests served, batches run, blocks decoded, their rows that carried a request and
        their dummy rows (:class:`HFGenerator`), the seconds spent generating (wall and the generation thread's CPU)
        and the CPU seconds of the whole server process."""
        gen = self.generator
        return {"num_requests": self.num_requests, "num_batches": self.num_batches,
                "num_blocks": gen.num_blocks if gen else 0, "real_rows": gen.real_rows if gen else 0,
                "padding_rows": gen.padding_rows if gen else 0, "generation_s": self.generation_s,
                "generation_cpu_s": self.generation_cpu_s, "process_cpu_s": time.process_time()}

    # ------------------------------------------------------------------ control no-ops (verl.workers.rollout.replica.RolloutReplica)
    async def wake_up(self, tags: Optional[list[str]] = None):
        """No-op: CPU weights stay resident."""

    async def sleep(self):
        """No-op: CPU weights stay resident."""

    async def abort_all_requests(self, reject_request: bool = False) -> dict:
        """No-op (partial rollout is not used by the sync trainer)."""
        return {}

    async def resume_generation(self):
        """No-op."""

    async def clear_kv_cache(self):
        """No-op: the KV cache lives only inside one batch."""

    async def release_kv_cache(self):
        """No-op."""

    async def resume_kv_cache(self):
        """No-op."""

    async def start_profile(self, **_kwargs):
        """No-op."""

    async def stop_profile(self):
        """No-op."""
