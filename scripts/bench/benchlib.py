"""What the benchmark scripts of scripts/bench/ share: where things are (the checkout, the shipped teacher, the
data beside it), one way to run a command (threads, environment, log), the device and precision flags, the
provenance of a table (command, machine, threads, date) and the report (Markdown + JSON + PNG).

A script imports it as a module (``python scripts/bench/x.py`` puts scripts/bench/ on ``sys.path``)::

    from benchlib import ROOT, run, default_out, provenance, write_report, ...

Outputs go under ``work/`` by default (:func:`default_out`), ``results/`` only when ``--out results/...`` is
given, so a user's run never overwrites the committed tables. Training is the recipes' (scripts/recipes/), run
over grids by scripts/experiments/grid.py; nothing here trains a method."""
import json
import os
import platform
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "experiments"))  # the drivers import record, store, grid by name
# data that does not ship with the package (GLUE TSVs, IWSLT'14, the original teacher file): beside the checkout
SHARED = os.environ.get("FAIRSEQ_COMPRESS_SHARED", os.path.join(os.path.dirname(ROOT), "shared"))
WORK = os.path.join(ROOT, "work")  # what a run writes, unless told otherwise (git ignores it)
if ROOT not in sys.path:  # the package (user_dir, preprocess) for the steps drivers run in-process
    sys.path.insert(0, ROOT)


# ---- logging and running commands --------------------------------------------------------------------
def logger(name):
    """``log(msg)`` printing ``[name HH:MM:SS] msg``."""
    def log(msg):
        print(f"[{name} {time.strftime('%H:%M:%S')}] {msg}", flush=True)
    return log


def environment(threads):
    """The one environment every command of a benchmark runs in: ``threads`` OpenMP/MKL threads (torch's
    intra-op threads), the checkout on PYTHONPATH (user_dir, preprocess), and no switch that disables
    torch's weights-only loading (a user's shell does not have it; the checkpoints must load without it)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    return env


def command_line(cmd):
    return " ".join(shlex.quote(str(c)) for c in cmd)


def run(cmd, logfile, threads):
    """Run ``cmd`` from the checkout in :func:`environment`, its output appended to ``logfile`` after a
    ``$ command`` line; a failure stops the benchmark naming the log."""
    os.makedirs(os.path.dirname(os.path.abspath(logfile)), exist_ok=True)
    with open(logfile, "a") as f:
        f.write(f"$ {command_line(cmd)}\n")
        f.flush()
        proc = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=environment(threads),
                              cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"{os.path.basename(sys.argv[0]) or 'benchmark'}: command failed ({proc.returncode}); see {logfile}")


def invocation(script, argv):
    """The command line that made a table: ``python scripts/bench/<script> <args>``."""
    args = sys.argv[1:] if argv is None else argv
    return f"python scripts/bench/{script}" + ("" if not args else " " + command_line(args))


def rel(path):
    """A path as the JSON keeps it: relative to the checkout when inside it."""
    real = os.path.abspath(path)
    return os.path.relpath(real, ROOT) if real.startswith(ROOT + os.sep) else real


def default_out(name):
    """Where a driver writes its table unless ``--out`` is given: under work/, never over results/."""
    return os.path.join(WORK, "results", name)


# ---- the report: provenance, Markdown, JSON, PNG ---------------------------------------------------------
def machine():
    """CPU model, cores, torch and Python (user_dir.tools.measure's description) and the 1-minute load."""
    from user_dir.tools.measure import machine_description

    return f"{machine_description()}; load average {os.getloadavg()[0]:.2f}"


def provenance(script, argv, threads, seeds):
    """Who made a table: the command line, machine (CPU model, cores, load), threads, seeds and date."""
    return {"command": invocation(script, argv), "machine": machine(), "threads": threads,
            "seeds": list(seeds), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "platform": platform.platform()}


def provenance_text(p):
    seeds = f"; seed{'s' if len(p['seeds']) > 1 else ''} {', '.join(map(str, p['seeds']))}" if p["seeds"] else ""
    return f"Made by `{p['command']}` on {p['date']}; {p['machine']}; {p['threads']} thread(s) per run{seeds}."


def write_text(path, text):
    """Write a whole file (a temporary file renamed): a reader never sees half a table."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def write_json(path, data):
    write_text(path, json.dumps(data, indent=1))


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None (with a note) where matplotlib is not installed."""
    try:
        import logging

        import matplotlib
        logging.getLogger("matplotlib").setLevel(logging.WARNING)
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install -e '.[plot]')", file=sys.stderr)
        return None
    return plt


def plot_panels(png, panels, command=None, shape=None, figsize=None, dpi=120, title=None, sharex=False, plt=None):
    """The one plot of every driver: a metric against a cost, one panel (axes) per entry of ``panels``, written
    to ``png`` with ``command`` (the command line that made it) in the PNG's Description metadata. A driver says
    only what is its own, the series and their labels::

        panel = {"series": [series, ...], "xlabel": ..., "ylabel": ..., "title": ..., "title_size": points,
                 "xscale"/"yscale": "log", "hlines": [{"y": 1.1, **line style}], "vlines": [{"x": ..., ...}],
                 "grid": True, "legend": {legend kwargs} (absent or None: no legend)}
        series = {"x": [...], "y": [...], "kind": "plot" (default) | "step" | "errorbar", "style": "o-",
                  "notes": [a label per point], "note_offset": (dx, dy) points or one per point (absent: at the
                  point), "note_y": [a label height per point, in data units: labels moved apart],
                  "note_style": {annotate kwargs}, **matplotlib kwargs (label, marker, ls, color, yerr, ...)}

    ``shape`` (rows, columns): default one row; ``figsize``: default 6 x 4 inches a panel; ``title``: above all.
    ``plt``: pyplot when the caller has it (:func:`write_report`'s ``plot``). Returns ``png``, or None where
    matplotlib is missing or there is no panel."""
    if not panels:
        return None
    plt = plt or pyplot()
    if plt is None:
        return None
    from matplotlib.transforms import offset_copy

    rows, cols = shape or (1, len(panels))
    fig, axes = plt.subplots(rows, cols, figsize=figsize or (6 * cols, 4 * rows), squeeze=False, sharex=sharex)
    for ax, panel in zip(axes.flat, panels):
        for s in panel.get("series", []):
            s = dict(s)
            x, y, kind, style = s.pop("x"), s.pop("y"), s.pop("kind", "plot"), s.pop("style", None)
            notes, offset, note_y = s.pop("notes", None), s.pop("note_offset", None), s.pop("note_y", None)
            note_style = s.pop("note_style", {})
            getattr(ax, kind)(x, y, *([style] if style else []), **s)
            for i, note in enumerate(notes or []):
                at = offset[i] if isinstance(offset, list) else offset
                if note_y is not None:  # the label at its own height, ``at`` points to the right of its point
                    ax.annotate(note, (x[i], y[i]), xytext=(x[i], note_y[i]), va="center", **note_style,
                                textcoords=offset_copy(ax.transData, fig=fig, x=at[0], y=at[1], units="points"))
                elif at is not None:
                    ax.annotate(note, (x[i], y[i]), textcoords="offset points", xytext=at, **note_style)
                else:
                    ax.annotate(note, (x[i], y[i]), **note_style)
        for line in panel.get("hlines", []):  # {"y": ..., **line style}: axhline's own keywords
            ax.axhline(**line)
        for line in panel.get("vlines", []):
            ax.axvline(**line)
        for axis in ("x", "y"):
            if panel.get(f"{axis}scale"):
                getattr(ax, f"set_{axis}scale")(panel[f"{axis}scale"])
            if panel.get(f"{axis}label"):
                getattr(ax, f"set_{axis}label")(panel[f"{axis}label"])
        if panel.get("title"):
            ax.set_title(panel["title"], **({"fontsize": panel["title_size"]} if panel.get("title_size") else {}))
        if panel.get("grid"):
            ax.grid(alpha=0.3)
        if panel.get("legend") is not None:
            ax.legend(**panel["legend"])
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=dpi, metadata={"Description": command} if command else None)
    plt.close(fig)
    return png


def write_report(md_path, text, json_path=None, data=None, plot=None, png_path=None):
    """The report's three files: Markdown ``text`` at ``md_path``, ``data`` as JSON at ``json_path``, and
    ``plot(plt, png_path)`` drawn with matplotlib when given. Returns the paths written."""
    written = []
    if json_path is not None:
        write_json(json_path, data)
        written.append(json_path)
    write_text(md_path, text)
    written.append(md_path)
    if plot is not None:
        plt = pyplot()
        if plt is not None and plot(plt, png_path) is not False:
            written.append(png_path)
    return written
