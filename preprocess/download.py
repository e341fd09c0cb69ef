"""Downloading and unpacking corpus archives (for users with internet access; idempotent)."""
import os
import tarfile
import urllib.request
import zipfile

from .textio import DataError, log


def download(url: str, dest_dir: str) -> str:
    """Fetch ``url`` into ``dest_dir`` unless already there; returns the local path."""
    os.makedirs(dest_dir, exist_ok=True)
    path = os.path.join(dest_dir, os.path.basename(url.split("?")[0]))
    if os.path.isfile(path) and os.path.getsize(path) > 0:
        log(f"already downloaded: {path}")
        return path
    log(f"downloading {url}")
    tmp = path + ".part"
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0)
            done = 0
            while True:
                chunk = response.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
                done += len(chunk)
                if total:
                    print(f"\r  {done >> 20} / {total >> 20} MiB", end="", flush=True)
        print()
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise DataError(f"could not download {url}: {e}. Download it by hand into {dest_dir} and rerun.") from e
    os.replace(tmp, path)
    return path


def extract(archive: str, dest_dir: str) -> str:
    """Unpack a .tgz/.tar.gz/.zip archive into ``dest_dir`` (once)."""
    stamp = os.path.join(dest_dir, "." + os.path.basename(archive) + ".extracted")
    if os.path.isfile(stamp):
        return dest_dir
    log(f"extracting {archive}")
    os.makedirs(dest_dir, exist_ok=True)
    if archive.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            z.extractall(dest_dir)
    else:
        with tarfile.open(archive) as t:
            t.extractall(dest_dir, filter="data") if hasattr(tarfile, "data_filter") else t.extractall(dest_dir)
    open(stamp, "w").close()
    return dest_dir
