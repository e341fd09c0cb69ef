"""Write GhostBERT's initial checkpoint: importance of the teacher's heads and neurons on a data set,
rewiring and slicing to width multiplier m, ghost modules added (GhostBERT section 2.3 "Pruning";
user_dir/ghost/).

    python -m user_dir.ghost.tools.prune DATA --path teacher.pt --width-mult 2/4 --out init.pt
        [--subset valid] [--max-tokens 4096] [--ghost-positions o,ffn2 | none] [ghost flags]

The output is an ordinary fairseq checkpoint of arch ``ghost_transformer`` (translation
teachers) or ``ghost_hf_bert`` (imported BERT-family teachers) holding the teacher's arguments
plus the ghost flags: ``fairseq-generate``/``-validate`` use it as it is, and ``fairseq-train
--finetune-from-model init.pt`` trains it with the architecture flags this tool prints (and writes
beside it as ``init.pt.flags``): fairseq builds the model being trained from the command line.
``--finetune-from-model`` (not ``--restore-file``) is the clean way: it resets optimizer, meters,
learning-rate schedule and data position, and a resumed run continues from its own
``checkpoint_last.pt``.

The importance scores and the kept heads/neurons of each layer are kept in the checkpoint's
``extra_state["ghost_prune"]``.
"""
import argparse
import logging
import os
import shlex
import sys

import torch
from fairseq import checkpoint_utils, utils
from fairseq.criterions.cross_entropy import CrossEntropyCriterion

import user_dir  # noqa: F401  registers the ghost_* models
from user_dir.common.model_flags import architecture_flags
from user_dir.common.structured_pruning import transformer_encoder
from user_dir.ghost.ghost_model import add_ghost_args, ghost_model_args
from user_dir.ghost.ghost_module import GhostConfigError
from user_dir.ghost.importance import accumulate_importance
from user_dir.ghost.rewiring import kept_counts, load_pruned, prune_plan

logger = logging.getLogger("ghost_prune")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="the binarised data the teacher was trained on (fairseq data directory)")
    parser.add_argument("--path", required=True, help="the unpruned fine-tuned teacher's checkpoint")
    parser.add_argument("--out", required=True, help="where to write the pruned (+ghost) checkpoint")
    parser.add_argument("--width-mult", default="1",
                        help="width multiplier m: keep M = floor(N_H m) heads and M of N_H FFN folds per layer "
                             "(section 2.1; e.g. 2/4, 3/12; default 1: unpruned, ghost modules only)")
    parser.add_argument("--subset", default="valid",
                        help="data the importance is accumulated over (DynaBERT: the dev set; default valid)")
    parser.add_argument("--max-tokens", type=int, default=4096, help="batch size in tokens for the importance pass")
    parser.add_argument("--batch-size", type=int, default=None, help="batch size in sentences (sentence tasks)")
    parser.add_argument("--max-batches", type=int, default=0, help="use only the first N batches (0: all)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the ghost modules' initialisation")
    parser.add_argument("--cpu", action="store_true", help="compute on the CPU even if CUDA is available")
    add_ghost_args(parser)
    args = parser.parse_args(argv)
    if args.ghost_heads is not None or args.ghost_ffn_dim is not None:
        parser.error("--ghost-heads / --ghost-ffn-dim are set from --width-mult here")
    return args


def task_loss(task):
    """The loss the importance is taken of: the task's cross-entropy, summed over the batch."""
    if getattr(task.cfg, "num_classes", None) is not None:  # sentence prediction
        from fairseq.criterions.sentence_prediction import SentencePredictionConfig, SentencePredictionCriterion
        criterion = SentencePredictionCriterion(SentencePredictionConfig(
            classification_head_name=getattr(task.cfg, "classification_head_name", "sentence_classification_head"),
            regression_target=bool(getattr(task.cfg, "regression_target", False))), task)
    else:
        criterion = CrossEntropyCriterion(task, sentence_avg=False)
    return lambda model, sample: criterion(model, sample)[0]


def batches(task, subset, args, model, use_cuda):
    task.load_dataset(subset)
    itr = task.get_batch_iterator(dataset=task.dataset(subset), max_tokens=args.max_tokens,
                                  max_sentences=args.batch_size, max_positions=utils.resolve_max_positions(
                                      task.max_positions(), model.max_positions()),
                                  ignore_invalid_inputs=True, seed=args.seed, num_workers=0).next_epoch_itr(shuffle=False)
    for i, sample in enumerate(itr):
        if args.max_batches and i >= args.max_batches:
            break
        yield utils.move_to_cuda(sample) if use_cuda else sample


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stdout)
    if not os.path.isfile(args.path):
        raise SystemExit(f"--path {args.path}: no such checkpoint")
    use_cuda = torch.cuda.is_available() and not args.cpu
    state = checkpoint_utils.load_checkpoint_to_cpu(args.path, arg_overrides={"data": args.data})
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([args.path], arg_overrides={"data": args.data},
                                                                       state=state)
    teacher = models[0].cuda() if use_cuda else models[0]
    layer = transformer_encoder(teacher).layers[0]
    heads, ffn = layer.self_attn.num_heads, layer.fc1.out_features
    kept_heads, kept_ffn = kept_counts(args.width_mult, heads, ffn)

    try:
        ghost_model_args(cfg.model)  # a model type GhostBERT can prune, before the importance pass
    except GhostConfigError as e:
        raise SystemExit(f"--path {args.path}: {e}")
    head_imp, neuron_imp = accumulate_importance(teacher, task_loss(task),
                                                 batches(task, args.subset, args, teacher, use_cuda))
    plan = prune_plan(head_imp, neuron_imp, kept_heads, kept_ffn)
    for i, (kept, neurons) in enumerate(plan):
        logger.info("layer %d: head importance %s, keeps heads %s and %d of %d neurons", i + 1,
                    [round(float(v), 4) for v in head_imp[i]], kept, len(neurons), ffn)

    flags = {k: v for k, v in vars(args).items() if k.startswith("ghost_")}
    flags.update(ghost_heads=kept_heads, ghost_ffn_dim=kept_ffn)
    ghost_args = ghost_model_args(cfg.model, **flags)
    torch.manual_seed(args.seed)
    student = task.build_model(ghost_args)
    fresh = load_pruned(student, teacher.cpu(), plan)
    logger.info("pruned to %d/%d heads and %d/%d neurons per layer; %d fresh ghost tensors", kept_heads, heads,
                kept_ffn, ffn, len(fresh))

    state["model"] = student.state_dict()
    state["cfg"]["model"] = ghost_args
    state["last_optimizer_state"] = None
    state.setdefault("extra_state", {})
    state["extra_state"] = {k: v for k, v in (state["extra_state"] or {}).items() if k != "train_iterator"}
    state["extra_state"]["ghost_prune"] = {
        "teacher": os.path.abspath(args.path), "width_mult": args.width_mult, "subset": args.subset,
        "head_importance": head_imp.tolist(), "neuron_importance": neuron_imp.tolist(),
        "kept_heads": [p[0] for p in plan], "kept_neurons": [p[1] for p in plan]}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    checkpoint_utils.torch_persistent_save(state, args.out)
    flags = architecture_flags(ghost_args)
    with open(args.out + ".flags", "w") as f:
        f.write(shlex.join(flags) + "\n")
    print(f"wrote {args.out}; train it with: fairseq-train DATA --user-dir user_dir "
          f"$(fc-flags {shlex.quote(args.out)}) "
          f"--finetune-from-model {shlex.quote(args.out)} and the task, criterion and optimiser flags "
          "(scripts/recipes/ghostbert.sh has them)")


if __name__ == "__main__":
    main()
