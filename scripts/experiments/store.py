"""The store: every finished grid cell, append-only, in results/store/.

    records.jsonl          one JSON line per finished cell: its key (scripts/experiments/grid.py), grid, cell, seed and
                           the recipe's WORK/result.json (scripts/experiments/record.py)
    outputs/KEY.txt.gz     the cell's per-example outputs (hypotheses or predictions), one line per example
    outputs/KEY.ROW.txt.gz those of another row of its measurement ('also': e.g. the backbone beside a Variator plugin)
    references/SHA.txt.gz  the references they are scored against, by the sha256 of their text

Lines are only appended, under a file lock (parallel jobs, local or on Slurm, file at once); a key filed twice keeps
its first record. Whatever a reader sees is rendered from here (scripts/experiments/render.py)."""
import fcntl
import gzip
import hashlib
import json
import os
import shutil
import subprocess


class Store:
    def __init__(self, root):
        self.root = os.path.abspath(root)
        self.path = os.path.join(self.root, "records.jsonl")
        self._cache = None

    def records(self):
        """Every record, in filing order (re-read when the file changed)."""
        stamp = os.stat(self.path).st_mtime_ns if os.path.exists(self.path) else None
        if self._cache is None or self._cache[0] != stamp:
            rows = []
            if stamp is not None:
                with open(self.path) as f:
                    rows = [json.loads(line) for line in f if line.strip()]
            self._cache = (stamp, rows)
        return self._cache[1]

    def get(self, key):
        return next((r for r in self.records() if r["key"] == key), None)

    def find(self, grid=None, cell=None, seed=None):
        return [r for r in self.records() if (grid is None or r.get("grid") == grid)
                and (cell is None or r.get("cell") == cell) and (seed is None or r.get("seed") == seed)]

    def outputs_path(self, key, row=None):
        return os.path.join(self.root, "outputs", f"{key}.{row}.txt.gz" if row else f"{key}.txt.gz")

    def outputs(self, record, row=None):
        """The record's per-example outputs (``row``: those of the row of its 'also'), a list of lines."""
        with gzip.open(self.outputs_path(record["key"], row), "rt") as f:
            return f.read().splitlines()

    def references(self, record):
        """The references the record's outputs are scored against, a list of lines (None when it names none)."""
        if not record.get("references"):
            return None
        with gzip.open(os.path.join(self.root, "references", f"{record['references']}.txt.gz"), "rt") as f:
            return f.read().splitlines()

    def _file_references(self, path):
        """Copy a references file in by the sha256 of its bytes; returns that name."""
        with open(path, "rb") as f:
            data = f.read()
        name = hashlib.sha256(data).hexdigest()
        dest = os.path.join(self.root, "references", f"{name}.txt.gz")
        if not os.path.exists(dest):
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with gzip.GzipFile(dest + ".tmp", "wb", mtime=0) as out:
                out.write(data)
            os.replace(dest + ".tmp", dest)
        return name

    def _append(self, record, outputs_files=()):
        """File a record and its outputs (``outputs_files``: (row or None, text file) pairs, gzipped in)."""
        os.makedirs(os.path.join(self.root, "outputs"), exist_ok=True)
        with open(self.path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._cache = None
            if self.get(record["key"]) is not None:
                return self.get(record["key"])
            for row, outputs_file in outputs_files:
                dest = self.outputs_path(record["key"], row)
                with open(outputs_file, "rb") as src, gzip.GzipFile(dest + ".tmp", "wb", mtime=0) as dst:
                    shutil.copyfileobj(src, dst)
                os.replace(dest + ".tmp", dest)
            with open(self.path, "a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self._cache = None
        return record

    def add(self, key, grid, cell, seed, result, work):
        """File one cell's WORK/result.json and its outputs."""
        record = dict(result, key=key, grid=grid, cell=cell, seed=seed)
        if result.get("references"):
            record["references"] = self._file_references(result["references"])
        files = [(None, result.get("outputs"))] + [(row, also.get("outputs"))
                                                   for row, also in (result.get("also") or {}).items()]
        files = [(row, os.path.join(work, path)) for row, path in files if path]
        for _, path in files:
            if not os.path.exists(path):
                raise FileNotFoundError(f"{work}/result.json names missing outputs {os.path.relpath(path, work)}")
        return self._append(record, files)

    def merge(self, other):
        """Another store's records (a device call's, carried back) that this one lacks; returns how many."""
        added = 0
        for record in other.records():
            if self.get(record["key"]) is None:
                for row in [None] + list(record.get("also") or {}):
                    source = other.outputs_path(record["key"], row)
                    if os.path.exists(source):
                        os.makedirs(os.path.join(self.root, "outputs"), exist_ok=True)
                        shutil.copyfile(source, self.outputs_path(record["key"], row))
                if record.get("references"):
                    name = f"{record['references']}.txt.gz"
                    os.makedirs(os.path.join(self.root, "references"), exist_ok=True)
                    shutil.copyfile(os.path.join(other.root, "references", name),
                                    os.path.join(self.root, "references", name))
                self._append(record)
                added += 1
        return added

    def commit(self, message):
        """git add + commit the store alone (the cell's record lands even if the session ends next)."""
        top = subprocess.run(["git", "-C", self.root, "rev-parse", "--show-toplevel"], capture_output=True, text=True)
        if top.returncode != 0:
            return
        parts = [p for p in ("records.jsonl", "outputs", "references") if os.path.exists(os.path.join(self.root, p))]
        subprocess.run(["git", "-C", self.root, "add", *parts], check=True)
        subprocess.run(["git", "-C", self.root, "commit", "-q", "-m", message, "--", *parts], check=False)
