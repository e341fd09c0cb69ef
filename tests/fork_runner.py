"""The tests' runner of ``python -m MODULE ARGS`` commands: one process per test worker that imports torch and fairseq
once, then forks a child for each command (conftest.run_cli).

Each command still runs in its own process, as ``python -m`` runs it: the child sets the command's environment,
working folder, standard streams (files) and ``sys.argv``, runs the module as ``__main__`` (runpy) and exits with its
status. Only the import of torch and fairseq -- about 5 of the 6 seconds a fresh interpreter takes on the 2-core CI
machine, for each of the suite's hundreds of commands -- is done once, before any thread or computation starts, so
the children inherit no state a fresh process would not have. The plug-in (user_dir) is not imported here: a command
that runs stock fairseq without ``--user-dir`` sees stock fairseq.

Protocol (this process's stdin and the file descriptor given as argv[1]): one JSON request per line, {"module",
"args", "cwd", "env", "stdin", "stdout", "stderr", "timeout"} (paths of files), one JSON reply per line,
{"returncode"} or {"timeout": true}.
"""
import json
import os
import runpy
import signal
import sys
import time
import traceback


def run_child(request, reply_fd):
    """In the forked child: the command as ``python -m`` would run it; never returns."""
    code = 1
    try:
        os.close(reply_fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path, mode in ((0, request["stdin"], os.O_RDONLY),
                               (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                               (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            opened = os.open(path, mode, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        sys.argv = [request["module"], *request["args"]]
        sys.path[0] = request["cwd"]  # python -m puts the working folder first
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
        except BaseException:  # noqa: B902  (what python -m prints and exits 1 on)
            traceback.print_exc()
            code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def serve(replies, reply_fd):
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_child(request, reply_fd)
        deadline = time.monotonic() + request["timeout"]
        reply = None
        while reply is None:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                reply = {"returncode": os.waitstatus_to_exitcode(status)}
            elif time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                reply = {"timeout": True}
            else:
                time.sleep(0.02)
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    reply_fd = int(sys.argv[1])
    replies = os.fdopen(reply_fd, "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # what the imports print goes nowhere; replies have their own descriptor
    import logging  # noqa: E402

    import torch  # noqa: F401,E402
    import fairseq  # noqa: F401,E402
    # a fresh interpreter's logging: the imports above configured the root logger (fairseq's modules log at import),
    # which would make the basicConfig of fairseq_cli.* (logs to stdout) a no-op in the children
    for handler in list(logging.root.handlers):
        logging.root.removeHandler(handler)
    logging.root.setLevel(logging.WARNING)
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    serve(replies, reply_fd)
