"""scripts/bench/benchlib.py, what the benchmark scripts share (the device flags, the plots), that every script of
scripts/bench/ imports it as a module (no script loads another), that no function is defined twice across scripts/,
and bleu_tokenisation.py's account of the BLEU (tok) and sacreBLEU gap."""
import glob
import os
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "scripts", "bench"))
import benchlib  # noqa: E402


def test_no_script_loads_another_script_and_every_driver_imports_as_a_module():
    """Issue 32: drivers once loaded one another through importlib. Now each imports benchlib and the shared modules
    by name (`python scripts/x.py` puts scripts/ on sys.path), and every script of scripts/bench/ answers --help
    from any folder."""
    for path in glob.glob(os.path.join(REPO, "scripts", "bench", "*.py")) + glob.glob(os.path.join(REPO, "scripts", "bench", "*.sh")):
        text = open(path).read()
        assert "spec_from_file_location" not in text, path
        assert "sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))" not in text, path
    for driver in sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "scripts", "bench", "*.py"))
                         if not p.endswith(("benchlib.py", "glue_bench.py"))):
        proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench", f"{driver}.py"), "--help"],
                              capture_output=True, text=True, cwd="/")
        assert proc.returncode == 0, (driver, proc.stderr[-2000:])


def test_no_function_name_is_defined_in_two_scripts():
    """Issue 46: what two drivers share lives once, in benchlib; a driver's own function is named after what it
    does (costs_table, serving_verdict, plot_ghost), so no top-level function name is defined in two files of
    scripts/ -- the entry points main, get_parser and cli_main excepted."""
    import ast
    import collections

    defined = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(REPO, "scripts", "**", "*.py"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defined[node.name].append(os.path.relpath(path, REPO))
    twice = {name: files for name, files in defined.items()
             if len(files) > 1 and name not in ("main", "get_parser", "cli_main")}
    assert not twice, f"defined in more than one script (move it to benchlib, or name it after its job): {twice}"


def test_one_plot_helper_draws_every_drivers_panels_with_the_command(tmp_path):
    """benchlib.plot_panels: panels of series (lines, steps, error bars) with their point labels and reference
    lines, the command line that made the plot in the PNG's Description; no panel, no file."""
    pytest.importorskip("matplotlib")
    from PIL import Image

    panels = [dict(series=[dict(x=[1, 2, 3], y=[30.0, 31.5, 32.0], style="o-", label="a", notes=["k=1", "k=2", "k=3"],
                                note_offset=(4, 4), note_style=dict(fontsize=7)),
                           dict(x=[2.5], y=[29.0], yerr=[0.5], kind="errorbar", fmt="o", notes=["b"], note_y=[29.2],
                                note_offset=(5, 0))],
                   hlines=[dict(y=31.0, ls="--", label="teacher")], xscale="log", xlabel="cost", ylabel="BLEU",
                   title="metric against cost", grid=True, legend=dict(fontsize=7)),
              dict(series=[dict(x=[0, 1, 2], y=[1, 3, 2], kind="step", where="post", label="answered")],
                   vlines=[dict(x=1, ls=":")], legend={})]
    png = str(tmp_path / "plot.png")
    assert benchlib.plot_panels(png, panels, command="python scripts/bench/x.py --out y", shape=(2, 1)) == png
    image = Image.open(png)
    assert image.info["Description"] == "python scripts/bench/x.py --out y" and image.size == (720, 960)  # 6x8 in
    assert benchlib.plot_panels(str(tmp_path / "none.png"), []) is None and not os.path.exists(tmp_path / "none.png")


def test_bleu_tokenisation_finds_the_degenerate_repeats_behind_the_gap(tmp_path, capsys):
    """scripts/bench/bleu_tokenisation.py on a hand-made log: 3 of 30 hypotheses repeat 's six times; BLEU (tok) counts six
    unmatched tokens, the detokeniser glues them into one 13a token ("7's's's's's's"), so sacreBLEU is higher;
    without those 3 both are 100. A BPE piece glued to the final period ('street.') is counted apart."""
    import bleu_tokenisation

    refs = [f"a man number {i} walks down the street ." for i in range(30)]
    hyps = [r.replace(f"{i} ", f"{i} " + "'s " * 6) if i % 10 == 7 else r for i, r in enumerate(refs)]
    hyps[0] = hyps[0].replace("street .", "street.")
    (tmp_path / "gen.log").write_text("".join(f"T-{i}\t{r}\nH-{i}\t-0.1\t{h}\n" for i, (r, h) in enumerate(zip(refs, hyps))))
    (tmp_path / "raw.en").write_text("\n".join(f"A man number {i} walks down the street." for i in range(30)) + "\n")
    bleu_tokenisation.main([str(tmp_path / "gen.log"), "--raw-references", str(tmp_path / "raw.en")])
    out = capsys.readouterr().out
    tok, sacre = (float(out.split(name)[1].split()[0]) for name in ("BLEU (tok)  ", "sacreBLEU   "))
    assert tok < sacre
    # 18 's and the 3 numbers they are glued to ("7's's's's's's" is one 13a token), and 'street.' (13a: 'street .')
    assert "tokens detokenising loses: 22, most: [(\"'s\", 18), ('street.', 1)," in out
    assert "hypothesis tokens 13a splits: 1, e.g. ['street.']" in out
    assert "hypotheses repeating a token 5+ times in a row: 3 (sentence ids [7, 17, 27])" in out
    # without the repeats only the glued period separates them
    assert "without them: BLEU (tok) 99.08, sacreBLEU 100.00 (gap +0.92, was +6.48)" in out
