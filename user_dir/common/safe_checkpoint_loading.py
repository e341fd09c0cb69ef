"""Let ``torch.load`` open fairseq checkpoints under torch >= 2.6 with ``weights_only`` left on.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True`` and refuses any pickled global it
does not know. fairseq checkpoints hold a few: the ``argparse.Namespace`` of old-style args, the
omegaconf containers of ``cfg``, and numpy scalars/arrays inside the meters of ``extra_state``
(checkpoint_last.pt, used to resume). fairseq calls plain ``torch.load`` when it loads a checkpoint
(``fairseq-generate``, ``-interactive``, ``-validate``, resuming ``fairseq-train``) and when it
broadcasts a loaded state to the other ranks of distributed training (``broadcast_object`` pickles
the state with its cfg already turned into omegaconf containers), so all of those fail.

Importing the plug-in (``--user-dir user_dir``) calls :func:`allow_fairseq_checkpoint_globals`,
which adds exactly those globals to torch's allow-list (``torch.serialization.add_safe_globals``).
No environment variable is needed and the weights-only unpickler stays in force: a checkpoint
with any other global is still refused. The list was read off real checkpoints with
``torch.serialization.get_unsafe_globals_in_checkpoint`` (translation and sentence-prediction,
best and last, tests/test_plugin_and_checkpoints.py checks it stays complete).
"""
import importlib
import logging
from typing import List

import torch

logger = logging.getLogger(__name__)

# "module:qualname" of every global a fairseq checkpoint may pickle. Names that do not exist in
# the installed numpy/omegaconf version (numpy 1 vs 2 moved ``core`` to ``_core``) are skipped.
FAIRSEQ_CHECKPOINT_GLOBALS = (
    "argparse:Namespace",
    "collections:OrderedDict",
    "collections:defaultdict",
    "typing:Any",
    # plain types, pickled by reference inside omegaconf metadata (ref_type/object_type/key_type)
    # once fairseq has turned a loaded cfg into a DictConfig and broadcasts it to other ranks
    "builtins:dict",
    "builtins:list",
    "builtins:tuple",
    "builtins:set",
    "builtins:int",
    "builtins:float",
    "builtins:str",
    "builtins:bool",
    # numpy scalars and arrays (meters, best-checkpoint scores, dataset sizes)
    "numpy:ndarray",
    "numpy:dtype",
    "numpy.core.multiarray:scalar",
    "numpy.core.multiarray:_reconstruct",
    "numpy._core.multiarray:scalar",
    "numpy._core.multiarray:_reconstruct",
    # the placeholder fairseq's broadcast_object puts where tensors were (distributed training)
    "fairseq.distributed.utils:_TensorPlaceholder",
    # omegaconf containers and nodes (cfg of hydra-style checkpoints)
    "omegaconf.dictconfig:DictConfig",
    "omegaconf.listconfig:ListConfig",
    "omegaconf.base:ContainerMetadata",
    "omegaconf.base:Metadata",
    "omegaconf.nodes:AnyNode",
    "omegaconf.nodes:StringNode",
    "omegaconf.nodes:IntegerNode",
    "omegaconf.nodes:FloatNode",
    "omegaconf.nodes:BooleanNode",
    "omegaconf.nodes:EnumNode",
    "omegaconf.nodes:ValueNode",
)

# numpy dtype classes (numpy >= 1.25 pickles ``np.dtype(float64)`` through ``numpy.dtypes.Float64DType``)
_NUMPY_DTYPE_NAMES = (
    "float16", "float32", "float64", "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64", "bool_",
)


def _resolve(spec: str):
    module_name, qualname = spec.split(":")
    try:
        obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return obj


def fairseq_checkpoint_globals() -> List[object]:
    """The objects to allow-list, resolved against the installed numpy and omegaconf."""
    found = [obj for obj in map(_resolve, FAIRSEQ_CHECKPOINT_GLOBALS) if obj is not None]
    try:
        import numpy as np

        found.extend(type(np.dtype(name)) for name in _NUMPY_DTYPE_NAMES)
    except ImportError:  # numpy is a fairseq dependency; be safe anyway
        pass
    # de-duplicate, keeping order (numpy 2 aliases numpy.core to numpy._core)
    unique = []
    for obj in found:
        if all(obj is not seen for seen in unique):
            unique.append(obj)
    return unique


def allow_fairseq_checkpoint_globals() -> bool:
    """Register the globals with torch. Returns False on a torch too old to need it."""
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is None:  # torch < 2.4: torch.load is not weights-only by default
        return False
    add_safe_globals(fairseq_checkpoint_globals())
    return True
