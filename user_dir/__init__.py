"""fairseq-compress: the ``--user-dir`` plug-in.

Importing this package (``fairseq-train --user-dir user_dir ...``, or ``import user_dir``)
1. lets ``torch.load`` open fairseq checkpoints under torch >= 2.6 with weights_only kept on
   (common/safe_checkpoint_loading.py), so fairseq-generate/-interactive/-validate, resuming and
   distributed training work without any environment variable;
2. registers the plug-in's criteria, tasks and models, each module imported explicitly below.
"""
from .common.safe_checkpoint_loading import allow_fairseq_checkpoint_globals

allow_fairseq_checkpoint_globals()

from .common import glue_metrics  # noqa: E402,F401  registers the glue_sentence_prediction criterion
from .common import word_kd_criterion  # noqa: E402,F401  registers the kd criterion
from . import pet  # noqa: E402,F401  registers the pet_transformer model and its archs
from . import baselines  # noqa: E402,F401  registers PET's competitors (patient_kd criterion, CAN model)
from . import bert  # noqa: E402,F401  registers hf_bert (imported Hugging Face BERT-family encoders)
from . import variator  # noqa: E402,F401  registers Variator's plugin tasks and distillation criterion
