"""The task flags a trained model's own training used, read from its checkpoint: a tool or benchmark
that trains or validates a model derived from it (a pruned or compressed student) repeats them, so the
student sees its data exactly as the teacher did."""
from typing import List


def sentence_prediction_flags(task_cfg) -> List[str]:
    """``--task sentence_prediction`` and the options that shape its data (classes, [CLS]/separator tokens,
    shortening, regression) from a checkpoint's ``cfg["task"]``."""
    flags = ["--task", "sentence_prediction", "--num-classes", str(task_cfg["num_classes"]),
             "--init-token", str(task_cfg["init_token"])]
    if task_cfg.get("separator_token") is not None:
        flags += ["--separator-token", str(task_cfg["separator_token"])]
    if task_cfg.get("shorten_method", "none") != "none":
        flags += ["--shorten-method", task_cfg["shorten_method"]]
    if task_cfg.get("regression_target"):
        flags += ["--regression-target"]
    return flags
