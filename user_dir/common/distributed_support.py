"""Which ``--ddp-backend`` values the plug-in's models and criteria train with.

Supported and tested (tests/test_ddp_gradients.py, tests/test_distributed_equality.py):
``pytorch_ddp`` (fairseq's default on GPUs; ``c10d`` is its alias) and ``legacy_ddp`` (``no_c10d``).
Every criterion runs the student through the wrapper's forward (common/wrapped_forward.py), which is
what these need. Refused, naming the flag, before anything is built:

* ``fully_sharded``: fairseq's FSDP path needs fairscale (archived upstream; not a dependency of this
  package) and shards flattened parameters; nothing of PET's shared layers, Variator's frozen
  backbone beside trainable plugins, or the per-layer hooks of GhostBERT, APC and the distillation
  criteria has run under it;
* ``slowmo``: fairscale's SlowMo averages parameters every ``--localsgd-frequency`` updates instead
  of gradients every update (a different optimiser from the papers'), and needs fairscale too.
"""

SUPPORTED = ("pytorch_ddp", "c10d", "legacy_ddp", "no_c10d")
REFUSED = {
    "fully_sharded": "it needs fairscale (archived upstream, not installed with this package) and shards flattened "
                     "parameters, under which PET's shared layers, Variator's frozen backbone and the per-layer "
                     "hooks of GhostBERT, APC and the distillation criteria have never run",
    "slowmo": "SlowMo averages parameters every --localsgd-frequency updates instead of gradients every update (a "
              "different optimiser from the papers') and needs fairscale (archived upstream)",
}


def check_ddp_backend(backend, what: str) -> None:
    """Raise a ValueError naming ``--ddp-backend`` when ``backend`` is one the plug-in refuses."""
    if backend in REFUSED:
        raise ValueError(f"--ddp-backend {backend} is not supported with {what}: {REFUSED[backend]}. Use "
                         "--ddp-backend pytorch_ddp (fairseq's default on GPUs) or legacy_ddp")
