"""Variator: plug-and-play compression plugins for frozen encoders (Xiao et al.)."""
from . import distillation_criterion  # noqa: F401  registers the variator_distill criterion
from . import variator_tasks  # noqa: F401  registers variator_translation and variator_sentence_prediction
