"""Every benchmark script's defaults on a fresh clone: nothing beside the checkout (FAIRSEQ_COMPRESS_SHARED an empty
folder, as ``git clone`` leaves it: CI always has ../shared, so these tests force the empty folder). A default path
is what ships (the teacher in checkpoints/, the embedded Multi30k), what a run writes or builds under work/, or --
for data that does not ship (the GLUE TSVs and the teachers made from them) -- the script stops at once with a
message naming the missing path and how to make it (issue 43)."""
import filecmp
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, TEACHER_DIR, clean_env, needs_teacher

DRIVERS = ["bench_ghost_costs", "bench_serving"]

# Imports each driver named on the command line as running it does (scripts/ on sys.path), calls its main(ARGV)
# and stops at its argument parser's return: prints {driver: the parsed namespace} as JSON.
PROBE = r"""
import argparse, importlib, json, sys
sys.path.insert(0, "scripts/bench")
argv = json.loads(sys.argv[1])

class Parsed(Exception):
    pass

parse = argparse.ArgumentParser.parse_args
def stop(self, args=None, namespace=None):
    raise Parsed(parse(self, args, namespace))
argparse.ArgumentParser.parse_args = stop

found = {}
for name in sys.argv[2:]:
    try:
        importlib.import_module(name).main(list(argv))
    except Parsed as parsed:
        found[name] = vars(parsed.args[0])
print("PARSED " + json.dumps(found, default=str))
"""


@pytest.fixture(scope="module")
def no_shared(tmp_path_factory):
    """The environment of a fresh clone's shell: FAIRSEQ_COMPRESS_SHARED an empty folder."""
    empty = tmp_path_factory.mktemp("no-shared")
    return dict(clean_env(), FAIRSEQ_COMPRESS_SHARED=str(empty)), str(empty)


def parsed_defaults(env, argv, drivers):
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv), *drivers], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PARSED "))
    found = json.loads(line[len("PARSED "):])
    assert sorted(found) == sorted(drivers), f"a driver's main() never reached its parser: {proc.stderr[-2000:]}"
    return found


def paths_in(value):
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, str) and os.path.isabs(v)]


def test_every_default_path_ships_or_is_built_under_work(no_shared):
    """The defect of issue 43: a driver defaulted --teacher to ../shared/teachers/..., missing on a clone though the
    same teacher ships in checkpoints/. Every absolute default of every script lies in the checkout: an input that
    exists (it ships), or under work/ or results/ (what runs write or build on demand)."""
    env, shared = no_shared
    found = parsed_defaults(env, [], DRIVERS)
    outputs = [os.path.join(REPO, d) + os.sep for d in ("work", "results")]
    for driver, namespace in found.items():
        for flag, value in namespace.items():
            for path in paths_in(value):
                assert not path.startswith(shared + os.sep), f"{driver} --{flag} defaults to {path}, beside the clone"
                assert path.startswith(REPO + os.sep), f"{driver} --{flag} defaults to {path}, outside the checkout"
                if not any(path.startswith(o) for o in outputs):
                    assert os.path.exists(path), f"{driver} --{flag} defaults to {path}, which does not ship"


def test_what_does_not_ship_stops_at_once_naming_the_path_and_the_switch(no_shared, tmp_path):
    """The GLUE TSVs do not ship: a GLUE benchmark stops before anything runs, naming the teacher it looked for and
    the recipe that makes it (glue_teachers.sh), and that recipe names the TSVs it needs and
    FAIRSEQ_COMPRESS_SHARED."""
    env, shared = no_shared

    def fails(cmd, *words):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
        assert proc.returncode != 0, proc.stdout[-2000:]
        for word in words:
            assert word in proc.stderr, (word, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]

    script = [sys.executable]
    glue = str(tmp_path / "glue")
    fails(script + ["scripts/bench/bench_ghost_costs.py", "--glue-task", "RTE", "--glue-work", glue,
                    "--work", str(tmp_path / "ghost")],
          os.path.join(glue, "RTE", "checkpoints", "checkpoint_best.pt"), "glue_teachers.sh")
    assert not (tmp_path / "ghost").exists()  # nothing made before the check
    fails(["bash", "scripts/recipes/glue_teachers.sh"], os.path.join(shared, "data", "glue"), "FAIRSEQ_COMPRESS_SHARED")


@needs_teacher
def test_the_data_bin_built_on_demand_is_the_shipped_teachers(tmp_path):
    """conftest.multi30k_data_bin, the one builder of the test teacher's data-bin: the embedded Multi30k with the
    shipped codes and dictionary, byte for byte the data-bin the test teacher uses (conftest), built once."""
    import conftest

    from preprocess.textio import read_lines

    dest = str(tmp_path / "data-bin")
    assert conftest.multi30k_data_bin(dest) == dest
    for name in ("dict.de.txt", "dict.en.txt", "test.de-en.de.bin", "test.de-en.en.idx", "valid.de-en.en.bin"):
        assert filecmp.cmp(os.path.join(dest, name), os.path.join(TEACHER_DIR, "data-bin", name), shallow=False), name
    stamp = os.stat(os.path.join(dest, "DONE")).st_mtime
    conftest.multi30k_data_bin(dest)
    assert os.stat(os.path.join(dest, "DONE")).st_mtime == stamp  # not rebuilt
    references = conftest.multi30k_references(str(tmp_path / "refs.txt"))  # from the embedded copy
    assert read_lines(references) == read_lines(os.path.join(dest, "text", "test.raw.en"))


