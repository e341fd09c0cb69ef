"""tests/fork_runner.py, behind conftest.run_cli: a command run in a process forked from one that imported torch and
fairseq gives what a fresh ``python -m`` process gives -- its standard streams, exit status, working folder,
environment and stdin -- and a command past its timeout is killed."""
import subprocess
import sys

import pytest

import conftest

MODULE = '''
import logging, os, sys
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(levelname)s %(message)s")
logging.getLogger("probe").info("argv %s", sys.argv[1:])
print("stdin:", sys.stdin.read().strip(), "| env:", os.environ.get("PROBE_VALUE"), "| cwd:", os.getcwd())
print("to stderr", file=sys.stderr)
if "--sleep" in sys.argv:
    import time; time.sleep(30)
sys.exit(int(sys.argv[1]))
'''


@pytest.mark.skipif(conftest._FORK_RUNNER is None, reason="FC_TEST_FORK=0: run_cli starts fresh interpreters")
def test_a_forked_command_gives_what_a_fresh_process_gives(tmp_path, monkeypatch):
    (tmp_path / "probe_module.py").write_text(MODULE)
    monkeypatch.setenv("PROBE_VALUE", "42")
    forked = conftest.run_cli("probe_module", 3, "x y", input="from stdin\n", check=False, cwd=tmp_path)
    fresh = subprocess.run([sys.executable, "-m", "probe_module", "3", "x y"], input="from stdin\n",
                           capture_output=True, text=True, cwd=tmp_path, env=conftest.clean_env())
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == 3 and "INFO argv ['3', 'x y']" in forked.stdout
    assert f"stdin: from stdin | env: 42 | cwd: {tmp_path}" in forked.stdout and forked.stderr == "to stderr\n"
    with pytest.raises(AssertionError, match="probe_module 3 failed \\(3\\)"):
        conftest.run_cli("probe_module", 3, cwd=tmp_path)
    with pytest.raises(subprocess.TimeoutExpired):
        conftest.run_cli("probe_module", 0, "--sleep", cwd=tmp_path, timeout=2)
    assert conftest.run_cli("probe_module", 0, cwd=tmp_path).returncode == 0  # the runner serves on after a kill
