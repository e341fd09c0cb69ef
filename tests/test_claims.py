"""scripts/bench/claims.py: each claim re-tested from per-example outputs by the cluster test, in the paper's terms
(a threshold, a parity margin or a retention ratio), Holm over the table, verdicts with their budget; a row
without outputs says it was not recomputed and never shows the old interval (issue 44); a retention row computes its
controls' ratios, a row may re-test in the paper's metric, and every row gives its detectable difference (issue 58)."""
import json
import os
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "scripts", "bench"))
import claims  # noqa: E402
from user_dir.common.significance import pack  # noqa: E402

REFS = [f"a man number {i} rides a red bicycle down the old street" for i in range(40)]


def drop(words, k):
    return [" ".join(r.split()[:-k]) for r in words]


def spec(**kw):
    base = dict(method="X", kind="better", threshold=0.0, claim="A beats B", paper="Paper Table 1",
                budget="100 updates on a CPU", selection="nothing chosen", json="results/claims/x.json",
                label=r"^A vs B$", command="python scripts/bench_x.py --seeds 1,2,3")
    return dict(base, **kw)


def old_row(label="A vs B", a=30.0, b=29.0, **extra):
    """A comparison as the drivers wrote them before issue 44: no outputs, a (seed, example) interval."""
    return dict({"label": label, "a": a, "b": b, "diff": a - b, "low": 0.8, "high": 1.2, "p": 0.001, "seeds": 3,
                 "metric": "sacreBLEU", "a_name": "A", "b_name": "B"}, **extra)


def write_table(root, data, name="x"):
    os.makedirs(os.path.join(root, "results", "claims"), exist_ok=True)
    with open(os.path.join(root, "results", "claims", f"{name}.json"), "w") as f:
        json.dump(data, f)


def row_of(text, method):
    return next(line for line in text.splitlines() if line.startswith(f"| {method} |"))


def test_rows_are_retested_from_kept_outputs_with_holm_and_budget(tmp_path, monkeypatch):
    # A reproduces the references on every seed, B drops 2-4 words: A better on every seed. C == B: parity holds
    # for any margin with interval [0, 0]... but TOST's p needs the margin outside every draw
    a, b = [REFS] * 3, [drop(REFS, k) for k in (2, 3, 4)]
    outputs = pack({"a": a, "b": b, "references": REFS})
    same = pack({"a": b, "b": b, "references": REFS})
    write_table(tmp_path, {"comparisons": [old_row(outputs=outputs), old_row("C vs B", 20, 20, outputs=same)]})
    monkeypatch.setattr(claims, "CLAIMS", [spec(), spec(method="Y", kind="parity", margin=1.0, label="^C vs B$",
                                                        claim="C on par with B")])
    text = claims.render(str(tmp_path), ["--out", "x"])
    row = row_of(text, "X")
    cells = [c.strip() for c in row.split("|")]
    assert "reproduced at 100 updates on a CPU" in row and "not recomputed" not in row
    assert cells[12].startswith("+") and "[+" in cells[12]  # the new interval, above 0
    per_seed = cells[13]
    assert per_seed.count(",") == 2 and "mean +" in per_seed
    p, holm_p = float(cells[14]), float(cells[15])
    assert holm_p == pytest.approx(min(1.0, 2 * p))  # two re-tested rows; Y's TOST p is 1 / (R + 1), the smaller
    parity = row_of(text, "Y")
    assert "+0.00 [+0.00, +0.00]; 90% [+0.00, +0.00]" in parity and "| reproduced at 100 updates on a CPU |" in parity


def test_a_row_without_outputs_is_not_presented_as_the_new_test(tmp_path, monkeypatch):
    rows = [{"name": "A", "bleu": {"values": {"1": 9.0}}, "sacrebleu": {"values": {"1": 30.0, "2": 31.0, "3": 29.0}}},
            {"name": "B", "sacrebleu": 29.0}]  # B without seeds (a teacher): one score for every seed
    write_table(tmp_path, {"comparisons": [old_row()], "rows": rows, "command": "python scripts/bench_x.py --seeds 1,2,3"})
    missing = spec(method="M", json="results/claims/missing.json")
    monkeypatch.setattr(claims, "CLAIMS", [spec(), missing])
    text = claims.render(str(tmp_path), ["--out", "x"])
    row = row_of(text, "X")
    assert "not recomputed with the cluster test (per-example outputs not kept); rerun: " in row
    assert "python scripts/bench_x.py --seeds 1,2,3" in row and "+1.00 (no interval" in row
    # each seed's A - B from the table's own per-seed scores of the comparison's metric (sacreBLEU, not BLEU (tok))
    assert "| +1.00, +2.00, +0.00 (mean +1.00 +- 1.00), the table's sacreBLEU |" in row
    assert "[+0.80, +1.20]" not in text and "reproduced" not in row  # the old interval and its verdict are gone
    assert "not measured yet" in row_of(text, "M")


def test_work_hypotheses_are_collected_into_results_and_used_next_time(tmp_path, monkeypatch):
    """The GhostBERT translation rerun keeps hypotheses under work/: the table names them; claims.py tests from
    them and keeps them under results/claims/outputs/, so the next rendering needs no work folder."""
    work = tmp_path / "work"
    os.makedirs(work)
    (work / "refs.txt").write_text("\n".join(REFS) + "\n")
    files = {}
    for name, k in (("ghost", 1), ("pruned", 3)):
        files[name] = {}
        for seed in (1, 2, 3):
            path = work / f"{name}{seed}.txt"
            path.write_text("\n".join(drop(REFS, k + (seed == 3))) + "\n")
            files[name][str(seed)] = f"work/{name}{seed}.txt"
    import sacrebleu

    pooled = {n: sacrebleu.corpus_bleu([line for seed in (1, 2, 3) for line in drop(REFS, k + (seed == 3))],
                                       [REFS * 3]).score for n, k in (("ghost", 1), ("pruned", 3))}
    part = {"references": "work/refs.txt",
            "comparisons": [old_row("A vs B, m = 1/4", a=pooled["ghost"], b=pooled["pruned"], a_name="ghost",
                                    b_name="pruned")],
            "rows": [{"m": "2/4", "variant": "ghost", "hypotheses": "work/other-width.txt"}]  # another width's
            + [{"m": "1/4", "variant": n, "hypotheses": f} for n, f in files.items()]}
    write_table(tmp_path, {"translation": part})
    monkeypatch.setattr(claims, "CLAIMS", [spec(label="^A vs B")])
    runs = {f"{n}-s{seed}": {"method": n, "seed": seed, "sacrebleu_last": 30.0 + seed * (n == "ghost")}
            for n in ("ghost", "pruned") for seed in (1, 2, 3)}  # one row per seed, as PET's table keeps them
    assert claims.seed_differences({"runs": runs}, part["comparisons"][0])["per_seed"] == [1.0, 2.0, 3.0]
    stale = json.loads(json.dumps(part))  # a table whose pooled scores are not those files': another run's
    stale["comparisons"][0]["a"] += 0.5
    write_table(tmp_path, {"translation": stale})
    assert "not recomputed" in row_of(claims.render(str(tmp_path), ["--out", "x"]), "X")
    assert not os.path.exists(tmp_path / "results" / "claims" / "outputs")
    write_table(tmp_path, {"translation": part})
    first = claims.render(str(tmp_path), ["--out", "x"])
    assert "reproduced at 100 updates on a CPU" in row_of(first, "X")
    assert "collected from work/" in first
    assert os.path.isfile(tmp_path / "results" / "claims" / "outputs" / "x.json")
    for f in work.iterdir():
        f.unlink()
    again = claims.render(str(tmp_path), ["--out", "x"])
    assert row_of(again, "X") == row_of(first, "X")


def test_retention_and_drop_bound_rows(tmp_path, monkeypatch):
    labels = [1] * 200
    teacher, a = [1] * 200, [1] * 190 + [0] * 10
    write_table(tmp_path, {"comparisons": [
        old_row("A vs the teacher", 95, 100, metric="accuracy",
                outputs=pack({"a": [a] * 3, "b": [teacher] * 3, "labels": labels}))]})
    monkeypatch.setattr(claims, "CLAIMS", [
        spec(method="R", kind="retention", ratio=0.9, label="vs the teacher"),
        spec(method="D", threshold=-10.0, label="vs the teacher"),  # a drop of 5 points, under 10
        spec(method="E", threshold=-1.0, label="vs the teacher")])  # ... not under 1 (interval -5 +- 3)
    text = claims.render(str(tmp_path), ["--out", "x"])
    r = row_of(text, "R")
    assert "| 0.950 [0.9" in r and "0.950, 0.950, 0.950" in r and "reproduced at" in r  # 0.95 +- 0.03
    assert "| reproduced at" in row_of(text, "D") and "| not reproduced at" in row_of(text, "E")


def test_variator_cost_cell_puts_speed_beside_flops():
    data = json.load(open(os.path.join(REPO, "results", "claims", "variator_mt.json")))
    cell = claims.variator_cost("translation")(data)
    cost = data["translation"]["cost"]
    encoder = next(r for r in cost["rows"] if r.get("encoder_flops_saved_percent"))["speedup"]
    e2e = cost["end_to_end"]["rows"][1]["speedup"]
    assert "encoder FLOPs -44.9%" in cell and "(its FFNs' -73.0%)" in cell
    # the measured speed-ups beside the FLOPs, as the JSON holds them (median [min, max] over the timed runs)
    assert f"encoder speed x{encoder['median']:.2f} [{encoder['min']:.2f}, {encoder['max']:.2f}]" in cell, cell
    assert f"end-to-end speed x{e2e['median']:.2f} [{e2e['min']:.2f}, {e2e['max']:.2f}]" in cell, cell


def test_glue_rows_say_what_chose_from_their_tables_data(tmp_path, monkeypatch):
    """A GLUE row's "what chose what" is read from its table: a table measured on data with the held-out slice of
    train (settings' selection from glue_bench.selection_record) says the slice chose and dev only reported; an
    older table, and one prepared with --select-fraction 0, say dev both chose and reported."""
    held_out = {"subset": "valid", "source": "train", "fraction": 0.1, "seed": 1, "report": "dev"}
    on_dev = dict(held_out, source="dev", fraction=0)
    write_table(tmp_path, {"SST-2": {"comparisons": [old_row()], "settings": {"lr": 1e-4, "selection": held_out}}}, "new")
    write_table(tmp_path, {"SST-2": {"comparisons": [old_row()], "settings": {"lr": 1e-4}}}, "old")
    write_table(tmp_path, {"MRPC": {"comparisons": [old_row()], "settings": {"selection": on_dev}}}, "zero")
    ghost = claims.glue_selection(" and the pruned heads and neurons (importance)")
    monkeypatch.setattr(claims, "CLAIMS", [
        spec(method="N", json="results/claims/new.json", selection=ghost),
        spec(method="O", json="results/claims/old.json", selection=ghost),
        spec(method="Z", json="results/claims/zero.json", selection=claims.glue_selection(extra="; batches chose")),
        spec(method="T", selection="nothing chosen")])
    text = claims.render(str(tmp_path), ["--out", "x"])
    new, old, zero = (row_of(text, m).split("|")[6] for m in "NOZ")
    assert "('valid', 0.1 of train" in new and "chose the teacher's learning rate and checkpoint and the pruned " \
        "heads and neurons (importance); GLUE's dev set reports the last checkpoint's score and chose nothing" in new
    assert "dev both chose and reported" in old and "importance" in old and "held out" not in old
    assert "dev both chose and reported" in zero and zero.rstrip().endswith("; batches chose")
    assert row_of(text, "T").split("|")[6].strip() == "nothing chosen"
    # the notes name which rows chose on the held-out slice and which on dev
    notes = text[text.index("Notes:"):]
    assert "GLUE rows chosen on a held-out slice of train (A beats B)" in notes
    assert "GLUE rows measured before the held-out slice (A beats B; A beats B)" in notes


def test_the_committed_claims_table_is_what_the_script_writes_from_the_committed_json():
    """results/claims.md (what README quotes) is scripts/bench/claims.py's rendering of results/claims/*.json as committed:
    no row edited by hand, none left behind by a newer measurement."""
    import re

    with open(os.path.join(REPO, "results", "claims.md"), encoding="utf-8") as f:
        committed = f.read()
    # the blocks rendered from the store are tests/test_rendered.py's: compared here with their contents left out
    empty = re.sub(r"(<!-- rendered: [\w-]+ -->\n).*?(<!-- /rendered -->)", r"\1\2", committed, flags=re.S)
    assert empty == claims.render(REPO, ["--out", "results/claims.md"])


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


def test_tokenisation_note_reads_its_numbers_from_the_apc_table(tmp_path):
    """The note on BLEU (tok) against sacreBLEU names every system of results/claims/apc_mt.json whose two means
    differ by more than 0.05 (with each seed's pair) and the largest gap of the others, all read from the table:
    a rerun that moves a score moves the note."""
    def row(name, tok, sacre):
        return {"name": name, "bleu_tok": {"mean": sum(tok) / 3, "values": dict(zip("123", tok))},
                "sacrebleu": {"mean": sum(sacre) / 3, "values": dict(zip("123", sacre))}}
    table = {"sizes": {"measure": {"rows": [row("teacher", [36.0] * 3, [36.03] * 3),
                                            row("pruning+FT 128", [34.0, 35.0, 36.0], [35.0, 35.5, 36.0])]}},
             "word-kd": {"measure": {"rows": [row("teacher", [36.0] * 3, [36.03] * 3),
                                              row("word-KD student 128", [20.0] * 3, [20.02] * 3)]}}}
    assert claims.tokenisation_note(str(tmp_path)) == []  # no table, no note
    os.makedirs(tmp_path / "results" / "claims")
    (tmp_path / claims.APC_MT_JSON).write_text(json.dumps(table))
    note, = claims.tokenisation_note(str(tmp_path))
    assert note.startswith("- Tokenised BLEU vs sacreBLEU (results/claims/apc_mt.md, pruning+FT 128: 35.00 vs 35.50, "
                           "seed 1 34.00 vs 35.00, seed 2 35.00 vs 35.50, seed 3 36.00 vs 36.00; every other system "
                           "within 0.03): degenerate hypotheses.")
    table["sizes"]["measure"]["rows"][1] = row("pruning+FT 128", [35.0] * 3, [35.01] * 3)
    (tmp_path / claims.APC_MT_JSON).write_text(json.dumps(table))
    assert claims.tokenisation_note(str(tmp_path)) == []  # every gap within 0.05: nothing to explain


def test_a_drivers_table_marks_rows_of_the_older_test():
    """benchlib.significance_lines re-rendering an older table (--report-only): its rows keep their numbers but are
    marked as the older (seed, example) test, and the note says why, so no old interval passes for the new test."""
    from benchlib import significance_lines

    new = dict(old_row("C vs D"), per_seed=[0.5, 1.5], per_seed_mean=1.0, per_seed_std=0.71, verdict="A better")
    lines = significance_lines([dict(old_row(), verdict="A better"), new], "T")
    assert "Rows marked as an older test" in lines[0] and "sqrt(k) too narrow" in lines[0]
    assert lines[4].endswith("| - (an older (seed, example) test: intervals too narrow) | A better |")
    assert lines[5].endswith("| +0.50, +1.50 (mean +1.00 +- 0.71) | A better |")
    assert "older test" not in significance_lines([new], "T")[0]


# ---- issue 58: controls beside a retention ratio, a re-test in the paper's metric, the detectable difference -----
def cells_of(text, method):
    import re

    return [c.strip() for c in re.split(r"(?<!\\)\|", row_of(text, method))]


def test_a_retention_row_shows_its_controls_ratios_and_says_when_a_control_passes_too(tmp_path, monkeypatch):
    """Beside A's ratio to the teacher, the row computes a control's (another comparison of the table against the
    same teacher) and a constant majority-class predictor's by the same test; the verdict says the control passes
    too, so the test does not tell A from it."""
    from user_dir.common.significance import glue_statistics, retention

    labels = [1] * 140 + [0] * 60  # majority class 1
    teacher = labels[:130] + [0] * 10 + labels[140:]  # 10 positives missed
    a = [labels[:135] + [0] * 5 + labels[140:]] * 3  # 5 missed: above the teacher
    control = [labels[:132] + [0] * 8 + labels[140:]] * 3
    write_table(tmp_path, {"comparisons": [
        old_row("A vs the teacher", metric="f1", outputs=pack({"a": a, "b": [teacher] * 3, "labels": labels})),
        old_row("C vs the teacher", metric="f1", outputs=pack({"a": control, "b": [teacher] * 3, "labels": labels}))]})
    monkeypatch.setattr(claims, "CLAIMS", [spec(
        method="R", kind="retention", ratio=0.9, label="^A vs the teacher",
        controls=[dict(name="the C control", label="^C vs the teacher"),
                  dict(name="a constant predictor", constant="majority", classes={1: "yes"})])])
    text = claims.render(str(tmp_path), ["--out", "x"])
    cells = cells_of(text, "R")

    def ratio(preds):
        r = retention(glue_statistics(preds, labels, "f1"), glue_statistics([teacher] * 3, labels, "f1"), "f1")
        return f"{r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"
    constant = 2 * 140 / (2 * 140 + 60) / (2 * 130 / (2 * 130 + 10))  # F1 of always 1 / the teacher's F1
    assert cells[12] == (f"{ratio(a)}; the C control {ratio(control)}; a constant predictor (1, 'yes') "
                         f"{ratio([[1] * 200] * 3)}"), cells[12]
    assert ratio([[1] * 200] * 3).startswith(f"{constant:.3f} ")
    verdict = cells[18]
    assert verdict.startswith("reproduced at 100 updates on a CPU; the C control, by the same rule: reproduced too, "
                              "so the test does not tell R from the C control; a constant predictor (1, 'yes'), by "
                              "the same rule: "), verdict
    # the note gives every seed's ratio of each control, and the same test in accuracy
    note = next(line for line in text.splitlines() if "the same ratio test on f1" in line)
    assert "In accuracy, the MRPC metric the paper's average counts: R " in note


def test_a_glue_row_is_retested_in_the_metric_its_spec_names_from_the_same_predictions(tmp_path, monkeypatch):
    """GhostBERT's MRPC row: its table compares F1, the paper reports accuracy; the row re-tests the kept predictions
    in accuracy (A and B are the pooled accuracies) and the note says so."""
    labels = [1, 0] * 50
    a = [[1, 0] * 45 + [0, 1] * 5] * 3  # 90 of 100 right
    b = [[1, 0] * 40 + [0, 1] * 10] * 3  # 80 right
    write_table(tmp_path, {"comparisons": [old_row(metric="f1", outputs=pack({"a": a, "b": b, "labels": labels}))]})
    monkeypatch.setattr(claims, "CLAIMS", [spec(metric="accuracy")])
    text = claims.render(str(tmp_path), ["--out", "x"])
    cells = cells_of(text, "X")
    assert cells[8] == "accuracy" and cells[10] == "90.00" and cells[11] == "80.00" and cells[12].startswith("+10.00 [")
    assert "in accuracy (its table compares f1)." in text


def test_every_retested_row_gives_its_detectable_difference_and_the_papers_effect_beside_it(tmp_path, monkeypatch):
    """The detectable-difference cell is significance.detectable_difference from the row's own 95% interval (standard
    error: its width / 3.92), per-seed std and seeds; a row with paper_effect says how the paper's effect compares."""
    from user_dir.common.significance import detectable_difference

    labels = [1, 0] * 50
    a = [[1, 0] * 45 + [0, 1] * 5, [1, 0] * 47 + [0, 1] * 3, [1, 0] * 44 + [0, 1] * 6]
    b = [[1, 0] * 44 + [0, 1] * 6] * 3
    write_table(tmp_path, {"comparisons": [old_row(metric="accuracy", outputs=pack({"a": a, "b": b,
                                                                                   "labels": labels}))]})
    monkeypatch.setattr(claims, "CLAIMS", [spec(), spec(method="E", paper_effect=(0.1, "Table 1's effect"))])
    text = claims.render(str(tmp_path), ["--out", "x"])
    cells = cells_of(text, "X")
    head = text[text.index("| method |"):].splitlines()[0]
    assert [c.strip() for c in head.split("|")][16] == "detectable difference"
    low, high = (float(x) for x in cells[12].split("[")[1].rstrip("]").split(", "))
    seeds = [float(x) for x in cells[13].split(" (")[0].split(", ")]
    import statistics

    expected = detectable_difference((high - low) / 3.92, statistics.stdev(seeds), 3)["detectable"]
    assert float(cells[16]) == pytest.approx(expected, abs=0.02)  # the cell's interval and seeds are rounded
    effect = cells_of(text, "E")[16]
    assert effect.startswith(cells[16] + "; the paper's effect, Table 1's effect (+0.1), is 1/") and "far below" in effect


def test_the_committed_rows_of_issue_58_are_computed_from_their_tables():
    """results/claims.md as committed: the APC retention row's control and constant ratios, recomputed here from
    apc_mrpc.json's per-example predictions; GhostBERT's MRPC row in accuracy; the m = 12/12 row's detectable
    difference against the paper's +0.1; Variator's whole-model FLOPs from variator_mt.json's end-to-end rows."""
    from user_dir.common.significance import detectable_difference, glue_statistics, retention, unpack

    text = open(os.path.join(REPO, "results", "claims.md"), encoding="utf-8").read()
    rows = [line for line in text.splitlines() if line.startswith("| APC | APC-50-ff (Finalized analogue) retains")]
    assert len(rows) == 1
    data = json.load(open(os.path.join(REPO, "results", "claims", "apc_mrpc.json")))
    found = {c["label"]: unpack(c["outputs"]) for c, _ in claims.comparisons_in(data)}
    apc, control = found["APC-50-ff analogue, Finalized vs the teacher"], found["neuron pruning vs the teacher"]
    labels = apc["labels"]
    teacher = glue_statistics(apc["b"], labels, "f1")

    def cell(preds):
        r = retention(glue_statistics(preds, labels, "f1"), teacher, "f1")
        return f"{r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"
    majority = max(set(labels), key=labels.count)
    assert (f"| {cell(apc['a'])}; the neuron-pruning control {cell(control['a'])}; a constant predictor of the "
            f"majority class ({majority}, 'paraphrase') {cell([[majority] * len(labels)] * 3)} |") in rows[0]
    assert "the neuron-pruning control, by the same rule: reproduced too, so the test does not tell APC" in rows[0]
    ghost = next(line for line in text.splitlines() if line.startswith("| GhostBERT | ghost modules beat pruned-only "
                                                                       "at m = 3/12 on MRPC"))
    assert "| GhostBERT vs pruned only, m = 3/12 | accuracy | 3 |" in ghost
    unpruned = next(line for line in text.splitlines() if "(m = 12/12) beat it without them" in line)
    cells = [c.strip() for c in unpruned.split("|")]
    low, high = (float(x) for x in cells[12].split("[")[1].rstrip("]").split(", "))
    std = float(cells[13].split("+- ")[1].rstrip(")"))
    assert float(cells[16].split(";")[0]) == pytest.approx(detectable_difference((high - low) / 3.92, std, 3)
                                                           ["detectable"], abs=0.02)
    assert "the paper's effect, Table 1's SST-2 effect (+0.1)" in cells[16] and "far below" in cells[16]
    e2e = json.load(open(os.path.join(REPO, claims.VARIATOR_MT_JSON)))["translation"]["cost"]["end_to_end"]["rows"]
    saved = 100 * (1 - e2e[1]["profiler_flops"] / e2e[0]["profiler_flops"])
    note = next(line for line in text.splitlines() if line.startswith("- Variator: the paper 'only insert[s]"))
    assert f"-{saved:.1f}% of the whole model" in note and "plugins in encoder and decoder" not in text
