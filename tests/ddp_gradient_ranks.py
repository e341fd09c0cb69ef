"""One rank of tests/test_ddp_gradients.py (run as ``python tests/ddp_gradient_ranks.py CONFIG.json``
with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set; not collected by pytest).

For every case of the config (a name and a ``fairseq-train`` command line) the rank builds task, model
and criterion as ``fairseq-train`` does (same seed on every rank), then:

1. the reference, in this one process without any wrapper: the gradient of the criterion's loss on
   batch 0 and on batch 1 (real sentences of the case's data), averaged -- what DistributedDataParallel
   must produce when rank r holds batch r;
2. the model wrapped as fairseq wraps it for ``--ddp-backend pytorch_ddp``
   (``ModuleProxyWrapper(DistributedDataParallel(model))``, with ``device_ids=None`` because stock
   fairseq's ``device_ids=[cpu]`` is refused by torch on a CPU), the criterion wrapped alike when it
   has parameters (fairseq's Trainer.criterion), one forward through ``criterion(model, sample)`` on
   batch ``rank``, one backward.

It saves both gradients (model and criterion parameters; a parameter without a gradient counts as
zeros, as legacy_ddp fills it) to ``OUT/NAME.rankR.pt``.
"""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist



def build(argv):
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, argv)
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    torch.manual_seed(cfg.common.seed)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return cfg, task, model, criterion


def batches(task, size):
    dataset = task.dataset("train")
    return [dataset.collater([dataset[i] for i in range(r * size, (r + 1) * size)]) for r in range(2)]


def gradients(named_modules):
    grads = {}
    for prefix, module in named_modules:
        for name, p in module.named_parameters():
            if p.requires_grad:
                grads[prefix + name] = (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)).float()
    return grads


def zero(*modules):
    for module in modules:
        for p in module.parameters():
            p.grad = None


def run_case(name, argv, size, out, rank):
    from fairseq.distributed import ModuleProxyWrapper
    from torch.nn.parallel import DistributedDataParallel

    cfg, task, model, criterion = build(argv)
    model.train()
    criterion.train()
    samples = batches(task, size)
    parts = (("model.", model), ("criterion.", criterion))

    per_batch = []
    for sample in samples:  # one process, both batches
        zero(model, criterion)
        loss, _, _ = criterion(model, sample)
        loss.backward()
        per_batch.append(gradients(parts))
    reference = {k: (per_batch[0][k] + per_batch[1][k]) / 2 for k in per_batch[0]}
    # how far a rank that kept its own batch's gradient would be from the reference
    local_error = max(float(torch.cat([(g[k] - reference[k]).flatten() for k in g]).norm()) for g in per_batch)
    zero(model, criterion)

    def wrap(module):
        return ModuleProxyWrapper(DistributedDataParallel(
            module, device_ids=None, broadcast_buffers=cfg.distributed_training.broadcast_buffers,
            find_unused_parameters=cfg.distributed_training.find_unused_parameters))

    wrapped_model = wrap(model)
    wrapped_criterion = wrap(criterion) if any(p.requires_grad for p in criterion.parameters()) else criterion
    loss, _, _ = wrapped_criterion(wrapped_model, samples[rank])
    loss.backward()
    torch.save({"reference": reference, "ddp": gradients(parts), "loss": float(loss), "local_error": local_error},
               os.path.join(out, f"{name}.rank{rank}.pt"))


def main():
    config = json.load(open(sys.argv[1]))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    # a case that fails on one rank only must not leave the other waiting for gloo's 30-minute default
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    failures = {}
    for name, argv in config["cases"].items():
        try:
            run_case(name, argv, config["batch_size"], config["out"], rank)
        except Exception as e:  # reported per case by the test; the other cases still run
            failures[name] = f"{type(e).__name__}: {e}"
        dist.barrier()
    json.dump(failures, open(os.path.join(config["out"], f"failures.rank{rank}.json"), "w"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
