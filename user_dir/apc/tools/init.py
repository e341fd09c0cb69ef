"""Initialise an APC-compressed model from a trained fairseq ``transformer`` (translation) or ``hf_bert``
encoder (GLUE, ``--task sentence_prediction``), the teacher, and write it as an ``apc_transformer`` /
``apc_hf_bert`` checkpoint (APC paper, section 4.2, Appendix C).

    python -m user_dir.apc.tools.init TEACHER.pt --data DATA-BIN --encoder-ffn-dims 256 \
        --decoder-ffn-dims 256 --init neuron-pruning --out init.pt
    python -m user_dir.apc.tools.init GLUE-TEACHER.pt --data RTE.wordpiece \
        --encoder-ffn-dims 1:128,2:128,3:128,4:128,5:128 --out init.pt     # an APC-50-ff analogue

The checkpoint holds the teacher's weights (frozen ``W`` of the compressed layers) and APC's ``U, D``
from the chosen initialisation, ``--init``, for every compression: FFN, attention and embedding
(``b_U, b_D, B = 0``). ``init.json`` beside it lists the ``fairseq_flags`` that build the same model in
``fairseq-train`` (train it with ``--finetune-from-model init.pt``, which also makes the run resumable)
and each layer's reconstruction error (eq. 4) on sampled validation activations. Data-driven
initialisations use ``--samples`` token activations of the training split (paper: 5,000); neuron
pruning scores FFN neurons (and attention head dimensions, hidden dimensions) on
``--importance-batches`` training batches (neuron_sensitivity.py: the translation NLL, or the
sentence task's cross-entropy).
"""
import argparse
import copy
import json
import logging
import os
import shlex
import sys

import torch

import user_dir  # noqa: F401  registers apc_transformer, allows loading fairseq checkpoints
from fairseq import checkpoint_utils
from omegaconf import OmegaConf
from user_dir.apc.activation_sampling import (collect_activations, collect_attention_inputs, collect_ffn_inputs,
                                              ffn_layers, sample_batches)
from user_dir.apc.attention_compression import SAMPLED_INITIALISATIONS, init_attention as init_one_attention
from user_dir.apc.embedding_compression import init_embedding_run, reading_projections
from user_dir.common.model_flags import architecture_flags
from user_dir.apc.initialisations import INITIALISATIONS, initialise
from user_dir.apc.neuron_sensitivity import attention_sensitivity, hidden_sensitivity, neuron_sensitivity
from user_dir.apc.reconstruction_error import ffn_reconstruction_error

logger = logging.getLogger("apc_init")

# the APC architecture of each teacher model type
APC_ARCH = {"TransformerModel": "apc_transformer", "HFBertModel": "apc_hf_bert"}
# flags only a model with a decoder has
DECODER_DIMS = ("decoder_ffn_dims", "decoder_attn_dims", "cross_attn_dims", "decoder_embed_dims")
# structural fields of a fairseq transformer that the fairseq-train command repeats explicitly (scripts/bench/bench_apc.py
# rewrites the FFN widths of this list for the finalized stock model)
_FLAG_FIELDS = [
    "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_layers", "encoder_attention_heads",
    "decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_layers", "decoder_attention_heads",
    "decoder_output_dim", "activation_fn", "max_source_positions", "max_target_positions",
]
_BOOL_FIELDS = [
    "encoder_normalize_before", "decoder_normalize_before", "encoder_learned_pos", "decoder_learned_pos",
    "share_all_embeddings", "share_decoder_input_output_embed", "no_scale_embedding", "layernorm_embedding",
    "no_token_positional_embeddings", "cross_self_attention",
]


def load_teacher(path: str, data: str):
    if not os.path.isfile(path):
        raise SystemExit(f"apc_init: teacher checkpoint {path}: no such file")
    if not os.path.isdir(data):
        raise SystemExit(f"apc_init: --data {data}: no such directory")
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data})
    teacher = models[0]
    if type(teacher).__name__ not in APC_ARCH:
        raise SystemExit(f"apc_init: {path} is a {type(teacher).__name__}; APC here compresses a stock fairseq "
                         "transformer or an imported hf_bert encoder")
    return teacher, cfg, task


def apc_args(teacher_args, encoder_ffn_dims, decoder_ffn_dims, train_original=False, encoder_attn_dims=None,
             decoder_attn_dims=None, cross_attn_dims=None, model_type="TransformerModel", encoder_embed_dims=None,
             decoder_embed_dims=None):
    """The teacher's model arguments turned into those of its APC architecture (``APC_ARCH``).

    A checkpoint whose ``cfg["model"]`` is a plain dict (as ``scripts/maint/ship_checkpoint.py`` writes the shipped
    teacher) loads as a DictConfig, whose extra keys fairseq's ``TransformerConfig.from_namespace`` drops: the
    APC fields would be lost and the model built uncompressed. The arguments become an ``argparse.Namespace``
    first, as fairseq-train's own checkpoints hold them."""
    if OmegaConf.is_config(teacher_args) or isinstance(teacher_args, dict):
        container = OmegaConf.to_container(teacher_args, resolve=True) if OmegaConf.is_config(teacher_args) \
            else dict(teacher_args)
        teacher_args = argparse.Namespace(**container)
    args = copy.deepcopy(teacher_args)
    base = APC_ARCH[model_type]
    args.arch = args._name = base  # the model args are complete: the named variants' defaults add nothing
    args.apc_encoder_ffn_dims, args.apc_encoder_attn_dims = encoder_ffn_dims, encoder_attn_dims
    args.apc_encoder_embed_dims = encoder_embed_dims
    if base == "apc_transformer":
        args.apc_decoder_ffn_dims = decoder_ffn_dims
        args.apc_decoder_attn_dims, args.apc_cross_attn_dims = decoder_attn_dims, cross_attn_dims
        args.apc_decoder_embed_dims = decoder_embed_dims
    args.apc_train_original, args.apc_finalized = train_original, False
    return args


def fairseq_flags(args) -> list:
    """Flags that make fairseq-train build ``args``'s model (with --user-dir): for ``apc_transformer`` every
    structural field spelled out (``--arch apc_transformer``); for an encoder, the flags that differ from
    its architecture's defaults (common/model_flags.py)."""
    if not args.arch.startswith("apc_transformer"):
        return architecture_flags(args)
    flags = ["--arch", "apc_transformer"]
    for f in _FLAG_FIELDS:
        if getattr(args, f, None) is not None:
            flags += ["--" + f.replace("_", "-"), str(getattr(args, f))]
    flags += ["--" + f.replace("_", "-") for f in _BOOL_FIELDS if getattr(args, f, False)]
    for name in ("encoder_ffn_dims", "decoder_ffn_dims", "encoder_attn_dims", "decoder_attn_dims", "cross_attn_dims",
                 "encoder_embed_dims", "decoder_embed_dims"):
        spec = getattr(args, f"apc_{name}", None)
        if spec:
            flags += ["--apc-" + name.replace("_", "-"), str(spec)]
    if getattr(args, "apc_train_original", False):
        flags.append("--apc-train-original")
    return flags


def sample_activations(teacher, task, split: str, samples: int, seed: int, max_tokens: int):
    pad = task.source_dictionary.pad()
    return collect_ffn_inputs(teacher, sample_batches(task, split, max_tokens, seed), samples, pad, seed)


def initial_D_U(model, teacher, task, method: str, samples: int, seed: int, importance_batches: int,
                max_tokens: int, X=None, scores=None):
    """``{layer name: (D, U)}`` for every compressed layer of ``model``. ``X``/``scores`` may be passed in
    (so a comparison of initialisations samples once)."""
    if method in ("reconstructive-random", "reconstructive-svd") and X is None:
        X = sample_activations(teacher, task, "train", samples, seed, max_tokens)
    if method == "neuron-pruning" and scores is None:
        scores = neuron_sensitivity(teacher, sample_batches(task, "train", max_tokens, seed),
                                    task.source_dictionary.pad(), importance_batches)
    out = {}
    for name, layer in model.apc_layers():
        fc1 = layer.fc1.linear
        out[name] = initialise(method, fc1.weight, fc1.bias, layer.fc1.out_features, layer.activation_fn,
                               X=None if X is None else X[name], scores=None if scores is None else scores[name],
                               seed=seed)
    return out


@torch.no_grad()
def set_D_U(model, inits) -> None:
    for name, layer in model.apc_layers():
        D, U = inits[name]
        layer.fc1.reset_compression_parameters()
        layer.fc2.reset_compression_parameters()
        layer.fc1.D.copy_(D)
        layer.fc2.U.copy_(U)


def reconstruction_errors(model, X) -> dict:
    """Eq. 4 per compressed FFN on the teacher's activations ``X`` (``{layer: n x embed}``). In an
    embedding-compressed block ``B^alpha`` reads the compressed input, which ``X`` is not: it is left out
    (it is zero after every initialisation)."""
    return {name: ffn_reconstruction_error(X[name], layer.fc1.linear.weight, layer.fc1.linear.bias, layer.fc1.D,
                                           layer.fc2.U, layer.activation_fn, layer.fc1.b_D, layer.fc2.b_U,
                                           layer.fc1.B if layer.fc1.U is None else None)
            for name, layer in model.apc_layers()}


def init_attention(model, teacher, task, samples: int, seed: int, max_tokens: int, method: str = "reconstructive-svd",
                   importance_batches: int = 20) -> None:
    """Initialise every compressed attention (encoder and decoder self-attention, encoder-decoder attention) by
    ``method`` (attention_compression.py): the reconstructive ones on the teacher's inputs to them (eq. 11 /
    eq. 9), neuron-pruning on the teacher's query/key and value dimension sensitivities."""
    layers = model.apc_attention_layers()
    if not layers:
        return
    names = [name for name, _ in layers]
    pad = task.source_dictionary.pad()
    inputs = scores = None
    if method in SAMPLED_INITIALISATIONS:
        inputs = collect_attention_inputs(teacher, sample_batches(task, "train", max_tokens, seed), samples, pad, names)
    if method == "neuron-pruning":
        scores = attention_sensitivity(teacher, sample_batches(task, "train", max_tokens, seed), pad,
                                       importance_batches, names)
    for name, attn in layers:
        queries, keys = inputs[name] if inputs is not None else (None, None)
        causal = name.startswith("decoder.") and name.endswith("self_attn")
        init_one_attention(attn, method, queries, keys, causal=causal, scores=None if scores is None else scores[name],
                           seed=seed)


def init_embedding(model, teacher, task, method: str, samples: int, seed: int, importance_batches: int,
                   max_tokens: int) -> None:
    """Initialise every run of embedding-compressed blocks (embedding_compression.py) from the teacher, by
    ``method``; run after the FFN and attention initialisations."""
    runs = model.apc_embedding_runs()
    if not runs:
        return
    teacher_layers, student_layers = ffn_layers(teacher), ffn_layers(model)
    # per block, the keys of its reading projections and the teacher module whose input each U is fitted on
    keys = {name: list(reading_projections(teacher_layers[name])) for run in runs for name in run}

    def module_of(name, key):
        return f"{name}.{key}"  # fc1, or the attention (whose query its q_proj reads)
    X = scores = None
    if method in ("reconstructive-random", "reconstructive-svd"):
        X = collect_activations(teacher, sample_batches(task, "train", max_tokens, seed), samples,
                                task.source_dictionary.pad(), seed=seed, outputs=[run[-1] for run in runs],
                                inputs=[module_of(n, k) for n, ks in keys.items() for k in ks])
    if method == "neuron-pruning":
        scores = hidden_sensitivity(teacher, sample_batches(task, "train", max_tokens, seed),
                                    task.source_dictionary.pad(), importance_batches)
    for run in runs:
        blocks = None if X is None else [{k: X[module_of(n, k)] for k in keys[n]} for n in run]
        init_embedding_run(method, [student_layers[n] for n in run], [teacher_layers[n] for n in run], blocks,
                           None if X is None else X[run[-1]],
                           None if scores is None else sum(scores[n] for n in run), seed)


def build_apc_model(teacher, cfg, task, encoder_ffn_dims, decoder_ffn_dims, encoder_attn_dims=None,
                    decoder_attn_dims=None, cross_attn_dims=None, encoder_embed_dims=None, decoder_embed_dims=None):
    model_type = type(teacher).__name__
    decoder_dims = (decoder_ffn_dims, decoder_attn_dims, cross_attn_dims, decoder_embed_dims)
    if model_type != "TransformerModel" and any(decoder_dims):
        flags = [f"--{n.replace('_', '-')}" for n, v in zip(DECODER_DIMS, decoder_dims) if v]
        raise SystemExit(f"apc_init: {' '.join(flags)}: the teacher is an encoder ({model_type}), it has no decoder")
    args = apc_args(cfg.model, encoder_ffn_dims, decoder_ffn_dims, encoder_attn_dims=encoder_attn_dims,
                    decoder_attn_dims=decoder_attn_dims, cross_attn_dims=cross_attn_dims, model_type=model_type,
                    encoder_embed_dims=encoder_embed_dims, decoder_embed_dims=decoder_embed_dims)
    model = task.build_model(args)  # a sentence task adds its classification head here
    model.load_uncompressed_state(teacher.state_dict())
    return model, args


def save_apc_checkpoint(teacher_path: str, model, args, out: str, extra: dict) -> None:
    state = torch.load(teacher_path, map_location="cpu")
    state["cfg"]["model"] = args
    state["args"] = None
    state["model"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state.setdefault("extra_state", {})["apc"] = extra
    state["last_optimizer_state"] = None
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, out)


def add_common_args(p):
    p.add_argument("teacher", help="fairseq transformer checkpoint to compress")
    p.add_argument("--data", required=True, help="binarised data directory of the teacher's task")
    p.add_argument("--encoder-ffn-dims", default=None, help="cmp^f of the encoder FFNs: SIZE or LAYER:SIZE,... "
                   "(as --apc-encoder-ffn-dims)")
    p.add_argument("--decoder-ffn-dims", default=None, help="cmp^f of the decoder FFNs (as --apc-decoder-ffn-dims)")
    p.add_argument("--encoder-attn-dims", default=None, help="cmp^a of the encoder self-attentions (as "
                   "--apc-encoder-attn-dims); initialised by --init per head (attention_compression.py; "
                   "reconstructive-svd: eq. 11's closed form for D^Q, D^K and eq. 9 for D^V, U^O)")
    p.add_argument("--decoder-attn-dims", default=None, help="cmp^a of the decoder self-attentions (as "
                   "--apc-decoder-attn-dims); initialised as --encoder-attn-dims, head outputs with the causal mask")
    p.add_argument("--cross-attn-dims", default=None, help="cmp^a of the decoder's encoder-decoder attentions (as "
                   "--apc-cross-attn-dims); eq. 11 on decoder queries and encoder keys")
    p.add_argument("--encoder-embed-dims", default=None, help="cmp^e of the encoder blocks (as "
                   "--apc-encoder-embed-dims); initialised by --init per run of equal sizes (embedding_compression.py)")
    p.add_argument("--decoder-embed-dims", default=None, help="cmp^e of the decoder blocks (as "
                   "--apc-decoder-embed-dims)")
    p.add_argument("--samples", type=int, default=5000,
                   help="token activations for the least-squares U (paper section 4.2: 5000)")
    p.add_argument("--importance-batches", type=int, default=20,
                   help="training batches scoring neuron (FFN), head-dimension (attention) and hidden-dimension "
                        "(embedding) sensitivity for --init neuron-pruning (the paper does not say; default 20)")
    p.add_argument("--max-tokens", type=int, default=2048, help="tokens per batch when sampling (default 2048)")
    p.add_argument("--seed", type=int, default=1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--init", choices=INITIALISATIONS, default="neuron-pruning",
                   help="APC initialisation of every compression: FFN, attention (per head: D^Q/D^K and D^V/U^O "
                        "pairs, as the paper's Tables 6-8 apply all five to its attention-compressed "
                        "architectures) and embedding (section 4.2; default neuron-pruning, the best after 100 "
                        "steps in the paper's Table 1)")
    p.add_argument("--out", required=True, help="where to write the apc_transformer checkpoint")
    a = p.parse_args(argv)
    if a.samples <= 0:
        p.error(f"--samples {a.samples}: must be > 0")
    dims = (a.encoder_ffn_dims, a.decoder_ffn_dims, a.encoder_attn_dims, a.decoder_attn_dims, a.cross_attn_dims,
            a.encoder_embed_dims, a.decoder_embed_dims)
    if not any(dims):
        p.error("give --encoder-ffn-dims, --decoder-ffn-dims, --encoder-attn-dims, --decoder-attn-dims, "
                "--cross-attn-dims, --encoder-embed-dims and/or --decoder-embed-dims: nothing would be compressed")
    torch.manual_seed(a.seed)
    teacher, cfg, task = load_teacher(a.teacher, a.data)
    model, args = build_apc_model(teacher, cfg, task, *dims)
    set_D_U(model, initial_D_U(model, teacher, task, a.init, a.samples, a.seed, a.importance_batches, a.max_tokens))
    init_attention(model, teacher, task, a.samples, a.seed, a.max_tokens, a.init, a.importance_batches)
    init_embedding(model, teacher, task, a.init, a.samples, a.seed, a.importance_batches, a.max_tokens)
    X_valid = sample_activations(teacher, task, "valid", a.samples, a.seed, a.max_tokens)
    errors = reconstruction_errors(model, X_valid)
    info = {"teacher": os.path.abspath(a.teacher), "init": a.init, "samples": a.samples, "seed": a.seed,
            "importance_batches": a.importance_batches, "reconstruction_error_valid": errors,
            "fairseq_flags": fairseq_flags(args)}
    save_apc_checkpoint(a.teacher, model, args, a.out, info)
    with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
        json.dump(info, f, indent=1)
    for name, err in errors.items():
        print(f"{name}\treconstruction error (eq. 4, valid) {err:.4f}")
    print(f"train with: fairseq-train DATA --user-dir user_dir $(fc-flags {shlex.quote(a.out)}) "
          f"--finetune-from-model {shlex.quote(a.out)} and the task, criterion and optimiser flags "
          "(scripts/recipes/apc.sh has them)")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    main()
