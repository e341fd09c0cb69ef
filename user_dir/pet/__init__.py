"""PET: parameter-efficient knowledge distillation on Transformer (Jeon et al., PLoS ONE 2023)."""
from . import pet_transformer  # noqa: F401  registers pet_transformer and its archs
from . import warmup_criterion  # noqa: F401  registers the pet_warmup criterion
