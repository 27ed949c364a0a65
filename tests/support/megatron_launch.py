"""Launch a gloo job as N ranks (one subprocess each; ``megatron_engine_job.py`` by default) and build the tiny HF
model dir the Megatron jobs load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from support.procs import TESTS, child_env, free_port

JOB = TESTS / "integration" / "core" / "megatron_engine_job.py"
BS, MICRO = 8, 2  # mini-batch rows, micro-batch rows


def make_model_dir(path: Path) -> Path:
    """support.tiny_qwen3 (2 layers, hidden 32, GQA, untied head) + a 64-token word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from support.tiny_qwen3 import VOCAB, tiny_qwen3

    tiny_qwen3(seed=0, vocab=VOCAB).save_pretrained(path)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t1"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", unk_token="t1", eos_token="t2").save_pretrained(path)
    return path


def run_job(out: Path, model_dir: Path, tp: int, pp: int, world: int, timeout: int = 420,
            extra_env: dict | None = None, job: Path = JOB, argv: list[str] | None = None,
            python: str = sys.executable) -> None:
    """Run ``world`` ranks of ``job`` with ``python`` (argv: ``argv``, default ``out model_dir tp pp`` for
    ``megatron_engine_job.py``); raise AssertionError with the failing rank's stderr tail if any rank fails."""
    argv = [str(out), str(model_dir), str(tp), str(pp)] if argv is None else [str(a) for a in argv]
    port = free_port()
    procs = []
    for rank in range(world):
        env = child_env(VERL_PLATFORM="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                        WORLD_SIZE=str(world), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                        **(extra_env or {}))
        procs.append(subprocess.Popen([python, str(job), *argv],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, log in enumerate(logs):
        Path(f"{out}.rank{r}.log").write_text(log)
    bad = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
    assert not bad, f"ranks failed {bad}:\n" + "\n".join(logs[r][-3000:] for r, _ in bad)


def hf_model(model_dir, state_dict):
    """The HF model of ``model_dir`` in fp32 (eager attention) with ``state_dict`` (HF names) loaded strictly."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    return model.eval()


def reference(model, prompt, response, temperature):
    """Unsharded fp64 entropy and log-prob of each response token (predicted at the position before it)."""
    ids = torch.cat([prompt, response])
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0].double() / temperature
    logp = torch.log_softmax(logits, -1)[len(prompt) - 1: len(ids) - 1]
    return -(logp.exp() * logp).sum(-1), logp.gather(-1, response[:, None]).squeeze(-1)
