"""GLUE pieces the benchmark scripts share: a task's teacher and data from glue_teachers.sh's work folder, and the
record of what chose its learning rate.
"""
import json
import os
import sys

# preprocess/prepare_glue.py's layout: 'valid' (a slice of train held out at preparation) is what fairseq-train
# validates on and everything chooses by (checkpoints, learning rates, importance); 'dev' (GLUE's dev set) only reports
from preprocess.prepare_glue import REPORT_SUBSET, SELECTION_SUBSET


def check_report_subset(data, task):
    """Stop, naming what to do, where the prepared GLUE data ``data`` has no REPORT_SUBSET."""
    if not os.path.isfile(os.path.join(data, "input0", f"{REPORT_SUBSET}.idx")):
        sys.exit(f"GLUE {task}: {data} has no '{REPORT_SUBSET}' subset: it was prepared before choosing moved to a "
                 f"held-out slice of train ('{SELECTION_SUBSET}') and reporting to GLUE's dev set "
                 f"('{REPORT_SUBSET}'); delete it and its teacher's runs and run TASKS={task} "
                 f"bash scripts/recipes/glue_teachers.sh again")


def selection_record(data):
    """How the prepared GLUE data keeps choosing apart from reporting (its .prepared.json): ``source`` "train" (its
    'valid' is a held-out slice of train) or "dev" (--select-fraction 0)."""
    with open(os.path.join(data, ".prepared.json")) as f:
        config = json.load(f)["config"]
    fraction = config.get("select_fraction") or 0
    return {"subset": SELECTION_SUBSET, "source": "train" if fraction else "dev", "fraction": fraction,
            "seed": config.get("select_seed"), "report": REPORT_SUBSET}


def chosen_on(settings):
    """What chose checkpoints and importance in a part (its settings' "selection"), in the report's words:
    "held-out" (a slice of train) or "dev" (parts made before the split, or --select-fraction 0)."""
    return "held-out" if (settings.get("selection") or {}).get("source") == "train" else "dev"


def first_glue_setup(glue_work, task):
    """:func:`glue_setup` of ``task`` from the first folder of ``glue_work`` (comma-separated) with its teacher."""
    for folder in (f for f in glue_work.split(",") if f):
        if os.path.isfile(os.path.join(folder, task, "checkpoints", "checkpoint_best.pt")):
            return {**glue_setup(folder, task), "glue_work": folder}
    return None


def glue_setup(glue_work, task):
    """Teacher, data and metric of GLUE ``task`` from scripts/recipes/glue_teachers.sh's work folder ``glue_work``."""
    from fairseq import checkpoint_utils

    from user_dir.common.glue_metrics import TASK_METRICS
    if task not in TASK_METRICS:
        sys.exit(f"--glue-task {task}: expected one of {', '.join(TASK_METRICS)}")
    teacher = os.path.join(glue_work, task, "checkpoints", "checkpoint_best.pt")
    data = os.path.join(glue_work, "data-bin", f"{task}.wordpiece")
    if not os.path.isfile(teacher):
        sys.exit(f"--glue-task {task}: no teacher at {teacher} (--glue-work); train it first: "
                 f"TASKS={task} bash scripts/recipes/glue_teachers.sh")
    if not os.path.isdir(os.path.join(data, "input0")):
        sys.exit(f"--glue-task {task}: no binarised data at {data} (scripts/recipes/glue_teachers.sh prepares it)")
    check_report_subset(data, task)
    tcfg = checkpoint_utils.load_checkpoint_to_cpu(teacher)["cfg"]["task"]
    if tcfg.get("_name") != "sentence_prediction":
        sys.exit(f"{teacher} was trained with --task {tcfg.get('_name')}, not sentence_prediction")
    regression = bool(tcfg.get("regression_target"))
    if task == "STS-B" and not regression:
        sys.exit(f"{teacher}: STS-B is a regression task, but this teacher was not trained with "
                 "--regression-target --num-classes 1")
    return {"teacher": teacher, "data": data, "regression": regression, "metric": TASK_METRICS[task][0],
            "selection": selection_record(data)}
