"""PET's competitors (PET Table 7): Patient-KD (patient_kd_criterion.py) and CAN
(can_transformer.py). The plain word-level KD baseline needs no module of its own: the stock
``transformer`` architecture at the student's size with ``--criterion kd`` (common/word_kd_criterion.py)."""
from . import patient_kd_criterion  # noqa: F401  registers --criterion patient_kd
from . import can_transformer  # noqa: F401  registers --arch can_transformer(_iwslt)
