"""One process of the resume test of ``token_mask=s2t_random``: the plugin's ``TrainingWorker.train_batch`` wrapper
(a stub engine, no model) runs the mask on fixed mini-batches; prints the masks of step 2 as JSON.

argv: ``continued`` (4 mini-batches of step 1 first, as an uninterrupted run) or ``fresh`` (a process resumed at
step 2).
"""

import functools
import json
import sys
from types import SimpleNamespace

import torch
import verl  # noqa: F401  (the entry point installs the plugin)
from support.verl_batches import actor_config, random_minibatch
from support.workers import as_training_worker
from verl.utils import tensordict_utils as tu

from stapo_verl.core import losses as core_losses
from stapo_verl.core.losses import POLICY_LOSS_MASK_KEY
from stapo_verl.integration.verl_0_9_1.training_worker import StapoPrepareBatch
from stapo_verl.integration.verl_0_9_1.worker import wrap_train_batch


def main(mode):
    cfg = actor_config("vanilla", "s2t_random", random_mask_seed=7)
    engine = SimpleNamespace(get_data_parallel_group=lambda: None, get_data_parallel_rank=lambda: 0,
                             is_mp_src_rank_with_outputs=lambda: True)
    worker = SimpleNamespace(engine=engine, loss_fn=functools.partial(core_losses.ppo_loss, config=cfg),
                             prepare_batch_fn=StapoPrepareBatch(cfg, {}))
    masks = []

    def body(self, data):  # stands in for the engine's forward/backward: record the mask the pre-pass wrote
        masks.append(data[POLICY_LOSS_MASK_KEY].to_padded_tensor(0).tolist())

    as_training_worker(worker, body)
    train_batch = wrap_train_batch(body)

    def update(step, n_minibatches):  # one train_mini_batch call; verl flags its last mini-batch
        for j in range(n_minibatches):
            td = random_minibatch(bs=8, T=9, seed=100 + j)["td"]  # the same data at the same position
            td["global_steps"] = torch.full((8,), step)  # per-sample TransferQueue field
            tu.assign_non_tensor(td, update_lr_scheduler=j == n_minibatches - 1)
            train_batch(worker, td)

    if mode == "continued":
        update(1, 4)
    update(2, 2)
    print(json.dumps(masks[-2:]))


if __name__ == "__main__":
    main(sys.argv[1])
