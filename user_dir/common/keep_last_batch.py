"""Keep the last batch that fairseq 0.12 drops: every example of a valid or test set is scored.

``fairseq.data.data_utils.batch_by_size`` ends with::

    if bsz_mult > 1 and len(b[-1]) % bsz_mult != 0:
        b = b[:-1]

With ``--required-batch-size-multiple`` at its default of 8, the last batch of every epoch is
thrown away unless its size is a multiple of 8 (fairseq issue #5036, open). In training that costs
at most 7 examples an epoch; in ``fairseq-train``'s validation, ``fairseq-validate`` and
``fairseq-generate`` it silently scores a subset: RTE's 277 dev examples are validated as 272 (the
best checkpoint is then chosen on 272 of them), and a test set of 6,750 sentences (IWSLT'14
DE->EN) can be translated as 6,744, so BLEU is not that of the test set.

Importing the plug-in calls :func:`keep_last_batch`, which wraps ``batch_by_size`` so that the
dropped tail comes back as a final, smaller batch. Batches are built from ``indices`` in order, so
the dropped examples are exactly the indices after the last kept batch. Every other batch is
unchanged, and so is the ``fixed_shapes`` path, which never dropped anything.
"""
import functools

import numpy as np
from fairseq.data import data_utils


def keep_last_batch() -> None:
    """Wrap ``fairseq.data.data_utils.batch_by_size`` (idempotent)."""
    original = data_utils.batch_by_size
    if getattr(original, "keeps_last_batch", False):
        return

    @functools.wraps(original)
    def batch_by_size(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None, max_sentences=None,
                      required_batch_size_multiple=1, fixed_shapes=None):
        if not isinstance(indices, np.ndarray):  # may be an iterator: read it once, here
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        batches = original(indices, num_tokens_fn, num_tokens_vec=num_tokens_vec, max_tokens=max_tokens,
                           max_sentences=max_sentences, required_batch_size_multiple=required_batch_size_multiple,
                           fixed_shapes=fixed_shapes)
        if fixed_shapes is not None:
            return batches
        kept = sum(len(b) for b in batches)
        if kept < len(indices):
            batches = list(batches) + [indices[kept:].astype(np.int64)]
        return batches

    batch_by_size.keeps_last_batch = True
    batch_by_size.fairseq_batch_by_size = original
    data_utils.batch_by_size = batch_by_size
