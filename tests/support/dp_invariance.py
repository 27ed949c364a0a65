"""Worker of the DP-invariance test (``tests/integration/core/test_dp_invariance.py``): a module of its own so
``torch.multiprocessing.spawn`` can import it in the child processes."""

import os

import torch
import torch.distributed as dist
from verl.utils import tensordict_utils as tu

from stapo_verl.core.losses import apply_policy_token_mask, ppo_loss
from support.verl_batches import actor_config, as_micro_batch, model_output_for, random_minibatch

#: (loss_mode, token_mask); the metric that proves the mask acted
CASES = [("stapo", None, "actor/stapo/num_masked"), ("vanilla", "s2t_random", "actor/stapo/num_masked"),
         ("vanilla", "s2t_high_entropy", "actor/stapo/num_masked"), ("cispo", "s2t", "actor/stapo/num_masked"),
         ("gspo", "top_entropy", "actor/top_entropy/kept_frac")]


def loss_and_grad(rows, loss_mode, token_mask, group, dp_size):
    b = random_minibatch(bs=8, T=9, seed=21)
    cfg = actor_config(loss_mode, token_mask, top_entropy_ratio=0.3)
    td = tu.index_select_tensor_dict(b["td"], torch.as_tensor(rows))
    tu.assign_non_tensor(td, global_steps=5, mini_batch_index=2)
    metrics = apply_policy_token_mask(cfg, td, group)
    n_valid = torch.tensor(float(b["rm"][rows].sum()))
    if group is not None:
        dist.all_reduce(n_valid, group=group)
    logp = b["logp"].detach()[rows].clone().requires_grad_(True)
    mb = as_micro_batch(td, list(range(len(rows))), dp_size=dp_size, batch_num_tokens=int(n_valid),
                        global_batch_size=8)
    loss, _ = ppo_loss(cfg, model_output_for(mb, logp), mb, dp_group=group)
    loss.backward()
    return loss.detach(), logp.grad, metrics


def worker(rank, port, out_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    use_cpu_platform()
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    res = {}
    for loss_mode, token_mask, _ in CASES:
        rows = list(range(rank * 4, rank * 4 + 4))
        loss, grad, metrics = loss_and_grad(rows, loss_mode, token_mask, dist.group.WORLD, 2)
        losses = [torch.zeros((), dtype=torch.float64) for _ in range(2)]
        grads = [torch.zeros_like(grad) for _ in range(2)]
        dist.all_gather(losses, loss.double())
        dist.all_gather(grads, grad)
        width = max(g.shape[1] for g in grads)
        grads = [torch.nn.functional.pad(g, (0, width - g.shape[1])) for g in grads]
        res[(loss_mode, token_mask)] = (sum(losses) / 2, torch.cat(grads) / 2, metrics)  # DP average, as verl
    if rank == 0:
        torch.save(res, out_path)
    dist.destroy_process_group()




def use_cpu_platform() -> None:
    """Make verl's ``get_device_id()`` name the CPU in a gloo test process (the mask pre-pass moves the mask's inputs
    to the DP group's device, as verl's engines move their token count): verl's public ``set_platform`` with the
    plugin's CPU platform, without the rest of ``VERL_PLATFORM=cpu``'s set-up."""
    from verl.plugin.platform.platform_manager import set_platform

    from stapo_verl.cpu.platform import PlatformCPU

    set_platform(PlatformCPU())
