"""Every criterion of the plug-in averages gradients under DistributedDataParallel (issue 31).

fairseq's default GPU backend (``--ddp-backend pytorch_ddp``) wraps the model as
``ModuleProxyWrapper(DistributedDataParallel(model))``: attribute access falls through to the inner
model, so a criterion that runs ``model.encoder(...)`` computes a gradient that DDP's forward never
saw, and the ranks' gradients are not averaged. ``tests/test_distributed_equality.py`` cannot see
that (legacy_ddp all-reduces after backward whatever the forward did); this test wraps the model
the way pytorch_ddp does, with two gloo ranks on the CPU, and gives each rank a different real
batch. After one backward the gradients must be equal on both ranks and equal to one process's
average over both batches, for every criterion the plug-in registers (and each method's models):
the ranks run ``tests/ddp_gradient_ranks.py``.

The teeth: the two batches' own gradients differ a lot (checked), so a rank that kept its local
gradient is far from the reference -- as ``patient_kd``, ``ghost_distill`` and ``variator_distill``
were before they went through ``model(...)``.
"""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from conftest import REPO, TEACHER, TINY_TRANSFORMER, USER_DIR, clean_env, needs_teacher
from test_distributed_equality import write_slice

B = 3  # sentences per rank
NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]
TEACHER_ARCH = ["--encoder-layers", "3", "--decoder-layers", "3", "--encoder-embed-dim", "256",
                "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024",
                "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--share-all-embeddings"]
TINY_PET = ["--arch", "pet_transformer_iwslt", "--encoder-embed-dim", "32", "--decoder-embed-dim", "24",
            "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-decoder-input-output-embed"]
TINY_CAN = ["--arch", "can_transformer_iwslt", "--encoder-layers", "2", "--decoder-layers", "2",
            "--encoder-embed-dim", "32", "--decoder-embed-dim", "24", "--encoder-ffn-embed-dim", "64",
            "--decoder-ffn-embed-dim", "48", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
            "--share-decoder-input-output-embed"]
TINY_APC = ["--arch", "apc_transformer_iwslt_de_en", *TINY_TRANSFORMER[2:], "--apc-encoder-ffn-dims", "32",
            "--apc-decoder-ffn-dims", "32", "--apc-encoder-attn-dims", "32"]
KD = ["--teacher-path", TEACHER]


def translation_cases():
    ls = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
    ghost = ["--arch", "ghost_transformer_iwslt_de_en", *TEACHER_ARCH, "--ghost-heads", "2", "--ghost-ffn-dim", "256",
             "--criterion", "ghost_distill", *KD]
    variator = ["--task", "variator_translation", "--variator-backbone", TEACHER, "--variator-ratio", "2",
                "--variator-bottleneck", "8", "--arch", "transformer_iwslt_de_en", *TEACHER_ARCH,
                "--criterion", "variator_distill"]
    return {
        "label_smoothed_cross_entropy": [*TINY_TRANSFORMER, *ls],
        "kd": [*TINY_TRANSFORMER, "--criterion", "kd", *KD],
        "patient_kd": [*TINY_TRANSFORMER, "--criterion", "patient_kd", *KD],
        "pet_warmup": [*TINY_PET, "--criterion", "pet_warmup", *KD],
        "pet_warmup_output_layer": [*TINY_PET, "--criterion", "pet_warmup", *KD, "--warmup-mapping", "output-layer"],
        "pet_warmup_projection": [*TINY_PET, "--criterion", "pet_warmup", *KD, "--warmup-mapping", "projection"],
        "pet_kd": [*TINY_PET, "--criterion", "kd", *KD],
        "can_kd": [*TINY_CAN, "--criterion", "kd", *KD],
        "apc_activation_kd": [*TINY_APC, "--criterion", "apc_activation_kd"],
        "ghost_distill": ghost,
        "ghost_distill_with_prediction": [*ghost, "--ghost-lambda-pred", "1"],
        "variator_distill": variator,
        "variator_distill_with_task_loss": [*variator, "--variator-task-weight", "1"],
    }


def sentence_cases(glue):
    tiny = ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
            "--encoder-attention-heads", "4"]
    task = ["--num-classes", "2", "--init-token", "0", "--max-positions", "512", "--shorten-method", "truncate",
            "--find-unused-parameters"]  # fairseq's RoBERTa GLUE recipe: the masked-LM head never trains
    ghost = ["--task", "sentence_prediction", *task, "--arch", "ghost_hf_bert", *tiny, "--ghost-heads", "2",
             "--ghost-ffn-dim", "32", "--criterion", "ghost_distill", "--teacher-path", str(glue["teacher"])]
    variator = ["--task", "variator_sentence_prediction", *task, "--variator-backbone", str(glue["teacher"]),
                "--variator-ratio", "2", "--variator-bottleneck", "8", "--arch", "hf_bert", *tiny,
                "--criterion", "variator_distill"]
    return {
        "glue_sentence_prediction": ["--task", "sentence_prediction", *task, "--arch", "hf_bert", *tiny,
                                     "--criterion", "glue_sentence_prediction", "--glue-task", "RTE"],
        "ghost_distill_sentence": ghost,
        "ghost_distill_sentence_with_prediction": [*ghost, "--ghost-lambda-pred", "1"],
        "variator_distill_sentence": variator,
        "variator_distill_sentence_with_task_loss": [*variator, "--variator-task-weight", "1"],
    }


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(cases, out):
    config = out / "config.json"
    config.write_text(json.dumps({"cases": cases, "batch_size": B, "out": str(out)}))
    env = dict(clean_env(), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS="1")
    worker = os.path.join(REPO, "tests", "ddp_gradient_ranks.py")
    procs = [subprocess.Popen([sys.executable, worker, str(config)], env=dict(env, RANK=str(r)), cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-4000:] for log in logs)
    failures = {}
    for r in range(2):
        failures.update(json.loads((out / f"failures.rank{r}.json").read_text()))
    return failures


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory, request):
    if not os.path.isfile(TEACHER):
        pytest.skip(f"the test teacher at {TEACHER} could not be assembled (tests/conftest.py)")
    root = tmp_path_factory.mktemp("ddp")
    data = write_slice(root / "data-bin", {"train": ("train", 2 * B), "valid": ("valid", 4)})
    common = ["--user-dir", USER_DIR, "-s", "de", "-t", "en", "--seed", "1", "--num-workers", "0", "--cpu",
              *NO_DROPOUT]
    cases = {name: [data, *common, *argv] for name, argv in translation_cases().items()}
    try:
        glue = request.getfixturevalue("tiny_glue_teacher")
    except pytest.skip.Exception:
        glue = None
    if glue is not None:
        cases.update({name: [str(glue["data"]), "--user-dir", USER_DIR, "--seed", "1", "--num-workers", "0", "--cpu",
                             *NO_DROPOUT, *argv] for name, argv in sentence_cases(glue).items()})
    out = root / "grads"
    out.mkdir()
    return {"failures": run_two_ranks(cases, out), "out": out, "cases": cases}


ALL_CASES = [*translation_cases(), *sentence_cases({"teacher": "T"})]


@needs_teacher
@pytest.mark.parametrize("case", ALL_CASES)
def test_ddp_gradients_equal_one_process_on_both_batches(case, ddp_results):
    if case not in ddp_results["cases"]:
        pytest.skip("needs the shared GLUE data for the sentence-prediction teacher")
    assert case not in ddp_results["failures"], ddp_results["failures"][case]
    r0, r1 = (torch.load(ddp_results["out"] / f"{case}.rank{r}.pt", weights_only=True) for r in range(2))
    reference, g0, g1 = r0["reference"], r0["ddp"], r1["ddp"]
    assert reference.keys() == g0.keys() == g1.keys() and reference
    flat = {key: torch.cat([d[k].flatten() for k in sorted(reference)]) for key, d in
            (("ref", reference), ("r0", g0), ("r1", g1), ("ref1", r1["reference"]))}
    scale = flat["ref"].norm()
    assert scale > 0, "no gradient at all: the case tests nothing"
    # both ranks computed the same reference (same model, same batches)
    torch.testing.assert_close(flat["ref1"], flat["ref"], rtol=0, atol=1e-6 * scale)
    # the ranks' losses differ (different batches), their averaged gradients do not
    assert r0["loss"] != r1["loss"]
    torch.testing.assert_close(flat["r0"], flat["r1"], rtol=0, atol=1e-6 * scale)
    spread = r0["local_error"] / scale
    assert spread > 1e-3, f"{case}: the two batches' gradients are too alike ({spread:.3g}) to test anything"
    err = (flat["r0"] - flat["ref"]).norm() / scale
    assert err < min(1e-4, spread / 10), (
        f"{case}: DDP gradient differs from the two-batch average by {err:.3g} (relative; a rank keeping its own "
        f"batch's gradient: {spread:.3g})")
    # every trainable parameter that the reference moves, DDP moves the same way (no bucket left local)
    for k in reference:
        torch.testing.assert_close(g0[k], reference[k], rtol=1e-3, atol=1e-5 * scale, msg=lambda m: f"{k}: {m}")


REFUSED_BACKEND_CASES = ["pet_kd", "can_kd", "apc_activation_kd", "ghost_distill", "variator_distill", "kd",
                         "pet_warmup"]


@needs_teacher
@pytest.mark.parametrize("backend", ["fully_sharded", "slowmo"])
def test_fsdp_and_slowmo_are_refused_naming_the_flag(backend, ddp_results):
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from ddp_gradient_ranks import build

    for case in REFUSED_BACKEND_CASES:
        with pytest.raises(ValueError, match=f"--ddp-backend {backend} is not supported") as info:
            build([*ddp_results["cases"][case], "--ddp-backend", backend])
        assert "pytorch_ddp" in str(info.value), case
    # the sentence-prediction side of the plug-in (hf_bert and what builds on it)
    if "glue_sentence_prediction" in ddp_results["cases"]:
        with pytest.raises(ValueError, match=f"--ddp-backend {backend} is not supported"):
            build([*ddp_results["cases"]["glue_sentence_prediction"], "--ddp-backend", backend])
