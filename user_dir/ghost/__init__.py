"""GhostBERT (Huang et al.): importance pruning of heads and FFN neurons, ghost modules, distillation."""
from . import distillation_criterion, ghost_model  # noqa: F401  register ghost_distill and the ghost_* models
