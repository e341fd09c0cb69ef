"""Patient-KD in its authors' units (Sun et al. 2019; their code: ``F.mse_loss`` of L2-normalised states of the
intermediate layers): the hidden-state loss on hand-built tensors, the paper's layer maps, and a real
``fairseq-train --criterion patient_kd`` run whose hidden term is a modest part of the loss."""
import math
import os
import re

import pytest
import torch
import torch.nn.functional as F

from conftest import OPTIM_FLAGS, TEACHER, TEACHER_DIR, USER_DIR, needs_teacher, run_cli

import user_dir  # noqa: F401
from user_dir.baselines.patient_kd_criterion import (PatientKDConfigError, PatientKDCriterion, normalized_layer_mse,
                                                     parse_layer_map, patience_loss)


def _states(*layers):
    """fairseq's list of states (T x B x C) from per-layer B x T x C lists."""
    return [torch.tensor(layer, dtype=torch.float).transpose(0, 1) for layer in layers]


def test_hidden_loss_is_mse_of_normalised_intermediate_states_by_hand():
    # batch of 2 sentences x 2 positions x width 2; sentence 2's second position is padding
    pad = torch.tensor([[False, False], [False, True]])
    far = [[1.0, 0.0], [1.0, 0.0]]  # where the student sits far from the teacher: would count if matched
    student = _states(
        [far, far],                                  # embeddings (layer 0): never matched
        [[[3, 4], [3, 4]], [[0, 5], [1, 0]]],        # layer 1 (its padding position far from the teacher's)
        [[[0, 2], [0, 2]], [[0, 2], [1, 0]]],        # layer 2
        [far, far])                                  # layer 3, the student's last: left to the KD loss
    neg = [[-1.0, 0.0], [-1.0, 0.0]]
    teacher = _states(neg, neg,
                      [[[1, 0], [0, 1]], [[0, 1], [-1, 0]]],   # layer 2 <- student layer 1
                      neg,
                      [[[3, 0], [3, 0]], [[3, 0], [-1, 0]]],   # layer 4 <- student layer 2
                      neg, neg)                                 # layer 6, the teacher's last
    layer_map = parse_layer_map("skip", 3, 6, "--pkd-encoder-map")
    assert layer_map == [(1, 2), (2, 4)]  # PKD-Skip: student layer i <- teacher layer 2i, the last layers excluded
    pairs = PatientKDCriterion._layer_pairs(student, teacher, layer_map, None, pad)

    # by hand, over the 3 real positions x 2 hidden units of each pair:
    # pair (1, 2): [3,4]/5 = [.6,.8] against [1,0] -> .16 + .64 = .8; against [0,1] -> .36 + .04 = .4;
    #              [0,5]/5 = [0,1] against [0,1] -> 0; mean over 6 numbers: 1.2 / 6 = .2
    # pair (2, 4): [0,1] against [1,0] at each real position -> 2 each; mean: 6 / 6 = 1
    # L_PT = the mean over the pairs (the authors' F.mse_loss averages over layers): (.2 + 1) / 2 = .6
    assert patience_loss(pairs).item() == pytest.approx(0.6, abs=1e-6)

    # the authors' formulation: one F.mse_loss over batch x matched layers x hidden units of normalised states
    keep = ~pad
    s_stack = torch.stack([student[1].transpose(0, 1)[keep], student[2].transpose(0, 1)[keep]], dim=1)
    t_stack = torch.stack([teacher[2].transpose(0, 1)[keep], teacher[4].transpose(0, 1)[keep]], dim=1)
    authors = F.mse_loss(F.normalize(t_stack, p=2, dim=2), F.normalize(s_stack, p=2, dim=2))
    assert patience_loss(pairs).item() == pytest.approx(authors.item(), abs=1e-6)

    # pairs of other lengths (a decoder side: 1 real position of 2) count once each in the mean, as layers do
    dec_pad = torch.tensor([[False, True]])
    dec = (torch.tensor([[[1.0, 0.0], [5.0, 5.0]]]), torch.tensor([[[0.0, 1.0], [-5.0, 5.0]]]), dec_pad)  # 2 / 2 = 1
    assert patience_loss(pairs + [dec]).item() == pytest.approx((0.2 + 1.0 + 1.0) / 3, abs=1e-6)
    with pytest.raises(ValueError, match="at least one"):
        patience_loss([])
    assert normalized_layer_mse(*dec[:2], torch.tensor([[True, True]])).item() == 0  # all padding: 0, not NaN


def test_layer_maps_are_the_papers_and_never_the_last_layer():
    # the paper's 6-layer student of BERT-base (12 layers): PKD-Skip {2,4,6,8,10}, PKD-Last {7,...,11}
    assert parse_layer_map("skip", 6, 12, "--pkd-encoder-map") == [(1, 2), (2, 4), (3, 6), (4, 8), (5, 10)]
    assert parse_layer_map("last", 6, 12, "--pkd-encoder-map") == [(1, 7), (2, 8), (3, 9), (4, 10), (5, 11)]
    # its 3-layer student: skip {4, 8}, last {10, 11} (the authors' scripts: 0-based '9,10')
    assert parse_layer_map("skip", 3, 12, "--pkd-encoder-map") == [(1, 4), (2, 8)]
    assert parse_layer_map("last", 3, 12, "--pkd-encoder-map") == [(1, 10), (2, 11)]
    assert parse_layer_map("skip", 1, 3, "--pkd-encoder-map") == []  # one layer: nothing intermediate
    with pytest.raises(PatientKDConfigError, match=r"--pkd-decoder-map '1:6': teacher layer 6 is the teacher's last"):
        parse_layer_map("1:6", 2, 6, "--pkd-decoder-map")
    with pytest.raises(PatientKDConfigError, match=r"--pkd-encoder-map '2:3': student layer 2 is the student's last"):
        parse_layer_map("2:3", 2, 6, "--pkd-encoder-map")


# the benchmark's plain 2+2 student at PET's widths (scripts/bench/translation_students.plain_arch(128, 96)),
# narrower than the 256-wide teacher
STUDENT = ["--arch", "transformer_iwslt_de_en", "--encoder-layers", "2", "--decoder-layers", "2",
           "--encoder-embed-dim", "128", "--decoder-embed-dim", "96", "--encoder-ffn-embed-dim", "256",
           "--decoder-ffn-embed-dim", "192", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
           "--share-decoder-input-output-embed"]
TRAIN_INNER = re.compile(r"\| train_inner \|.*? loss=([\d.]+),.*?pkd_loss=([\d.]+)")


@needs_teacher
def test_fairseq_train_hidden_term_is_a_modest_share_and_the_student_trains(tmp_path):
    data = os.path.join(TEACHER_DIR, "data-bin")
    train = run_cli("fairseq_cli.train", data, "--user-dir", USER_DIR, *STUDENT, *OPTIM_FLAGS, "--cpu",
                    "--criterion", "patient_kd", "--teacher-path", TEACHER, "--label-smoothing", "0.1",
                    "--max-update", "6", "--disable-validation", "--no-epoch-checkpoints", "--save-dir", tmp_path)
    logged = [(float(loss), float(pkd)) for loss, pkd in TRAIN_INNER.findall(train.stdout + train.stderr)]
    assert len(logged) == 6, train.stdout[-3000:]
    beta = 100.0  # the default (--pkd-beta): PKD's grid, see the criterion's docstring
    # loss is logged in bits per target token, pkd_loss is L_PT in nats: the hidden term's share of the first loss
    loss0, pkd0 = logged[0]
    share = beta * pkd0 / (loss0 * math.log(2))
    # on the untrained student the hidden term is a modest part of the loss (it was about nine tenths in the old,
    # summed units); L_PT itself is near 2/256 (unrelated unit vectors of the teacher's width differ by 2 in
    # squared distance), the authors' scale rather than a sum over positions and layers
    assert 0.01 < share < 0.25, (share, logged)
    assert 0.5 * 2 / 256 < pkd0 < 2 * 2 / 256, logged
    # it trains: losses finite, the last update's loss below the first's, and the width maps learned
    assert all(math.isfinite(loss) and math.isfinite(pkd) for loss, pkd in logged)
    assert logged[-1][0] < logged[0][0], logged
    ckpt = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert ckpt["criterion"]["encoder_proj.weight"].shape == (256, 128)
    assert ckpt["criterion"]["decoder_proj.weight"].shape == (256, 96)
    assert ckpt["cfg"]["criterion"]["pkd_beta"] == beta
