"""scripts/recipes/: each method's recipe end to end on a SMOKE budget -- on the shipped Multi30k teacher and a slice
of the embedded Multi30k, and on a tiny GLUE teacher (a recipe's resuming and refusing: tests/test_grid.py, on pet.sh's
work folder); the GPU reproductions are checked by a dry run whose every fairseq-train line must parse
with fairseq's own parser.

The SMOKE runs start together, two at a time (the machine's two cores), and each test reads its own run; the GLUE GPU
reproductions' dry runs take the flags of the checkpoints they would write from the same stages of the GLUE runs."""
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import REPO, USER_DIR, clean_env
from test_checkpoint_flags import TEACHER, shipped_data  # noqa: F401  (shipped_data: a session fixture)
from test_checkpoint_flags import flags_of as flags  # fc-flags, in this process

RECIPES = os.path.join(REPO, "scripts", "recipes")
CPU_RECIPES = ("pet", "ghostbert", "apc", "variator")
GPU_RECIPES = ("ghostbert_glue_gpu", "apc_glue_gpu", "variator_glue_gpu")


def env(**variables):
    e = clean_env()
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e["PATH"]  # fairseq-train of this Python
    e.update(OMP_NUM_THREADS="1", PYTHON=sys.executable, **{k: str(v) for k, v in variables.items()})
    for name in ("SMOKE", "DRY_RUN", "TEACHER", "DATA", "GLUE_TASK", "TEACHERS", "HF_MODEL", "GLUE_DIR"):
        if name not in variables:
            e.pop(name, None)
    return e


def bash(script, work, timeout=900, **variables):
    started = time.time()
    proc = subprocess.run(["bash", script, str(work)], capture_output=True, text=True, env=env(**variables),
                          timeout=timeout, cwd=REPO)
    return {"out": proc.stdout + proc.stderr, "stdout": proc.stdout, "rc": proc.returncode, "work": str(work),
            "seconds": time.time() - started}


def score_line(run):
    assert run["rc"] == 0, run["out"][-6000:]
    lines = [line for line in run["stdout"].splitlines() if line.startswith("score: ")]
    assert len(lines) == 1, run["out"][-3000:]
    return lines[0]


def rendered_score_line(run):
    """The score line scripts/experiments/render.py makes of the run's record (a method page's quickstart, from the
    store): the line the recipe printed."""
    import json

    sys.path.insert(0, os.path.join(REPO, "scripts", "experiments"))
    import render

    with open(os.path.join(run["work"], "result.json")) as f:
        return render.score_line(json.load(f), os.path.relpath(run["work"], REPO))


@pytest.fixture(scope="module")
def smoke(shipped_data, tmp_path_factory, request):  # noqa: F811
    """The CPU recipes on a SMOKE budget, two at a time: GhostBERT, APC and Variator on the shipped translation
    teacher (pet.sh runs in tests/test_grid.py's cell and in tests/test_demo.py's demo), and GhostBERT, APC (every FFN
    64 -> 32) and Variator (from a pre-trained plugin) on the tiny RTE teacher when the GLUE TSVs are present."""
    root = tmp_path_factory.mktemp("recipes")
    jobs = {
        "ghostbert": (os.path.join(RECIPES, "ghostbert.sh"), {"DATA": shipped_data}),
        "apc": (os.path.join(RECIPES, "apc.sh"), {"DATA": shipped_data, "FINETUNE_UPDATES": 2}),
        "variator": (os.path.join(RECIPES, "variator.sh"), {"DATA": shipped_data, "BOTTLENECK": 16}),
    }
    try:
        glue = request.getfixturevalue("tiny_glue_teacher")
    except pytest.skip.Exception:
        glue = None
    if glue is not None:
        common = {"TEACHER": glue["teacher"], "DATA": glue["data"], "GLUE_TASK": "RTE"}
        jobs.update({
            "variator-glue": (os.path.join(RECIPES, "variator.sh"), dict(
                common, K=2, BOTTLENECK=8, PRETRAIN_BACKBONE=glue["teacher"], PRETRAIN_DATA=glue["data"])),
            "ghostbert-glue": (os.path.join(RECIPES, "ghostbert.sh"), dict(common, WIDTH="2/4")),
            "apc-glue": (os.path.join(RECIPES, "apc.sh"), dict(common, ENCODER_FFN_DIMS=32, FINETUNE_UPDATES=2)),
        })
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(bash, script, root / name, SMOKE=1, **variables)
                   for name, (script, variables) in jobs.items()}
        runs = {name: f.result() for name, f in futures.items()}
    runs["glue"] = glue
    return runs


def test_recipes_parse_and_print_their_documentation():
    for name in CPU_RECIPES + GPU_RECIPES:
        script = os.path.join(RECIPES, name + ".sh")
        assert subprocess.run(["bash", "-n", script]).returncode == 0, name
        proc = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, env=env(), timeout=60)
        assert proc.returncode == 0 and "Variables" in proc.stdout and "#" not in proc.stdout.splitlines()[0], name


def test_ghostbert_recipe_on_translation(smoke):
    run = smoke["ghostbert"]
    line = score_line(run)
    assert re.match(r"score: ghostbert-ghost BLEU \(tok\) [\d.]+ \(teacher [\d.]+\) at [\d.]+% ", line)
    assert rendered_score_line(run) == line
    # m = 1/2 of the shipped teacher's 4 heads: the pruned checkpoint's flags, read by fc-flags, trained both stages
    arch = flags(os.path.join(run["work"], "prune", "init.pt"))
    assert arch[:2] == ["--arch", "ghost_transformer"] and "--ghost-heads 2 --ghost-ffn-dim 512" in " ".join(arch)
    for stage in ("distill", "finetune"):
        assert " ".join(arch) in open(os.path.join(run["work"], stage, "DONE")).read()
    assert "criterion: GhostDistillCriterion" in open(os.path.join(run["work"], "distill.log")).read()


def test_apc_recipe_on_translation(smoke):
    run = smoke["apc"]
    line = score_line(run)
    # every FFN 1024 -> 128: half of the non-embedding parameters; finalized into a stock transformer, fine-tuned
    assert re.match(r"score: apc BLEU \(tok\) [\d.]+ \(teacher [\d.]+\) at 50\.12% ", line), line
    assert rendered_score_line(run) == line
    final = flags(os.path.join(run["work"], "finalize", "apc.pt"))
    assert final[:2] == ["--arch", "transformer"] and "--encoder-ffn-embed-dim 128" in " ".join(final)
    assert "--apc-encoder-ffn-dims 128" in open(os.path.join(run["work"], "compress", "DONE")).read()
    assert " ".join(final) in open(os.path.join(run["work"], "finetune", "DONE")).read()


def test_variator_recipe_on_translation(smoke):
    run = smoke["variator"]
    line = score_line(run)
    m = re.match(r"score: variator k=4 BLEU4 ([\d.]+) \(backbone alone ([\d.]+)\), ([\d.]+)% of the encoder's FLOPs "
                 r"saved with ([\d.]+)% extra parameters", line)
    assert m and 0 < float(m.group(3)) < 75 and 0 < float(m.group(4)) < 1, line
    assert rendered_score_line(run) == line
    # the backbone's flags came from the shipped checkpoint (fc-flags) and it stayed the shipped file
    assert " ".join(flags(TEACHER)) in open(os.path.join(run["work"], "plugin", "DONE")).read()
    assert os.path.getsize(os.path.join(run["work"], "plugin-k4.pt")) < 2_000_000
    # its record: the plugged model's scores (fc-measure on the plugin's training checkpoint), the same as the score
    # line's, with per-example outputs for the claims' paired test
    import json
    record = json.load(open(os.path.join(run["work"], "result.json")))
    assert record["name"] == "variator-k4" and record["variables"]["K"] == "4"
    assert f"{record['metrics']['bleu_tok']:.2f}" == m.group(1) and record["metrics"]["sacrebleu"] > 0
    outputs = open(os.path.join(run["work"], record["outputs"])).read().splitlines()
    assert len(outputs) == record["sentences"] == 20
    assert record["checkpoint"].endswith("plugin/checkpoint_last.pt") and record["training"]["plugin"]["updates"] == 3
    # the backbone alone, filed beside the plugged model (a claim's B), and the plugin's cost (FLOPs, measured speed)
    teacher = record["also"]["teacher"]
    measured = {r["name"]: r for r in json.load(open(os.path.join(run["work"], "measure.json")))["rows"]}
    assert teacher["metrics"]["bleu_tok"] == measured["teacher"]["bleu_tok"]
    assert (teacher["sentences_per_s"], record["sentences_per_s"]) == (measured["teacher"]["sentences_per_s"],
                                                                      measured["variator-k4"]["sentences_per_s"])
    assert len(open(os.path.join(run["work"], teacher["outputs"])).read().splitlines()) == 20
    cost = json.load(open(os.path.join(run["work"], "cost.json")))["rows"][-1]
    assert record["cost"]["encoder_flops_saved_percent"] == cost["encoder_flops_saved_percent"]
    assert cost["encoder_flops_saved_percent"] == pytest.approx(float(m.group(3)), abs=0.05)


def glue_run(smoke, name):
    if smoke["glue"] is None:
        pytest.skip("needs the GLUE TSVs of the tiny GLUE teacher (../shared/data/glue)")
    return smoke[name]


def test_variator_recipe_on_glue(smoke):
    run = glue_run(smoke, "variator-glue")
    assert re.match(r"score: variator k=2 RTE dev accuracy [\d.]+ \(backbone alone [\d.]+\), ", score_line(run))
    # adaptation started from the pre-trained plugin
    assert "--variator-plugins WORK/pretrained-k2.pt" in open(os.path.join(run["work"], "plugin", "DONE")).read()


def test_ghostbert_recipe_on_glue(smoke):
    """scripts/recipes/ghostbert.sh GLUE_TASK=RTE: the task flags read from the teacher, Table 8's optimiser, the
    held-out metric choosing the checkpoint, the GLUE encoder's ghost architecture."""
    run = glue_run(smoke, "ghostbert-glue")
    assert re.match(r"score: ghostbert-ghost RTE dev accuracy [\d.]+ \(teacher [\d.]+\) ", score_line(run))
    done = open(os.path.join(run["work"], "finetune", "DONE")).read()
    assert "--task sentence_prediction --num-classes 2 --init-token 0" in done and "--shorten-method truncate" in done
    assert "--adam-betas '(0.9,0.999)' --adam-eps 1e-6 --lr 2e-5 --lr-scheduler polynomial_decay" in done
    assert "--best-checkpoint-metric accuracy --maximize-best-checkpoint-metric" in done
    assert flags(os.path.join(run["work"], "prune", "init.pt"))[:2] == ["--arch", "ghost_hf_bert"]


def test_apc_recipe_on_glue(smoke):
    """scripts/recipes/apc.sh GLUE_TASK=RTE: its score line, and every FFN of 32 finalized into a stock hf_bert of
    that width (per-layer widths stay apc_hf_bert --apc-finalized: tests/test_apc.py)."""
    run = glue_run(smoke, "apc-glue")
    assert re.match(r"score: apc RTE dev accuracy [\d.]+ \(teacher [\d.]+\) ", score_line(run))
    final = flags(os.path.join(run["work"], "finalize", "apc.pt"))
    assert final[:2] == ["--arch", "hf_bert"] and "--encoder-ffn-embed-dim 32 " in " ".join(final) + " "


# ---- the GPU reproductions: dry runs -----------------------------------------------------------------------------
PLACEHOLDER = re.compile(r"\$\((fc-flags|updates) ([^)]*)\)")


def train_lines(stdout):
    return [line for line in stdout.splitlines() if line.startswith("fairseq-train ")]


def parse(line, stand_in):
    """fairseq's own parser on a printed fairseq-train line, each $(fc-flags PATH) of a checkpoint the dry run
    had not written replaced by ``stand_in(options, path)`` and each $(updates ...) by a number."""
    from fairseq import options
    line = PLACEHOLDER.sub(lambda m: "10" if m.group(1) == "updates" else " ".join(stand_in(*m.group(2).rsplit(" ", 1))
                                                                                  if " " in m.group(2) else stand_in("", m.group(2))),
                           line)
    args = shlex.split(line)[1:]
    assert "--user-dir" in args and args[args.index("--user-dir") + 1] == USER_DIR
    return options.parse_args_and_arch(options.get_training_parser(), args)


def test_pet_recipe_takes_the_papers_gpu_setting_as_variables(shipped_data, tmp_path):  # noqa: F811
    """The paper's Table 7 setting is pet.sh with variables (its header's example): fp16, the IWSLT schedule and the
    one stopping rule, printed as commands fairseq's own parser reads."""
    run = bash(os.path.join(RECIPES, "pet.sh"), tmp_path / "pet-gpu", DRY_RUN=1, TEACHER=TEACHER, DATA=shipped_data,
               DEVICE_FLAGS="--fp16", ENC_DIM=320, DEC_DIM=240, LR="5e-4", DROPOUT="0.3", LR_WARMUP=4000,
               MAX_TOKENS=4096, ARCH="pet_transformer_wmt")
    assert run["rc"] == 0, run["out"][-3000:]
    lines = train_lines(run["stdout"])
    assert len(lines) == 2 and not (tmp_path / "pet-gpu" / "warmup").exists()
    for line, criterion in zip(lines, ("pet_warmup", "kd")):
        args = parse(line, None)
        assert args.criterion == criterion and args.fp16 and not args.cpu and args.arch == "pet_transformer_wmt"
        assert (args.encoder_embed_dim, args.decoder_embed_dim, args.lr, args.dropout, args.warmup_updates,
                args.max_tokens) == (320, 240, [5e-4], 0.3, 4000, 4096)
    assert args.patience == 3 and args.best_checkpoint_metric == "loss" and args.max_epoch == 60


# ---- the GLUE teachers' recipes (issue 45) -----------------------------------------------
GLUE_RECIPES = {  # task: (classes, checkpoint metric, batch, CPU epochs, GPU epochs, extra parsed fields)
    "CoLA": (2, "mcc", 16, 3, 10, {}), "SST-2": (2, "accuracy", 32, 1, 3, {}), "MRPC": (2, "f1", 16, 5, 10, {}),
    "STS-B": (1, "pearson_and_spearman", 16, 3, 10, {"regression_target": True}),
    "QQP": (2, "f1", 32, 1, 3, {}), "MNLI": (3, "accuracy", 32, 1, 3, {"valid_subset": "valid"}),  # chosen on the held-out valid
    "QNLI": (2, "accuracy", 32, 1, 3, {}), "RTE": (2, "accuracy", 16, 10, 10, {}), "WNLI": (2, "accuracy", 32, 3, 3, {}),
}


def glue_teachers_dry_run(tmp_path, **variables):
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "recipes", "glue_teachers.sh")], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env(DRY_RUN=1, WORK=tmp_path / "glue",
                                                         OUT=tmp_path / "glue.md", **variables))
    return proc.returncode, proc.stdout + proc.stderr


def parse_glue_train(line):
    """fairseq's parser on a printed glue_teachers.sh training line, its dry-run placeholders filled in."""
    from fairseq import options
    line = re.sub(r"\$\(fc-flags [^)]*\)", "--arch hf_bert", line)
    line = re.sub(r"\$\(updates [^)]*\)", "100", line)
    args = shlex.split(line)
    args = args[args.index("fairseq_cli.train") + 1:]
    args[args.index("--user-dir") + 1] = USER_DIR
    return options.parse_args_and_arch(options.get_training_parser(), args)


@pytest.mark.parametrize("gpu", [True, False])
def test_glue_teachers_has_a_recipe_for_every_glue_task(tmp_path, gpu):
    """Every GLUE task gets its classes (or regression), checkpoint metric, batch, epochs and learning rate, on the
    CPU and with GPU=1 (512 positions, fp16); the dry run prints parseable commands and writes nothing."""
    variables = dict(TASKS=" ".join(GLUE_RECIPES), HF_MODEL="/models/bert-base-uncased", GLUE_DIR="/data/glue")
    if gpu:
        variables["GPU"] = 1
    rc, out = glue_teachers_dry_run(tmp_path, **variables)
    assert rc == 0, out[-3000:]
    runs = {}
    for line in out.splitlines():
        if " -m fairseq_cli.train " in line:
            args = parse_glue_train(line)
            runs.setdefault(args.glue_task, []).append(args)
    assert list(runs) == list(GLUE_RECIPES), out[-3000:]
    # one run per learning rate of the task's grid, chosen on the held-out slice; the large tasks: BERT's largest
    assert {task: [a.lr[0] for a in r] for task, r in runs.items()} == {
        task: [5e-5] if task in ("QNLI", "MNLI", "QQP") else [2e-5, 5e-5, 1e-4] for task in GLUE_RECIPES}
    for task, (classes, metric, batch, cpu_epochs, gpu_epochs, extra) in GLUE_RECIPES.items():
        args = runs[task][0]
        assert args.num_classes == classes and args.best_checkpoint_metric == metric
        assert args.maximize_best_checkpoint_metric and args.batch_size == batch
        assert args.max_epoch == (gpu_epochs if gpu else cpu_epochs), (task, args.max_epoch)
        assert args.fp16 == gpu and args.cpu != gpu
        for key, value in extra.items():
            assert getattr(args, key) == value, (task, key)
        assert args.regression_target == (task == "STS-B")
        assert f"--max-length {512 if gpu else 128}" in out
    assert not (tmp_path / "glue").exists(), "a dry run wrote files"
    rc, out = glue_teachers_dry_run(tmp_path, TASKS="SST-5", HF_MODEL="/models/x", GLUE_DIR="/data/glue")
    assert rc == 2 and "TASKS: no GLUE task 'SST-5'" in out


def test_glue_gpu_reproductions_dry_run_prints_parseable_commands(smoke, tmp_path):
    """Table 1/3 (GhostBERT), Table 2 (APC) and Variator on BERT-base: every fairseq-train line they would run
    parses, with the flags of the checkpoints they would write taken from the same stage of the GLUE smoke runs."""
    glue_run(smoke, "apc-glue")
    ghost, apc = smoke["ghostbert-glue"]["work"], smoke["apc-glue"]["work"]
    stand_ins = {"prune/init.pt": os.path.join(ghost, "prune", "init.pt"),
                 "init/init.pt": os.path.join(apc, "init", "init.pt"),
                 "finalize/apc.pt": os.path.join(apc, "finalize", "apc.pt"),
                 "checkpoint_best.pt": str(smoke["glue"]["teacher"]), "model.pt": str(smoke["glue"]["teacher"])}
    cache = {}

    def stand_in(options, path):
        key = next(k for k in stand_ins if path.endswith(k))
        if (options, key) not in cache:
            cache[(options, key)] = flags(stand_ins[key], *options.split())
        return cache[(options, key)]

    expected = {"ghostbert_glue_gpu": ({"ghost_distill": 2, "glue_sentence_prediction": 2}, "ghost_hf_bert"),
                "apc_glue_gpu": ({"glue_sentence_prediction": 4}, None),
                "variator_glue_gpu": ({"variator_distill": 3}, "hf_bert")}
    for name, (criteria, arch) in expected.items():
        run = bash(os.path.join(RECIPES, name + ".sh"), tmp_path / name, DRY_RUN=1, HF_MODEL="/models/bert-base-uncased",
                   GLUE_DIR="/data/glue", TASKS="RTE MRPC", WIDTHS="3/12", VALIDATIONS=3)
        assert run["rc"] == 0, run["out"][-3000:]
        assert "HF_MODEL=/models/bert-base-uncased GLUE_DIR=/data/glue GPU=1" in run["stdout"]
        seen = {}
        for line in train_lines(run["stdout"]):
            args = parse(line, stand_in)
            assert args.fp16 and args.user_dir == USER_DIR
            seen[args.criterion] = seen.get(args.criterion, 0) + 1
            if arch:
                assert args.arch == arch
        assert seen == criteria, (name, seen)
        assert not list((tmp_path / name).rglob("DONE")), "a dry run ran something"
