"""APC: adaptive parameter compression (anonymous ACL submission; ../shared/papers/apc.txt)."""
from . import apc_transformer  # noqa: F401  registers the apc_transformer model and its archs
from . import apc_hf_bert  # noqa: F401  registers apc_hf_bert (APC on imported BERT-family encoders)
from . import activation_kd_criterion  # noqa: F401  registers the apc_activation_kd criterion
