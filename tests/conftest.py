"""Shared fixtures: real data slices, tiny model flags, and a runner for the stock fairseq CLIs.

The embedded Multi30k copy (preprocess/data) covers the core path on any clone; tests that need
the larger corpora or the reference teacher beside the project (``../shared``) skip, saying why.
"""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts", "bench"))
import benchlib  # noqa: E402  (what the benchmark scripts share: how they run a command)
from preprocess.textio import read_lines  # noqa: E402  (benchlib put the checkout on sys.path)

USER_DIR = os.path.join(REPO, "user_dir")
SHARED = os.environ.get("FAIRSEQ_COMPRESS_SHARED", os.path.join(os.path.dirname(REPO), "shared"))
SHARED_DATA = os.path.join(SHARED, "data")
# The original reference teacher and its data-bin beside the project (the tests about the original file only).
REFERENCE_TEACHER_DIR = os.path.join(SHARED, "teachers", "multi30k.de-en")
REFERENCE_TEACHER = os.path.join(REFERENCE_TEACHER_DIR, "teacher.pt")
# The teacher of every other test: the one shipped in checkpoints/ (the reference's weights, bit for bit), beside
# its data-bin (multi30k_data_bin below: the embedded Multi30k through preprocess.prepare_multi30k with the shipped
# codes and dictionary, byte-identical to the reference's data-bin, built once per clone under work/data-bin), linked together under work/test-teacher when this file is
# imported (below) -- so a fresh clone runs these tests too.
SHIPPED_TEACHER_DIR = os.path.join(REPO, "checkpoints", "multi30k.de-en")
MULTI30K_TEXT = os.path.join(REPO, "preprocess", "data", "multi30k.de-en")  # the embedded Multi30k text
MULTI30K_DATA = os.path.join(REPO, "work", "data-bin", "multi30k.de-en")  # the test teacher's data-bin, built on demand
TEACHER_DIR = os.path.join(REPO, "work", "test-teacher", "multi30k.de-en")
TEACHER = os.path.join(TEACHER_DIR, "teacher.pt")

needs_shared_data = pytest.mark.skipif(
    not os.path.isdir(SHARED_DATA), reason=f"needs the shared corpora at {SHARED_DATA} (not part of a clone)")
needs_reference_teacher = pytest.mark.skipif(
    not os.path.isfile(REFERENCE_TEACHER),
    reason=f"needs the original reference teacher at {REFERENCE_TEACHER} (not part of a clone)")


def multi30k_data_bin(dest=MULTI30K_DATA):
    """The shipped teacher's data-bin (byte-identical to the one it was trained on): the embedded Multi30k
    through ``preprocess.prepare_multi30k`` with the teacher's BPE codes and dictionary, built once at ``dest``
    (about 20 s; a lock makes pytest-xdist's workers wait for the first). Returns ``dest``."""
    import fcntl

    if not os.path.isfile(os.path.join(dest, "DONE")):
        os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
        with open(dest + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.isfile(os.path.join(dest, "DONE")):
                benchlib.run([sys.executable, "-m", "preprocess.prepare_multi30k", "--dest", dest, "--raw-dir",
                              MULTI30K_TEXT, "--bpe-codes", os.path.join(SHIPPED_TEACHER_DIR, "code"),
                              "--srcdict", os.path.join(SHIPPED_TEACHER_DIR, "dict.de.txt")], dest + ".log", 2)
                open(os.path.join(dest, "DONE"), "w").close()
    return dest


def write_lines(path, lines):
    tmp = path + ".tmp"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    os.replace(tmp, path)


def multi30k_references(dest):
    """The Multi30k test_2016_flickr English references as the reference teacher's test set holds them
    (lowercased, untokenised: the teacher's README), from the embedded copy, written to ``dest`` once; returns
    ``dest``."""
    if not os.path.isfile(dest):
        source = os.path.join(MULTI30K_TEXT, "test_2016_flickr.en.gz")
        write_lines(dest, [line.lower() for line in read_lines(source)])
    return dest


def _assemble_test_teacher():
    """TEACHER_DIR: links to the shipped teacher, codes and dictionaries, and to its data-bin (built on demand by
    multi30k_data_bin, about 20 s once per clone; its lock makes pytest-xdist's workers, which import
    this file at the same time, wait for the first)."""
    links = {name: os.path.join(SHIPPED_TEACHER_DIR, name) for name in ("teacher.pt", "code", "dict.de.txt",
                                                                       "dict.en.txt")}
    links["data-bin"] = multi30k_data_bin()
    os.makedirs(TEACHER_DIR, exist_ok=True)
    for name, target in links.items():
        try:
            os.symlink(os.path.relpath(target, TEACHER_DIR), os.path.join(TEACHER_DIR, name))  # a moved clone too
        except FileExistsError:  # made by another worker, or by an earlier run (a data-bin folder of its own)
            pass


# a Transformer small enough to train a few updates in seconds on 2 CPU cores
TINY_TRANSFORMER = [
    "--arch", "transformer_iwslt_de_en", "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128",
    "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--share-all-embeddings",
]
OPTIM_FLAGS = [
    "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "2048", "--log-format", "simple", "--log-interval", "1",
    "--no-progress-bar", "--seed", "1", "--num-workers", "0",
]
TRAIN_FLAGS = OPTIM_FLAGS + ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]


# pytest-xdist's workers take one test file at a time (--dist loadfile, in this order: scripts/test.sh turns its
# reordering by test count off): the files that took longest in a whole run (scripts/test.sh lists the slowest tests)
# go first, so the run does not end with one worker on a long file while the other idles
SLOWEST_FILES_FIRST = ("test_recipes.py", "test_grid.py", "test_apc.py", "test_ghost.py", "test_variator.py",
                       "test_demo.py", "test_export_glue.py", "test_hf_import.py", "test_glue_every_task.py",
                       "test_distributed_equality.py", "test_export.py", "test_baselines.py",
                       "test_distributed_and_measure.py", "test_pet_criteria.py", "test_plugin_and_checkpoints.py",
                       "test_env.py", "test_ghost_validation.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOWEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order is kept


def clean_env():
    """The environment of a user's shell: no switch that disables torch's weights-only loading."""
    env = dict(os.environ)
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    env.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "2")
    return env


# assembled when the test modules are collected (their skipif markers are evaluated at import)
try:
    _assemble_test_teacher()
    _TEACHER_PROBLEM = None
except (OSError, SystemExit) as e:  # benchlib stops a failed command naming its log
    _TEACHER_PROBLEM = str(e)[-500:]
needs_teacher = pytest.mark.skipif(
    _TEACHER_PROBLEM is not None, reason=f"the test teacher at {TEACHER} could not be assembled: {_TEACHER_PROBLEM}")


class _ForkRunner:
    """tests/fork_runner.py, started once per test process: runs each ``python -m`` command in a process forked from
    one that has imported torch and fairseq already (the import is most of a short command's time)."""

    def __init__(self):
        import threading
        self.lock, self.proc = threading.Lock(), None

    def start(self):
        read, write = os.pipe()
        self.proc = subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "fork_runner.py"), str(write)],
                                     stdin=subprocess.PIPE, env=clean_env(), pass_fds=(write,), text=True, cwd=REPO)
        os.close(write)
        self.replies = os.fdopen(read)
        if json.loads(self.replies.readline() or "{}").get("ready") is not True:
            raise RuntimeError("tests/fork_runner.py did not start (run the tests with FC_TEST_FORK=0 to bypass it)")

    def run(self, argv, input, cwd, timeout):
        import tempfile
        with self.lock, tempfile.TemporaryDirectory() as tmp:
            if self.proc is None or self.proc.poll() is not None:
                self.start()
            paths = {name: os.path.join(tmp, name) for name in ("stdin", "stdout", "stderr")}
            with open(paths["stdin"], "w") as f:
                f.write(input or "")
            request = {"module": argv[2], "args": argv[3:], "cwd": os.path.abspath(cwd or os.getcwd()),
                       "env": clean_env(), "timeout": timeout, **paths}
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            reply = json.loads(self.replies.readline())
            out, err = (open(paths[n], errors="replace").read() for n in ("stdout", "stderr"))
        if reply.get("timeout"):
            raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err)
        return subprocess.CompletedProcess(argv, reply["returncode"], out, err)


_FORK_RUNNER = _ForkRunner() if os.environ.get("FC_TEST_FORK", "1") != "0" and hasattr(os, "fork") else None


def run_cli(module, *args, input=None, check=True, cwd=None, timeout=600):
    """Run ``python -m <module> args`` (the code behind fairseq-train, -generate, ...) in its own process: forked from
    tests/fork_runner.py's (torch and fairseq imported once), or a fresh interpreter with FC_TEST_FORK=0."""
    argv = [sys.executable, "-m", module, *map(str, args)]
    if _FORK_RUNNER is not None:
        proc = _FORK_RUNNER.run(argv, input, cwd, timeout)
    else:
        proc = subprocess.run(argv, capture_output=True, text=True, env=clean_env(), input=input, cwd=cwd,
                              timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


@pytest.fixture(scope="session")
def multi30k_slice(tmp_path_factory):
    """Real Multi30k DE->EN from the embedded copy: 3,000 training pairs, 2,000 BPE merges."""
    dest = tmp_path_factory.mktemp("data") / "multi30k.de-en"
    run_cli("preprocess.prepare_multi30k", "--dest", dest, "--train-lines", "3000", "--bpe-merges", "2000")
    return str(dest)


@pytest.fixture(scope="session")
def trained_tiny(multi30k_slice, tmp_path_factory):
    """A tiny Transformer trained for 8 updates, best checkpoint chosen by validation BLEU: its
    checkpoints hold optimizer and meter state and numpy scores, as users' checkpoints do."""
    save_dir = tmp_path_factory.mktemp("tiny")
    proc = run_cli("fairseq_cli.train", multi30k_slice, "--user-dir", USER_DIR, *TINY_TRANSFORMER, *TRAIN_FLAGS,
                   "--max-update", "8", "--save-dir", save_dir, "--cpu", "--eval-bleu", "--eval-bleu-remove-bpe",
                   "--eval-bleu-args", '{"beam": 1, "max_len_a": 0, "max_len_b": 4}',
                   "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric")
    return {"data": multi30k_slice, "save_dir": str(save_dir), "log": proc.stdout + proc.stderr}


@pytest.fixture(scope="session")
def tiny_glue_teacher(tmp_path_factory):
    """Real RTE (64 training pairs, all 277 dev pairs) and a tiny hf_bert classifier trained 2 updates on it
    (2 layers, width 32, 4 heads, FFN 64): the teacher of the GLUE-encoder tests of the compression methods.
    ``common`` is the fairseq-train command line up to the model and criterion flags."""
    if not os.path.isdir(SHARED_DATA):
        pytest.skip(f"needs the shared corpora at {SHARED_DATA} (not part of a clone)")
    from preprocess.prepare_glue import main as prepare_glue
    root = tmp_path_factory.mktemp("tiny_glue")
    data = root / "rte"
    prepare_glue(["--task", "RTE", "--glue-dir", os.path.join(SHARED_DATA, "glue"), "--dest", str(data),
                  "--train-rows", "64", "--workers", "1"])
    task_flags = ["--task", "sentence_prediction", "--num-classes", "2", "--init-token", "0", "--max-positions", "512",
                  "--shorten-method", "truncate", "--batch-size", "16"]
    common = [data, "--user-dir", USER_DIR, *task_flags, "--optimizer", "adam", "--lr", "1e-3", "--cpu",
              "--num-workers", "0", "--log-format", "simple", "--no-epoch-checkpoints", "--seed", "1"]
    run_cli("fairseq_cli.train", *common, "--arch", "hf_bert", "--encoder-layers", "2", "--encoder-embed-dim", "32",
            "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4", "--criterion", "sentence_prediction",
            "--max-update", "2", "--save-dir", root / "teacher")
    return {"data": data, "teacher": root / "teacher" / "checkpoint_last.pt", "common": common}
