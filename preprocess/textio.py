"""Reading, checking and writing the text files every preparation script handles.

Bad input stops early with :class:`DataError`, whose message names the file and the line, and
outputs are written into a temporary directory that replaces the destination only when complete
(:func:`atomic_directory`), so an interrupted or failed run never leaves half-written data.
"""
import contextlib
import gzip
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Iterable, Iterator, List, Optional, Sequence


class DataError(ValueError):
    """Input data that cannot be prepared; the message names the file (and line)."""


def main_or_exit(main) -> None:
    """Run a preparation script's ``main()``; bad input ends it with ``error: <message>``, no traceback."""
    try:
        main()
    except DataError as e:
        sys.exit(f"error: {e}")


def open_text(path: str, mode: str = "rt"):
    """Open a UTF-8 text file, transparently gunzipping ``*.gz``."""
    if "r" in mode and not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    if path.endswith(".gz"):
        return gzip.open(path, mode, encoding="utf-8", newline="\n")
    return open(path, mode, encoding="utf-8", newline="\n")


def find_file(directory: str, stem: str) -> str:
    """``directory/stem`` or ``directory/stem.gz``, whichever exists."""
    for candidate in (os.path.join(directory, stem), os.path.join(directory, stem + ".gz")):
        if os.path.isfile(candidate):
            return candidate
    raise DataError(f"{os.path.join(directory, stem)}[.gz]: no such file")


def read_lines(path: str, allow_empty: bool = False) -> List[str]:
    """All lines of ``path`` without their newline; an empty line or bytes that are not UTF-8 are an
    error naming the file and line (the file is decoded line by line so the line is known)."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    lines = []
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{lineno}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                                f"convert the file, e.g. iconv -f latin1 -t utf-8") from None
            line = line.rstrip("\n").rstrip("\r")
            if not allow_empty and not line.strip():
                raise DataError(f"{path}:{lineno}: empty line (every line must hold one sentence)")
            lines.append(line)
    return lines


def read_parallel(src_path: str, tgt_path: str) -> (List[str], List[str]):
    """Two aligned files; a different line count or an empty line is reported with file and line."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: parallel files must be "
            f"aligned line by line (first line without a partner: {min(len(src), len(tgt)) + 1})"
        )
    return src, tgt


def write_lines(path: str, lines: Iterable[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line)
            f.write("\n")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def progress(items: Sequence, what: str, every: int = 20000) -> Iterator:
    """Iterate ``items``, logging how far along it is."""
    total = len(items)
    for i, item in enumerate(items, start=1):
        if i % every == 0 or i == total:
            log(f"  {what}: {i:,}/{total:,}")
        yield item


def config_digest(config: dict) -> str:
    return hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]


MARKER = ".prepared.json"


def is_prepared(dest: str, config: dict) -> bool:
    """True when ``dest`` was completed by an earlier run with the same configuration."""
    marker = os.path.join(dest, MARKER)
    if not os.path.isfile(marker):
        return False
    with open(marker) as f:
        return json.load(f).get("digest") == config_digest(config)


@contextlib.contextmanager
def atomic_directory(dest: str, config: dict):
    """Yield a temporary directory next to ``dest``; on success it replaces ``dest`` whole."""
    parent = os.path.dirname(os.path.abspath(dest)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-" + os.path.basename(dest) + "-", dir=parent)
    try:
        yield tmp
        with open(os.path.join(tmp, MARKER), "w") as f:
            json.dump({"digest": config_digest(config), "config": config}, f, indent=1, sort_keys=True)
        if os.path.isdir(dest):
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def fairseq_preprocess(
    dest: str,
    src: Optional[str],
    tgt: Optional[str],
    trainpref: Optional[str],
    validpref: Optional[str] = None,
    testpref: Optional[str] = None,
    joined_dictionary: bool = False,
    srcdict: Optional[str] = None,
    tgtdict: Optional[str] = None,
    workers: int = 1,
    extra: Sequence[str] = (),
) -> None:
    """``fairseq-preprocess``, its ``main`` run in this process (one import of fairseq for every side and split a
    preparation binarises, not one per call); a failure raises DataError with the command line.

    With ``src=None`` and ``tgt=None`` (``--only-source``), prefixes are read as they are and the
    outputs are named ``train.bin``/``dict.txt``: the layout of fairseq's sentence_prediction task.
    """
    argv = ["--destdir", dest, "--workers", str(workers)]
    if src is not None:
        argv += ["--source-lang", src]
    if tgt is not None:
        argv += ["--target-lang", tgt]
    else:
        argv += ["--only-source"]
    for flag, value in (("--trainpref", trainpref), ("--validpref", validpref), ("--testpref", testpref),
                        ("--srcdict", srcdict), ("--tgtdict", tgtdict)):
        if value:
            argv += [flag, value]
    if joined_dictionary and not (srcdict and tgtdict):
        argv.append("--joined-dictionary")
    argv += list(extra)
    log(f"fairseq-preprocess -> {dest}")
    from fairseq import options
    from fairseq_cli import preprocess

    args = options.get_preprocessing_parser().parse_args(argv)
    before = list(preprocess.logger.handlers)
    try:
        preprocess.main(args)
    except Exception as error:
        raise DataError(f"fairseq-preprocess {' '.join(argv)} failed: {type(error).__name__}: {error}") from error
    finally:  # main adds a handler writing DEST/preprocess.log to its logger: closed with the call
        for handler in [h for h in preprocess.logger.handlers if h not in before]:
            preprocess.logger.removeHandler(handler)
            handler.close()


def binarise_splits(out: str, text_dir: str, suffix: str, src: str, tgt: str, **kwargs) -> None:
    """``fairseq-preprocess --joined-dictionary`` of ``text_dir/{train,valid,test}{suffix}.<lang>`` into ``out``."""
    fairseq_preprocess(out, src, tgt, *(os.path.join(text_dir, split + suffix) for split in ("train", "valid", "test")),
                       joined_dictionary=True, **kwargs)
