"""Keep fairseq-train's ``--patience`` count across a resume.

``fairseq_cli.train.should_stop_early`` keeps the best validation value and the number of validations since it as
attributes of the function, which no checkpoint saves. A run resumed from ``checkpoint_last.pt`` therefore starts
counting again, and its first validation becomes "the best" even when it is worse than the checkpointed best: an
interrupted run trains on for up to ``--patience`` more validations than the same run uninterrupted, and may pick
another best checkpoint. The grid runner's cells (scripts/experiments/grid.py) span sessions and are resumed this way.

Importing the plug-in calls :func:`resume_patience`, which wraps two fairseq functions:
- ``fairseq.trainer.Trainer.save_checkpoint`` adds the early-stopping state (the best value and the count of
  validations since it) to every checkpoint's ``extra_state["patience"]``;
- ``fairseq.checkpoint_utils.load_checkpoint``, after fairseq restored a run's own ``checkpoint_last.pt`` (not a
  ``--finetune-from-model`` start, another run's ``--restore-file`` or a reset), restores that state. A checkpoint saved
  without it (before this fix) gives the count from the epochs of ``checkpoint_last.pt`` and ``checkpoint_best.pt``
  and ``--validate-interval`` (:func:`validations_since_best`; fairseq rewrites ``checkpoint_best.pt`` on a tie, which
  its early stopping does not count as better, so with ties this count is a lower bound).
A resumed run then stops where the uninterrupted run stops. Nothing changes for a run without ``--patience``, a fresh
run, or an old checkpoint of a run that validates every N updates (``--validate-interval-updates``: a warning says so).

:func:`stopping_state` tells whether a run's checkpoint has already met its stopping rule; the recipes' ``stage``
asks it (``python -m user_dir.tools.training_stopped``) before resuming a fairseq-train stage whose process was
killed after its last checkpoint but before the stage was marked done -- fairseq-train would otherwise take one more
update past ``--max-update``, or one more epoch past a met ``--patience``.
"""
import functools
import logging
import os
import sys

import torch
from fairseq import checkpoint_utils
from fairseq.trainer import Trainer

logger = logging.getLogger(__name__)


def _completed_epochs(state):
    """Epochs a checkpoint had finished (fairseq saves an end-of-epoch iterator as the next epoch at iteration 0,
    a mid-epoch one as the current epoch: both are ``epoch - 1`` finished)."""
    iterator = (state.get("extra_state") or {}).get("train_iterator") or {}
    return iterator.get("epoch", 1) - 1


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def validations_since_best(save_dir, validate_interval, last_state=None):
    """Validations after the one that wrote ``checkpoint_best.pt`` up to ``checkpoint_last.pt``, with one
    validation every ``validate_interval`` epochs; None when either checkpoint is missing."""
    last, best = os.path.join(save_dir, "checkpoint_last.pt"), os.path.join(save_dir, "checkpoint_best.pt")
    if not (os.path.exists(best) and (last_state is not None or os.path.exists(last))):
        return None
    done_last = _completed_epochs(last_state if last_state is not None else _load(last))
    done_best = _completed_epochs(_load(best))
    return max(0, done_last // validate_interval - done_best // validate_interval)


def stopping_state(save_dir, max_update=0, max_epoch=0, patience=-1, validate_interval=1,
                   validate_interval_updates=0):
    """Why the run saved in SAVE_DIR has already stopped ('max-update', 'max-epoch', 'patience'), or None when it
    has not (or has no checkpoint yet)."""
    last = os.path.join(save_dir, "checkpoint_last.pt")
    if not os.path.exists(last):
        return None
    state = _load(last)
    updates = int(state["optimizer_history"][-1]["num_updates"])
    iterator = (state.get("extra_state") or {}).get("train_iterator") or {}
    if max_update and updates >= max_update:
        return "max-update"
    if max_epoch and iterator.get("iterations_in_epoch", 0) == 0 and _completed_epochs(state) >= max_epoch:
        return "max-epoch"
    saved = (state.get("extra_state") or {}).get("patience")
    if patience > 0 and (saved or not validate_interval_updates):
        since = saved["num_runs"] if saved else validations_since_best(save_dir, validate_interval, state)
        if since is not None and since >= patience:
            return "patience"
    return None


def _train_modules():
    """fairseq_cli.train as imported (fairseq-train) and as ``python -m fairseq_cli.train`` runs it (__main__)."""
    found = []
    for name in ("fairseq_cli.train", "__main__"):
        module = sys.modules.get(name)
        if module is not None and callable(getattr(module, "should_stop_early", None)) and \
                os.path.basename(getattr(module, "__file__", "") or "") == "train.py":
            found.append(module)
    return found


def _resumes_its_own_run(cfg):
    """Whether fairseq-train is about to load SAVE_DIR/checkpoint_last.pt with its state (not a --finetune-from-model
    start, another run's --restore-file or a reset): only then is the checkpoint's best this run's."""
    own = os.path.join(cfg.save_dir, "checkpoint_last.pt")
    path = own if cfg.restore_file == "checkpoint_last.pt" else cfg.restore_file
    return (os.path.exists(own) and os.path.realpath(path) == os.path.realpath(own)
            and not cfg.reset_optimizer and not cfg.reset_meters)


def _early_stopping_state():
    """fairseq_cli.train.should_stop_early's best value and count, where this process has validated."""
    for module in _train_modules():
        if hasattr(module.should_stop_early, "best"):
            return {"best": module.should_stop_early.best, "num_runs": module.should_stop_early.num_runs}
    return None


def _restore(cfg, trainer, extra_state):
    patience = getattr(cfg, "patience", -1) or -1
    if patience <= 0 or not extra_state or "best" not in extra_state:
        return
    saved = extra_state.get("patience")
    if saved:
        best, since = saved["best"], saved["num_runs"]
    else:  # a checkpoint saved without it: count from the epochs
        dataset = getattr(getattr(trainer, "cfg", None), "dataset", None)
        if dataset is not None and getattr(dataset, "validate_interval_updates", 0):
            logger.warning("--patience with --validate-interval-updates and a checkpoint without its early-stopping "
                           "state: fairseq-train counts --patience from 0 again")
            return
        best = extra_state["best"]
        since = validations_since_best(cfg.save_dir, getattr(dataset, "validate_interval", 1) or 1)
        if since is None:
            return
    for module in _train_modules():
        module.should_stop_early.best = best
        module.should_stop_early.num_runs = since
    logger.info(f"resumed --patience {patience}: best {best}, {since} validation(s) since it")
    if since >= patience:
        logger.warning(f"this run had already met --patience {patience}; fairseq-train trains one more epoch and "
                       "stops unless it validates better")


def resume_patience() -> None:
    """Wrap ``Trainer.save_checkpoint`` and ``fairseq.checkpoint_utils.load_checkpoint`` (idempotent)."""
    original = checkpoint_utils.load_checkpoint
    if getattr(original, "resumes_patience", False):
        return
    original_save = Trainer.save_checkpoint

    @functools.wraps(original_save)
    def save_checkpoint(self, filename, extra_state):
        state = _early_stopping_state()
        if state is not None and extra_state is not None:
            extra_state = dict(extra_state, patience=state)
        return original_save(self, filename, extra_state)

    Trainer.save_checkpoint = save_checkpoint

    @functools.wraps(original)
    def load_checkpoint(cfg, trainer, **passthrough_args):
        own = _resumes_its_own_run(cfg)
        extra_state, epoch_itr = original(cfg, trainer, **passthrough_args)
        if own:
            _restore(cfg, trainer, extra_state)
        return extra_state, epoch_itr

    load_checkpoint.resumes_patience = True
    checkpoint_utils.load_checkpoint = load_checkpoint
