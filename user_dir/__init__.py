"""fairseq-compress: the ``--user-dir`` plug-in.

Importing this package (``fairseq-train --user-dir user_dir ...``, or ``import user_dir``)
1. lets ``torch.load`` open fairseq checkpoints under torch >= 2.6 with weights_only kept on
   (common/safe_checkpoint_loading.py), so fairseq-generate/-interactive/-validate, resuming and
   distributed training work without any environment variable;
2. makes fairseq keep the last batch of an epoch, which fairseq 0.12 drops unless its size is a
   multiple of --required-batch-size-multiple (8): validation, fairseq-validate and fairseq-generate
   then score every example of a set (common/keep_last_batch.py);
3. makes a resumed fairseq-train keep its ``--patience`` count, which fairseq keeps in no checkpoint
   (common/resume_patience.py);
4. registers the plug-in's criteria, tasks and models, each module imported explicitly below.
"""
import os

from .common.keep_last_batch import keep_last_batch
from .common.resume_patience import resume_patience
from .common.safe_checkpoint_loading import allow_fairseq_checkpoint_globals

allow_fairseq_checkpoint_globals()
keep_last_batch()
resume_patience()

from .common import glue_metrics  # noqa: E402,F401  registers the glue_sentence_prediction criterion
from .common import word_kd_criterion  # noqa: E402,F401  registers the kd criterion
from . import pet  # noqa: E402,F401  registers the pet_transformer model and its archs
from . import baselines  # noqa: E402,F401  registers PET's competitors (patient_kd criterion, CAN model)
from . import bert  # noqa: E402,F401  registers hf_bert (imported Hugging Face BERT-family encoders)
from . import variator  # noqa: E402,F401  registers Variator's plugin tasks and distillation criterion
from . import apc  # noqa: E402,F401  registers apc_transformer (APC) and its criterion
from . import ghost  # noqa: E402,F401  registers GhostBERT's ghost_* models and ghost_distill criterion

PLUGIN_DIR = os.path.dirname(os.path.abspath(__file__))  # what tools pass to fairseq as --user-dir
