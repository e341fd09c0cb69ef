"""The ghost module (GhostBERT, Huang et al., sections 2.1-2.2, eqs 2-5; ablations of section
3.3 / Table 4, Figure 3 / Table 9, section 4.1 / Table 5, Appendix B.4).

A sub-layer's output is a sum over units h (attention heads after O, eq 1; FFN folds after FFN2,
eq 4) of H_h. The ghost module adds F ghost features (eqs 2, 3, 5):

    G_f = ReLU( sum_h conv_{f,h}( H_h ) ),        output = sum_h H_h + sum_f G_f

where conv is a depthwise 1-D convolution over the sequence (DWConv, section 2.2.1), "same"
padding, kernel size k (3), each channel's kernel softmax-normalised over its k taps (section
2.2.2), no bias (the paper omits biases, and its count of 55.3K extra parameters for BERT-base is
exactly 2 modules x 12 layers x 768 channels x 3 taps).

This module is the ghost module after O or after FFN2 (:class:`GhostLinear`) and after FFN1
(:class:`GhostActivation`) (Table 6; ``--ghost-positions``); the positions inside the attention
(after QK, after V) are in ``ghost_attention.py``.

After FFN1 (section 4.2, Figure 4(d): "after the intermediate layer"): the ghost module reads the
intermediate layer's output A = act(X W1 + b1) (GELU in BERT, the model's ``--activation-fn``), after
the activation, and its features are added to it, A + sum_f ReLU(conv_f(A)); fc2 reads that, so its
input width stays the kept d_ff M / N_H. Choices the paper leaves open, and ours:
* Added, not concatenated as new neurons: Table 6 counts After FFN1 at 32M parameters and 2.0G
  FLOPs at m = 1/12, the same as After O / After FFN2; new ghost neurons would need N_H - M more fc2
  columns (as After V needs O unpruned: 39M), i.e. about 58M, or F d_f more (34M, 2.6G).
* One depthwise module over all kept intermediate neurons (``units`` 1), as after O / FFN2 one
  convolution reads the sub-layer's output. Table 6 runs After FFN1 at m = 1/12 only, where M = 1 and
  every reading of eq 2 agrees; for M > 1 the M folds' neurons are concatenated (the H_h of eq 4 are
  summed only after W2), so eq 2's sum over h has no common space to sum in, and the depthwise
  kernel already has its own row for every neuron of every fold: ``--ghost-unshared`` (a module per
  fold) would build the same module, and is refused there, naming the flag.
* The ghost features join A before fairseq's activation dropout (as after O / FFN2 they join the
  sub-layer output before its dropout).

Forms:
* **shared, the default** (section 2.3: F = 1, all G_{f,h} share one set of parameters): by
  linearity sum_h conv(H_h) = conv(sum_h H_h), one convolution of the sub-layer output. This is
  what runs; :meth:`GhostLinear.per_head_output` computes the per-head form with the same
  parameters, and a test proves they agree. With F > 1 each f has its own kernel, shared over h.
* **unshared** (``--ghost-unshared``, Appendix B.4): each (f, h) has its own kernel, applied to
  head h's own output H_h = x_h W_h^T (the output projection split by the columns of head h).

Choices the paper leaves open, and ours:
* The projection's bias belongs to no head; in the per-head form each head carries b / M, so the
  heads still sum to the layer's output (and the two forms agree exactly).
* The ghost features are added to the sub-layer's output before the layer's dropout and residual
  connection (Figure 2 shows them joining the MHA/FFN output).
* Padding: positions marked in the encoder's padding mask are zeroed before convolving (so a
  padding position's value never reaches a real token, and the output does not depend on how
  much padding a batch has: tested), and the ghost feature is zero at padding positions.
* Initialisation (not given): ``xavier_uniform_`` as fairseq's LightweightConv (Wu et al. 2019,
  the paper's source for the softmax-normalised DWConv). A softmax-normalised kernel is a local
  average, so a fresh module adds ReLU(local average of the sub-layer output) to it: the pruned model
  is perturbed before any training (on the MRPC teacher, untrained ghost modules at m = 12/12 take F1
  from 87.50 to 83.11). ``--ghost-zero-init`` (ours, off by default) multiplies each module's features
  by a learnable scalar initialised to 0 (ReZero, Bachlechner et al. 2021), so GhostBERT starts exactly
  as the pruned model and the kernel learns once the scale moves; the trained module is eq 2-5's with
  one scalar per module (G_f = s ReLU(conv_f(.))), for the modules after O, FFN1 and FFN2 (the
  positions inside the attention, after QK / V, generate heads and refuse the flag).
* Even kernel sizes have no centred "same" padding (the paper's index i - ceil((k+1)/2) + m is
  asymmetric for even k); we refuse them, naming ``--ghost-kernel-size``. Figure 3 uses odd sizes.
* Convolution types of Table 5 (section 4.1): ``dwconv`` (ours), ``conv1d_s`` (a full d -> d
  convolution over the sequence; softmax over each output channel's d x k weights), ``conv2d`` (one
  1 -> 1 channel k x k kernel over the (sequence, feature) map; softmax over its k*k taps), and
  ``conv1d_f``: a full convolution over the *feature* direction whose n input and n output channels
  are the sequence positions, ``O[i, c] = sum_j sum_m W[i, j, m] X[j, c - k//2 + m]``, W in
  R^{n x n x k} (section 4.1's equation). The paper's n is the fixed padded length of its inputs
  (128: Table 5's 47M parameters at m = 3/12 are 46M + 2 x 12 x 128^2 x 3); ours is
  ``--ghost-conv1d-f-length`` (default 128). Choices, ours: channel i is the i-th *real* token of the
  sentence (tokens are counted from the first non-padding position, so left or right padding, and
  how much of it, change nothing: tested); a sentence longer than n is refused naming the flag;
  the softmax runs over each output channel's n x k weights (as for Conv1D_S) and the
  convolution is computed on the first L rows/columns of W only, L the batch's longest sentence
  (positions beyond a sentence hold zeros, so this equals the padded-to-n convolution on every
  real token and costs 2 F L^2 k d FLOPs, the paper's count at L = n).
* ``--ghost-no-softmax`` uses the raw kernel (Table 4 "- Softmax"), ``--ghost-no-relu`` the
  identity as the nonlinearity (Table 4 "- ReLU").
"""
import warnings
from dataclasses import asdict, dataclass, replace
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

CONV_TYPES = ("dwconv", "conv1d_s", "conv1d_f", "conv2d")
# Table 6 (section 4.2, Figure 4): after QK / after V (ghost_attention.py), after O / FFN1 / FFN2 (GhostLinear)
POSITIONS = ("qk", "v", "o", "ffn1", "ffn2")
ATTENTION_POSITIONS = ("qk", "v")


class GhostConfigError(ValueError):
    """A ghost-module setting that cannot be built; the message names the flag."""


@dataclass(frozen=True)
class GhostConfig:
    kernel_size: int = 3
    conv: str = "dwconv"
    softmax: bool = True
    relu: bool = True
    features: int = 1
    shared: bool = True
    conv1d_f_length: int = 128
    zero_init: bool = False
    compiled: bool = False  # how the module runs at inference (--ghost-compile), not what it computes

    def __post_init__(self):
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise GhostConfigError(f"--ghost-kernel-size {self.kernel_size}: must be odd and >= 1 "
                                   "(centred 'same' padding; the paper's default is 3)")
        if self.conv not in CONV_TYPES:
            raise GhostConfigError(f"--ghost-conv {self.conv!r}: expected one of {', '.join(CONV_TYPES)}")
        if self.features < 1:
            raise GhostConfigError(f"--ghost-features {self.features}: must be >= 1 (paper: 1)")
        if self.conv1d_f_length < 1:
            raise GhostConfigError(f"--ghost-conv1d-f-length {self.conv1d_f_length}: must be >= 1 (paper: 128)")
        if not self.shared and self.conv != "dwconv":
            raise GhostConfigError(f"--ghost-unshared is implemented for --ghost-conv dwconv only, not {self.conv}")
        if self.compiled and (self.conv != "dwconv" or not self.shared):
            raise GhostConfigError(f"--ghost-compile: the shared --ghost-conv dwconv form only (the paper's), not "
                                   f"{self.conv}{'' if self.shared else ' --ghost-unshared'}")

    def as_dict(self) -> dict:
        return asdict(self)


def normalised_kernel(weight: torch.Tensor, softmax: bool, dims: int = 1) -> torch.Tensor:
    """Softmax over the last ``dims`` dimensions of ``weight`` (the taps of one kernel), in float32."""
    if not softmax:
        return weight
    shape = weight.shape
    flat = weight.float().reshape(*shape[: len(shape) - dims], -1)
    return F.softmax(flat, dim=-1).reshape(shape).to(weight.dtype)


def depthwise_conv_time(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Depthwise convolution over time of ``x`` (T x B x C) with ``kernel`` (C x O x k): output
    (T x B x C x O), ``out[t, b, c, o] = sum_m kernel[c, o, m] * x[t - k//2 + m, b, c]`` with zeros
    outside the sequence (section 2.2.1, for odd k).

    Written as k shifted multiply-adds on the time-first tensor rather than ``F.conv1d(groups=C)``
    (which it equals; tested): on a CPU the grouped convolution, with the transposes it needs, took
    6-8x longer for k = 3 at T = 128, C = 256 than these k passes, as long as a 256 x 256 linear layer.
    """
    kernel = kernel.to(x.dtype)
    k, centre = kernel.size(-1), kernel.size(-1) // 2
    outputs = []
    for o in range(kernel.size(1)):
        out = x * kernel[:, o, centre]
        for m in range(k):
            shift = m - centre  # out[t] += kernel[m] * x[t + shift]
            if shift < 0 and -shift < x.size(0):
                out[-shift:].addcmul_(x[:shift], kernel[:, o, m])
            elif shift > 0 and shift < x.size(0):
                out[:-shift].addcmul_(x[shift:], kernel[:, o, m])
        outputs.append(out)
    return outputs[0].unsqueeze(-1) if len(outputs) == 1 else torch.stack(outputs, dim=-1)


def add_shifted_ghost(y: torch.Tensor, taps: torch.Tensor, relu: bool = True, keep: Optional[torch.Tensor] = None,
                      scratch: Optional[torch.Tensor] = None, scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``y + sum_f act(conv_f(y * keep)) * keep`` for the shared depthwise form: ``y`` time-first (T x B x C),
    ``taps`` the normalised kernel as F x k x C (each tap one contiguous vector over the channels), ``keep``
    (T x B x 1) 0 at padding or None. The same values as GhostConv + GhostLinear._ghost (the reference form,
    tested with its gradients; the multiply-adds run in the same order), in fewer passes over the activations:
    per feature one multiply and k - 1 shifted multiply-adds into one buffer, masking and the ReLU in place
    on it (relu(c) * keep = relu(c * keep), keep being 0 or 1), no reshapes, stacks or sums over singleton
    dimensions; without autograd (inference) the features are added into ``y`` itself, which the callers pass
    fresh (a projection's or an activation's output), and the first feature is computed in ``scratch`` (a
    buffer of y's shape the caller keeps between calls) when given: on a CPU a fresh activation-sized tensor
    costs its page faults, as much as two or three passes over it. ``scale`` (``--ghost-zero-init``) multiplies
    the summed features before they are added."""
    grad = torch.is_grad_enabled() and (y.requires_grad or (torch.is_tensor(taps) and taps.requires_grad))
    if torch.is_tensor(taps):  # (at inference GhostConv.taps gives its vectors, already in the model's dtype)
        taps = taps.to(y.dtype)
    if torch.onnx.is_in_onnx_export():
        return shifted_ghost_graph(y, taps, relu, keep, scale)
    x = y if keep is None else y * keep
    k, T = len(taps[0]), y.size(0)
    centre = k // 2
    features = None
    for f, tap in enumerate(taps):  # one feature f: its k channel vectors
        c = torch.mul(x, tap[centre], out=scratch) if f == 0 and scratch is not None else x * tap[centre]
        for m in range(k):
            shift = m - centre  # c[t] += tap[m] * x[t + shift]
            if shift < 0 and -shift < T:
                c[-shift:].addcmul_(x[:shift], tap[m])
            elif shift > 0 and shift < T:
                c[:-shift].addcmul_(x[shift:], tap[m])
        if keep is not None:
            c.mul_(keep)
        if relu:
            c.relu_()
        features = c if features is None else features + c  # (in place, F > 1 would change the ReLU's saved output)
    if scale is not None:  # --ghost-zero-init
        features = features * scale.to(y.dtype) if grad else features.mul_(scale.to(y.dtype))
    return y + features if grad else y.add_(features)


def shifted_ghost_graph(y: torch.Tensor, taps, relu: bool = True, keep: Optional[torch.Tensor] = None,
                        scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """:func:`add_shifted_ghost` out of place, the form graph exporters trace (torch.onnx): the sequence padded
    once with k // 2 zeros at each end, each tap's shifted slice multiplied and added in the same order (the
    zeros past the ends add exact zeros; equal up to rounding, addcmul_ may fuse its multiply-add). Traced,
    the in-place updates of slices become ONNX ScatterND nodes; in ONNX Runtime this form ran GhostBERT's
    classifier at m = 1/12 in 1.33x pruned-only's time against 1.66x for the in-place one (and 1.58x for a
    grouped Conv between transposes)."""
    x = y if keep is None else y * keep
    k, T = len(taps[0]), y.size(0)
    centre = k // 2
    padded = F.pad(x, (0, 0, 0, 0, centre, centre))
    features = None
    for tap in taps:
        c = x * tap[centre]
        for m in range(k):
            if m != centre:
                c = c + padded[m: m + T] * tap[m]
        if keep is not None:
            c = c * keep
        if relu:
            c = torch.relu(c)
        features = c if features is None else features + c
    if scale is not None:
        features = features * scale.to(y.dtype)
    return y + features


_COMPILED = {}  # "fn": the torch.compile'd shifted_ghost_graph, "failed": why it could not compile
# Below this many activation elements a CPU runs the eager form: a compiled call pays Dynamo's guards and the
# wrapper (tens of microseconds) whatever the size, more than it saves on one short sequence. Measured on the MRPC
# MiniLM encoders (results/archive/deploy_glue.md's git history, 07:14 UTC 2026-11-27): at 1 x 128 x 384
# (49,152 elements) the compiled GhostBERT ran 1.15-1.53x pruned-only's time against 1.11-1.35x eager; at
# 16 x 128 x 384 1.04-1.16x against 1.07-1.45x. CUDA always compiles (on an H100 the MiniLM encoders are launch-
# bound, and the compiled call's overhead lost to the eager form but at fp32, m = 12/12: results/ghost_costs_gpu.md).
COMPILE_MIN_ELEMENTS = 65536


def shifted_ghost_residual_graph(y: torch.Tensor, taps, relu: bool, keep: Optional[torch.Tensor],
                                 scale: Optional[torch.Tensor], residual: torch.Tensor) -> torch.Tensor:
    """``residual + shifted_ghost_graph(y, ...)``: the module's output and the encoder layer's residual add (fairseq's
    ``residual + x``, the same sum) in one expression, which Inductor compiles into one pass."""
    return residual + shifted_ghost_graph(y, taps, relu, keep, scale)


def compiles(y: torch.Tensor) -> bool:
    """Whether :func:`compiled_shifted_ghost` runs the compiled kernel on activations like ``y`` (else None)."""
    return "failed" not in _COMPILED and (y.is_cuda or y.numel() >= COMPILE_MIN_ELEMENTS)


def compiled_shifted_ghost(y: torch.Tensor, taps: torch.Tensor, relu: bool = True,
                           keep: Optional[torch.Tensor] = None, scale: Optional[torch.Tensor] = None,
                           residual: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """:func:`shifted_ghost_graph` compiled by ``torch.compile`` (Inductor: one C++/OpenMP loop on a CPU, one
    Triton kernel on CUDA) with dynamic shapes: the masking, the k shifted multiply-adds, the ReLU, the scale and
    the residual add in one pass over the activations, where the eager form makes k + 3 (``--ghost-compile``,
    inference only). ``taps`` F x k x C. The first call of each kind of shape compiles (seconds; cached on disk by
    Inductor). None where it does not run, and the caller runs the eager form (:func:`add_shifted_ghost`, the same
    values): on a CPU, activations under ``COMPILE_MIN_ELEMENTS``; where it cannot compile (no C++ compiler, an
    unsupported device), after one warning naming the flag. With ``residual`` it returns ``residual`` plus the
    module's output, the encoder layer's residual add in the same pass (:func:`shifted_ghost_residual_graph`)."""
    if not compiles(y):
        return None
    try:
        name = "fn" if residual is None else "fn_residual"
        if name not in _COMPILED:  # built once (torch.compile itself costs a millisecond a call)
            _COMPILED[name] = torch.compile(shifted_ghost_graph if residual is None else shifted_ghost_residual_graph,
                                            dynamic=True)
        if residual is None:
            return _COMPILED[name](y, taps.to(y.dtype), relu, keep, scale)
        return _COMPILED[name](y, taps.to(y.dtype), relu, keep, scale, residual)
    except Exception as e:  # Inductor raises many kinds (BackendCompilerFailed, InvalidCxxCompiler, ...)
        _COMPILED["failed"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        warnings.warn(f"--ghost-compile: torch.compile could not build the ghost module's kernel "
                      f"({_COMPILED['failed'][:300]}); running the eager form (the same values, slower)")
        return None


def compile_ghost_modules(model: nn.Module, on: bool = True) -> nn.Module:
    """Turn ``--ghost-compile`` on (or off) in every ghost module of a loaded ``model`` (e.g. a checkpoint trained
    without it), in place; the same as loading it with ``--model-overrides "{'ghost_compile': True}"``."""
    for module in model.modules():
        if isinstance(module, (GhostLinear, GhostActivation)) and module.cfg.conv == "dwconv" and module.cfg.shared:
            module.cfg = module.ghost.cfg = replace(module.cfg, compiled=on)
    return model


class GhostConv(nn.Module):
    """conv_{f,h} of eq 2 for ``units`` input units (1 in the shared form) of ``channels`` channels,
    F = ``cfg.features`` outputs, before the nonlinearity: input T x B x U x C, output T x B x F x C
    (summed over the units)."""

    def __init__(self, channels: int, units: int, cfg: GhostConfig):
        super().__init__()
        self.cfg, self.channels, self.units = cfg, channels, units
        k, f = cfg.kernel_size, cfg.features
        if cfg.conv == "dwconv":
            self.weight = nn.Parameter(torch.empty(units, f, channels, k))
        elif cfg.conv == "conv1d_s":
            self.weight = nn.Parameter(torch.empty(f, channels, channels, k))
        elif cfg.conv == "conv1d_f":
            n = cfg.conv1d_f_length
            self.weight = nn.Parameter(torch.empty(f, n, n, k))
        else:  # conv2d
            self.weight = nn.Parameter(torch.empty(f, 1, k, k))
        # fairseq's LightweightConv initialisation (the paper gives none)
        nn.init.xavier_uniform_(self.weight.view(-1, 1, k) if cfg.conv == "dwconv" else self.weight)
        # --ghost-zero-init: the branch's features times a learnable scale that starts at 0 (module docstring)
        self.scale = nn.Parameter(torch.zeros(())) if cfg.zero_init else None
        # (a copy of the weight, its taps as vectors, as one tensor) of the last inference call on a CPU (taps())
        self._taps_cache: Optional[tuple] = None
        self._scratch: Optional[torch.Tensor] = None  # add_shifted_ghost's buffer at inference
        self._scratch_view: Optional[torch.Tensor] = None  # ... shaped as the last call's activations

    def taps(self):
        """The shared DWConv's normalised kernel as F x k x C (:func:`add_shifted_ghost`): under autograd one tensor
        through the softmax; without it (inference) nested tuples of its F x k contiguous channel vectors (no
        indexing per call: at batch 1 every PyTorch call counts), made from the weight's current values
        (:meth:`inference_taps`)."""
        if torch.is_grad_enabled() and self.weight.requires_grad:
            return self._normalised_taps()
        return self.inference_taps()[0]

    def taps_tensor(self) -> torch.Tensor:
        """The inference taps of :meth:`taps` as one F x k x C tensor (:func:`compiled_shifted_ghost`)."""
        return self.inference_taps()[1]

    def _normalised_taps(self) -> torch.Tensor:
        if self.cfg.conv != "dwconv" or self.units != 1:
            raise GhostConfigError("taps: the shared --ghost-conv dwconv form only")
        return normalised_kernel(self.weight, self.cfg.softmax)[0].transpose(1, 2)

    def inference_taps(self) -> tuple:
        """(the taps as nested tuples of vectors, as one F x k x C tensor), without autograd, from the weight's
        current values. On a CPU the softmax runs once per weight change, not once per forward: the taps are kept
        with a copy of the weight they were made from, and each call compares the weight with that copy
        (``torch.equal``: 1-5 microseconds for BERT-base's 768 x 3 taps on a loaded 2-core CPU, against a
        forward's milliseconds), recomputing on any difference of values, dtype or device. The values are compared, not a key: fairseq's optimisers write ``p.data``, which
        bumps neither the parameter's ``_version`` nor its storage, so a cache keyed on those (ours until issue
        43) scored every in-training validation after the first on the first one's kernel. On other devices the
        taps are recomputed every call (a softmax and a copy, queued without waiting): comparing would make the
        host wait for the device once per module."""
        weight = self.weight
        cached = self._taps_cache
        on_cpu = weight.device.type == "cpu"
        if (on_cpu and cached is not None and cached[0].dtype == weight.dtype and cached[0].device == weight.device
                and torch.equal(cached[0], weight)):
            return cached[1], cached[2]
        with torch.no_grad():
            taps = self._normalised_taps().contiguous()
            vectors = tuple(tuple(feature.unbind(0)) for feature in taps.unbind(0))
            self._taps_cache = (weight.detach().clone(), vectors, taps) if on_cpu else None
        return vectors, taps

    def scratch(self, like: torch.Tensor) -> torch.Tensor:
        """A buffer of ``like``'s shape kept between inference calls (grown to the largest batch seen; like the
        padding mask the owning layer sets, it makes a module serve one forward at a time)."""
        view = self._scratch_view
        if view is not None and view.shape == like.shape and view.dtype == like.dtype and view.device == like.device:
            return view
        n, buf = like.numel(), self._scratch
        if buf is None or buf.numel() < n or buf.dtype != like.dtype or buf.device != like.device:
            buf = self._scratch = torch.empty(n, dtype=like.dtype, device=like.device)
        self._scratch_view = buf[:n].view(like.shape)
        return self._scratch_view

    def forward(self, x: torch.Tensor, padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x`` zero at padding; ``padding_mask`` (B x T, True at padding) is read by Conv1D_F only,
        whose channels are token positions."""
        T, B, U, C = x.shape
        cfg, k = self.cfg, self.cfg.kernel_size
        if cfg.conv == "dwconv":
            kernel = normalised_kernel(self.weight, cfg.softmax)  # U x F x C x k
            kernel = kernel.permute(0, 2, 1, 3).reshape(U * C, cfg.features, k)
            return depthwise_conv_time(x.reshape(T, B, U * C), kernel).view(T, B, U, C, -1).sum(2).transpose(2, 3)
        x = x.sum(2)  # shared over units (the config refuses unshared for these types)
        if cfg.conv == "conv1d_s":
            kernel = normalised_kernel(self.weight, cfg.softmax, dims=2)  # F x C_out x C_in x k
            y = F.conv1d(x.permute(1, 2, 0), kernel.reshape(-1, C, k).to(x.dtype), padding=k // 2)
            return y.view(B, cfg.features, C, T).permute(3, 0, 1, 2)
        if cfg.conv == "conv1d_f":
            return self._conv1d_f(x, padding_mask)
        kernel = normalised_kernel(self.weight, cfg.softmax, dims=2)  # F x 1 x k x k
        y = F.conv2d(x.permute(1, 0, 2).unsqueeze(1), kernel.to(x.dtype), padding=k // 2)  # B x F x T x C
        return y.permute(2, 0, 1, 3)

    def _conv1d_f(self, x: torch.Tensor, padding_mask: Optional[torch.Tensor]) -> torch.Tensor:
        """Conv1D_F of the time-first ``x`` (T x B x C, zero at padding): tokens are gathered into
        positions 0..L-1 counted from each sentence's first real token, convolved over the feature
        direction with W[:, :L, :L] (softmax taken over all n x k inputs of an output channel) and
        put back; output T x B x F x C."""
        T, B, C = x.shape
        cfg, k, n = self.cfg, self.cfg.kernel_size, self.cfg.conv1d_f_length
        real = torch.ones(B, T, dtype=torch.bool, device=x.device) if padding_mask is None else ~padding_mask
        position = real.long().cumsum(1) - 1  # the i-th real token of its sentence
        L = int(real.sum(1).max())
        if L > n:
            raise GhostConfigError(f"--ghost-conv1d-f-length {n}: a sentence of {L} tokens is longer than the "
                                   "Conv1D_F channels (section 4.1: n input and output channels, one per position)")
        index = torch.where(real, position, L).unsqueeze(-1).expand(B, T, C)  # padding -> a dropped row L
        aligned = x.new_zeros(B, L + 1, C).scatter(1, index, x.transpose(0, 1))[:, :L]  # B x L x C
        kernel = normalised_kernel(self.weight, cfg.softmax, dims=2)[:, :L, :L]  # F x L x L x k
        y = F.conv1d(aligned, kernel.reshape(-1, L, k).to(x.dtype), padding=k // 2)  # B x (F L) x C
        y = y.view(B, cfg.features, L, C)
        back = position.clamp(min=0)[:, None, :, None].expand(B, cfg.features, T, C)
        return y.gather(2, back).permute(2, 0, 1, 3)  # T x B x F x C (padding rows: masked by the caller)

    def parameter_count(self) -> int:
        return self.weight.numel() + (0 if self.scale is None else 1)

    def flops(self, length: int) -> int:
        """FLOPs (2 x multiply-adds) on one sequence of ``length`` tokens (Appendix A.3 convention)."""
        cfg, k, C = self.cfg, self.cfg.kernel_size, self.channels
        per_token = {"dwconv": self.units * C * k, "conv1d_s": C * C * k, "conv2d": C * k * k,
                     "conv1d_f": length * C * k}[cfg.conv]  # Conv1D_F: every token reads all L tokens' windows
        return 2 * length * per_token * cfg.features


class GhostLinear(nn.Linear):
    """An output projection (attention's O, the FFN's fc2) followed by the ghost module of its
    output: ``y = x W^T + b + sum_f ReLU(conv_f(y))`` (eqs 3, 5).

    ``units`` is the number of heads (or folds) the input is made of; only the per-head form uses
    it. ``padding_mask`` (B x T, True at padding) is set by the owning layer before each forward.
    """

    def __init__(self, in_features: int, out_features: int, units: int, cfg: GhostConfig, bias: bool = True):
        super().__init__(in_features, out_features, bias=bias)
        if not cfg.shared and in_features % units:
            raise GhostConfigError(f"{in_features} input features do not split into {units} heads/folds")
        self.units, self.cfg = units, cfg
        self.ghost = GhostConv(out_features, 1 if cfg.shared else units, cfg)
        self.padding_mask: Optional[torch.Tensor] = None
        # --ghost-compile at inference inside an encoder layer (ghost_model.residual_connection): the layer sets
        # ``defer`` for one forward; the module then returns its projection alone and keeps it in ``deferred`` with
        # its padding mask, and the layer's residual add computes the ghost features in the same compiled pass
        self.defer = False
        self.deferred: Optional[tuple] = None

    def _masked(self, y: torch.Tensor) -> torch.Tensor:
        """Zero the padding positions of ``y`` (T x B x ...)."""
        if self.padding_mask is None:
            return y
        keep = (~self.padding_mask).t().to(y.dtype)
        return y * keep.view(*keep.shape, *([1] * (y.dim() - 2)))

    def _ghost(self, conv_out: torch.Tensor) -> torch.Tensor:
        g = F.relu(conv_out) if self.cfg.relu else conv_out
        g = self._masked(g.sum(2))
        return g if self.ghost.scale is None else g * self.ghost.scale.to(g.dtype)

    def per_head_output(self, x: torch.Tensor) -> torch.Tensor:
        """Eq 3 / 5 computed head by head: H_h = x_h W_h^T + b / M, conv_{f,h}(H_h) summed over h."""
        T, B, _ = x.shape
        M = self.units
        heads = torch.einsum("tbmi,omi->tbmo", x.view(T, B, M, -1), self.weight.view(self.out_features, M, -1))
        if self.bias is not None:
            heads = heads + self.bias / M
        ghost_in = self._masked(heads)
        if self.cfg.shared:  # the same conv for every head: apply it per head, then sum
            conv = torch.stack([self.ghost(ghost_in[:, :, h: h + 1], self.padding_mask) for h in range(M)]).sum(0)
        else:
            conv = self.ghost(ghost_in, self.padding_mask)
        return heads.sum(2) + self._ghost(conv)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3:
            raise ValueError("ghost modules expect time-first input (T x B x C), as fairseq's encoder layers pass")
        if not self.cfg.shared:
            return self.per_head_output(x)
        return self._add_ghost(super().forward(x))

    def _add_ghost(self, y: torch.Tensor) -> torch.Tensor:
        """``y`` plus its ghost features (shared form): the depthwise convolution by :func:`add_shifted_ghost`,
        the other convolution types by GhostConv (the reference form, ``_ghost(ghost(_masked(y)))``)."""
        if self.cfg.conv == "dwconv":
            keep = None if self.padding_mask is None else (~self.padding_mask).t().unsqueeze(-1).to(y.dtype)
            inference = not (torch.is_grad_enabled() and (y.requires_grad or self.ghost.weight.requires_grad))
            if inference and self.cfg.compiled and not torch.onnx.is_in_onnx_export():
                if self.defer and compiles(y):
                    self.deferred = (y, keep)
                    return y
                out = compiled_shifted_ghost(y, self.ghost.taps_tensor(), self.cfg.relu, keep, self.ghost.scale)
                if out is not None:
                    return out
            return add_shifted_ghost(y, self.ghost.taps(), self.cfg.relu, keep,
                                     self.ghost.scratch(y) if inference else None, self.ghost.scale)
        return y + self._ghost(self.ghost(self._masked(y).unsqueeze(2), self.padding_mask))

    def add_deferred(self, x: torch.Tensor, residual: torch.Tensor) -> Optional[torch.Tensor]:
        """``residual`` plus this module's whole output where ``x`` is the projection it deferred (the same tensor,
        as an inference dropout passes it on), the ghost features and the add in one compiled pass; else None."""
        if self.deferred is None or x is not self.deferred[0]:
            return None
        y, keep = self.deferred
        self.deferred = None
        out = compiled_shifted_ghost(y, self.ghost.taps_tensor(), self.cfg.relu, keep, self.ghost.scale, residual)
        if out is None:  # the build failed after the deferral: the eager form, then the add
            out = residual + add_shifted_ghost(y, self.ghost.taps(), self.cfg.relu, keep, None, self.ghost.scale)
        return out

    def ghost_parameter_count(self) -> int:
        return self.ghost.parameter_count()

    def ghost_flops(self, length: int) -> int:
        return self.ghost.flops(length)


class GhostActivation(nn.Module):
    """The FFN's activation followed by the ghost module of the intermediate layer after FFN1 (section 4.2,
    Figure 4(d); see the module docstring): ``A = act(z)``, ``A + sum_f ReLU(conv_f(A))`` with z = X W1 + b1.
    It replaces an encoder layer's ``activation_fn``, so fc1 and fc2 stay fairseq's Linear layers.
    ``padding_mask`` (B x T, True at padding) is set by the owning layer before each forward."""

    def __init__(self, activation_fn, channels: int, cfg: GhostConfig):
        super().__init__()
        if not cfg.shared:
            raise GhostConfigError("--ghost-unshared with --ghost-positions ffn1: after FFN1 the folds' neurons are "
                                   "concatenated, not summed (eq 4), and the depthwise module already has its own "
                                   "kernel for every neuron of every fold; a module per fold would be the same one")
        self.activation_fn, self.cfg = activation_fn, cfg
        self.ghost = GhostConv(channels, 1, cfg)
        self.padding_mask: Optional[torch.Tensor] = None
        self.defer = False  # (no residual add follows FFN1's activation: never deferred)

    # zero padding before the convolution, the nonlinearity, zero ghost features at padding, the counts:
    # the same as after O / FFN2
    _masked, _ghost, _add_ghost = GhostLinear._masked, GhostLinear._ghost, GhostLinear._add_ghost
    ghost_parameter_count, ghost_flops = GhostLinear.ghost_parameter_count, GhostLinear.ghost_flops

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if z.dim() != 3:
            raise ValueError("ghost modules expect time-first input (T x B x C), as fairseq's encoder layers pass")
        return self._add_ghost(self.activation_fn(z))

    def extra_repr(self) -> str:
        return f"activation_fn={getattr(self.activation_fn, '__name__', self.activation_fn)}"


def flops_outside_torch_counter(model: nn.Module, length: int) -> int:
    """FLOPs of the DWConv ghost modules of ``model`` (after O / FFN1 / FFN2 and after V) on one
    sequence of ``length`` tokens: computed as shifted multiply-adds (:func:`depthwise_conv_time`),
    which ``torch.utils.flop_counter`` does not count (it counts matrix products and convolutions:
    the other conv types). Add it to the counter's total for the model's FLOPs."""
    return sum(m.flops(length) for m in model.modules() if isinstance(m, GhostConv) and m.cfg.conv == "dwconv")
