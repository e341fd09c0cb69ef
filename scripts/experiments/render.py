#!/usr/bin/env python
"""Everything a reader sees, rendered from the store: the marked blocks of the project's Markdown pages.

    python scripts/experiments/render.py            # re-render every block in place
    python scripts/experiments/render.py --check    # exit 1 naming each block that is not current (the tests run it)

A block is the text between ``<!-- rendered: NAME -->`` and ``<!-- /rendered -->`` in PAGES; NAME is one of BLOCKS, a
function of the store (results/store), results/*.json and grids/claims.toml. Nobody types a result into a page."""
import argparse
import glob
import json
import os
import re
import shlex
import statistics
import sys
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, HERE]
import store as store_lib  # noqa: E402
from grid import Grid  # noqa: E402
from ladder import SCORING_STAGES, Ladder  # noqa: E402
from record import score_line  # noqa: E402

GRIDS = os.path.join(ROOT, "grids")
CLAIMS, QUICKSTART = os.path.join(GRIDS, "claims.toml"), os.path.join(GRIDS, "quickstart.toml")
BLOCK = re.compile(r"(<!-- rendered: ([\w-]+) -->\n)(.*?)(<!-- /rendered -->)", re.S)
METRIC_NAMES = {"sacrebleu": "sacreBLEU", "bleu_tok": "BLEU (tok)", "accuracy": "accuracy", "f1": "F1",
                "mcc": "Matthews corr.", "pearson": "Pearson", "spearman": "Spearman"}
PAGES = ("README.md", "results/*.md", "scripts/*.md", "user_dir/*/README.md", "user_dir/*/NOTES.md",
         "user_dir/GLOSSARY.md")
_EVALUATED = {}  # store root -> {claim id: its evaluated row}


def load_claims(path=CLAIMS):
    with open(path, "rb") as f:
        return tomllib.load(f)["claim"]


def head(columns):
    """A Markdown table's header and rule, for the columns 'A | B | ...'."""
    return [f"| {columns} |", "|" + " --- |" * (columns.count(" | ") + 1)]


def mean_text(values):
    """The mean of ``values``, with their standard deviation when there are two or more."""
    return f"{statistics.mean(values):.2f}" + (f" +- {statistics.stdev(values):.2f}" if len(values) > 1 else "")


def side(name):
    """A claim's side, 'CELL' (the cell's student) or 'CELL:ROW' (a row its records file beside it): (cell, row)."""
    cell, _, row = name.partition(":")
    return cell, row or None


def statistics_of(store, records, metric, row=None):
    """(seeds, n, d) statistics of each record's outputs (``row``: those of its 'also' row) against its references."""
    from user_dir.common.significance import GLUE_METRICS, bleu_statistics, glue_statistics
    from user_dir.tools.measure import detokenise

    if metric != "sacrebleu" and metric not in GLUE_METRICS:
        raise ValueError(f"metric {metric}: sacrebleu or one of {', '.join(GLUE_METRICS)}")
    references, outputs_of = None, []
    for record in records:
        outputs = store.outputs(record, row)
        refs = (store.references(record) or _any_references(store, record))[:len(outputs)]
        if references is not None and refs != references:
            raise ValueError(f"record {record['key'][:10]}: other references than its pair's")
        references = refs
        outputs_of.append(detokenise(outputs, "en") if metric == "sacrebleu" else [float(x) for x in outputs])
    if metric == "sacrebleu":
        return bleu_statistics(outputs_of, references)
    return glue_statistics(outputs_of, [float(x) for x in references], metric)


def _any_references(store, record):
    """References of a record filed before records named theirs: those of another record on the same data."""
    for other in store.records():
        if other.get("references") and other["data"]["fingerprint"] == record["data"]["fingerprint"]:
            return store.references(other)
    raise ValueError(f"record {record['key'][:10]} ({record['cell']} seed {record['seed']}) names no references and "
                     "no other record on its data does")


def rule_text(record):
    """The stopping rule of a record's variables: fixed epochs or updates per stage, else patience. A stage's
    variable (PRETRAIN_UPDATES) counts only when the record ran that stage (Variator without a pre-training corpus)."""
    v, ran = record["variables"], {c.get("stage") for c in record.get("commands") or [{"stage": None}]}
    fixed = [f"{v[k]} {k.lower().replace('_', ' ')}" for k in sorted(v) if v[k] and k.endswith(("_EPOCHS", "UPDATES"))
             and k != "MAX_EPOCHS" and ("_" not in k or None in ran or k.rsplit("_", 1)[0].lower() in ran)]
    if v.get("PATIENCE") and not (v.get("UPDATES") or v.get("KD_UPDATES")):
        fixed.append(f"patience {v['PATIENCE']} epochs on validation loss, at most {v.get('MAX_EPOCHS')} epochs")
    return ", ".join(fixed) or "-"


def epochs_text(records):
    """Epochs per seed and stage (the stopping rule's outcome), with the best epoch where one was chosen."""
    return ", ".join(f"s{x['seed']} " + " + ".join(
        f"{s['epochs']:g}" + (f" (best {s['best_epoch']})" if "best_epoch" in s else "")
        for s in x["training"].values() if s) for x in records)


def grid_rule(claim):
    """A waiting row's stopping rule: its A cell's variables as its grid sets them, else the grid's name."""
    path = os.path.join(GRIDS, f"{claim['grid']}.toml")
    cells = [x for x in Grid(path).cells if x.name == side(claim["a"])[0]] if os.path.exists(path) else []
    rule = rule_text({"variables": cells[0].variables}) if cells else "-"
    return rule if rule != "-" else f"grids/{claim['grid']}.toml's"


def default_malloc(record):  # made on a CPU before scripts/recipes/common.sh raised glibc's malloc threshold
    return not (record["machine"].get("malloc") or record["machine"].get("gpu"))


def device_text(records):
    gpus = {r["machine"].get("gpu") for r in records if r["machine"].get("gpu")}
    slow = sum(map(default_malloc, records))
    return ", ".join(sorted(gpus)) if gpus else (f"CPU ({records[0]['machine']['cpu']}, 1 thread a run" + (
        f"; {slow} of {len(records)} with glibc's default malloc threshold: slower on large outputs, see common.sh"
        if slow else "") + ")")


def origin(record):
    """What a record was made from: its teacher's weights and its data (a record of another is not current)."""
    return record["teacher"]["sha256"], record["data"]["fingerprint"]


def evaluate(store, claims):
    """Every claim's row: A's and B's records paired by seed, the test once both have its seeds, Holm's p."""
    from user_dir.common.glue_metrics import METRIC_FUNCTIONS
    from user_dir.common.significance import claim_verdict, cluster_test, detectable_difference, holm, retention

    def latest(claim, name, newest):  # {seed: the latest record of the side's cell (with the side's row)} like NEWEST
        cell, row = side(name)
        return {r["seed"]: r for r in store.find(grid=claim["grid"], cell=cell)
                if (row is None or row in (r.get("also") or {})) and newest and origin(r) == origin(newest[0])}

    def sized(c, seeds):  # the difference SEEDS paired seeds detect at comparison c's spread (its interval, seeds')
        return detectable_difference((c["high"] - c["low"]) / 3.92, c["per_seed_std"], seeds)

    rows = []
    for claim in claims:  # the origin of the claim's newest record: a teacher or data made again starts afresh
        newest = [r for r in store.find(grid=claim["grid"]) if r["cell"] in {side(claim[k])[0] for k in "ab"}][-1:]
        a, b = (latest(claim, claim[k], newest) for k in "ab")
        pairs = {s: (a[s], b[s]) for s in sorted(set(a) & set(b))}
        rows.append(row := {"claim": claim, "a_seeds": sorted(a), "b_seeds": sorted(b), "pairs": pairs})
        if (prior := claim.get("prior")) and "table" in prior:
            with open(os.path.join(ROOT, prior["table"])) as f:
                table = json.load(f)
            for part in prior.get("path", []):  # where the table keeps its comparisons (e.g. glue, MRPC)
                table = table[part]
            (p,) = [c for c in table["comparisons"] if c["label"] == prior["comparison"]]
            row["prior"] = dict(sized(p, claim.get("seeds", 3)), source=f"{prior['table']}, {prior['budget']}")
        if len(pairs) < claim.get("seeds", 3):
            continue
        row["records"] = recs = ([pairs[s][0] for s in pairs], [pairs[s][1] for s in pairs])
        stats = [statistics_of(store, rs, claim["metric"], side(claim[k])[1]) for rs, k in zip(recs, "ab")]
        if claim["test"] == "ratio":  # retention, A / B: a ratio interval, no p (outside Holm)
            row["result"] = retention(*stats, claim["metric"])
            row["verdict"] = claim_verdict(row["result"], kind="ratio", ratio=claim["ratio"])
            # beside it, a constant answer's (B's most frequent label for every example) over B's, on B's references
            score, record = METRIC_FUNCTIONS[claim["metric"]], recs[1][0]
            labels = [float(x) for x in (store.references(record) or _any_references(store, record))]
            row["constant_ratio"] = score([max(set(labels), key=labels.count)] * len(labels), labels) / score(
                [float(x) for x in store.outputs(record, side(claim["b"])[1])], labels)
            continue
        parity = claim["test"] == "parity"
        row["result"] = result = cluster_test(*stats, "bleu" if claim["metric"] == "sacrebleu" else claim["metric"],
                                              10000, margin=claim.get("margin") if parity else None,
                                              threshold=claim.get("threshold") or None)
        # the claim's own p: TOST's for parity, the bootstrap's against a drop bound, else the sign-flip p
        result["claim_p"] = result["tost_p" if parity else "threshold_p" if claim.get("threshold") else "p"]
        row["detectable"] = sized(result, result["seeds"])
    measured = {r["claim"]["id"]: r["result"] for r in rows if "detectable" in r}
    for row in rows:  # a prior naming a claim measured here (its cells at full budget, the same metric and examples)
        if (r := measured.get((row["claim"].get("prior") or {}).get("claim"))) and "result" not in row:
            row["prior"] = dict(sized(r, row["claim"].get("seeds", 3)),
                                source=f"claim {row['claim']['prior']['claim']}'s cells as measured")
    tested = [r for r in rows if "result" in r and r["claim"]["test"] != "ratio"]
    for row, p in zip(tested, holm([r["result"]["claim_p"] for r in tested])):
        row["holm_p"], c = p, row["claim"]
        row["verdict"] = claim_verdict(row["result"], c.get("threshold", 0.0), p=p,
                                       kind="parity" if c["test"] == "parity" else "better", margin=c.get("margin"))
    return rows


def per_seed_scores(records, metric, name):
    row = side(name)[1]
    values = [(r["also"][row] if row else r)["metrics"][metric] for r in records]
    return f"{mean_text(values)} ({', '.join(f'{v:.2f}' for v in values)})"


def evaluated(store, claims):
    """The rows of ``claims``, tested with Holm's correction over every claim of grids/claims.toml."""
    if store.root not in _EVALUATED:
        _EVALUATED[store.root] = {row["claim"]["id"]: row for row in evaluate(store, load_claims())}
    return [_EVALUATED[store.root][c["id"]] for c in claims]


def claims_table(store, claims):
    """The claims' table: per claim its test, each side's scores, the difference or ratio, its p's and verdict."""
    lines = head("claim | paper | metric | test | stopping rule | seeds | A | B | A - B [95%] | per-seed A - B | p "
                 "| Holm p | detectable difference | epochs trained (A; B) | CPU hours (A + B) | verdict")
    for row in evaluated(store, claims):
        c, ours = row["claim"], " (ours)" if row["claim"].get("ours") else ""
        start = f"| {c['claim']}{ours} | {c['paper']} | {METRIC_NAMES[c['metric']]} | " + (
            f"\\|A - B\\| < {c['margin']:g} (TOST; margin {c['margin_source']})" if c["test"] == "parity"
            else f"A / B > {c['ratio']:g} (retention: a two-sided 95% interval, no p)" if c["test"] == "ratio"
            else f"A - B > {c.get('threshold', 0.0):g}")
        if "result" not in row:
            seeds, d = c.get("seeds", 3), row.get("prior")
            detect = (f"about {d['detectable']:.2f} before running ({seeds} seeds; the spread of {d['source']}"
                      f"{reach(c, d)})") if d else "-"
            lines.append(f"{start} | {grid_rule(c)} | waiting: A {len(row['a_seeds'])}/{seeds} seeds, B "
                         f"{len(row['b_seeds'])}/{seeds} seeds in the store | - | - | - | - | - | - | {detect} | - | - "
                         "| not yet tested |")
            continue
        r, (recs_a, recs_b) = row["result"], row["records"]
        start = start.replace(f" | {METRIC_NAMES[c['metric']]} | ", f" | {METRIC_NAMES[c['metric']]} on "
                              f"{recs_a[0]['split']} ({recs_a[0]['sentences']:,} examples) | ", 1)
        cpu_hours = sum({x["key"]: x["cpu_s"] for x in recs_a + recs_b}.values()) / 3600  # a row of A's: once
        same = [x["key"] for x in recs_a] == [x["key"] for x in recs_b]  # B a row of A's records: trained once
        budget = f"A: {epochs_text(recs_a)}" + ("" if same else f"; B: {epochs_text(recs_b)}")
        if c["test"] == "ratio":
            result = (f"A / B {r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}] "
                      f"| {', '.join(f'{x:.3f}' for x in r['per_seed'])} | - | - | -")
            tail = f"; a constant answer (the most frequent label) keeps {row['constant_ratio']:.3f}"
        else:
            why = reach(c, row["detectable"], r)[2:]  # the paper's difference within reach or not; what bounds it
            result = (f"{r['diff']:+.2f} [{r['low']:+.2f}, {r['high']:+.2f}] | "
                      f"{', '.join(f'{d:+.2f}' for d in r['per_seed'])} | {r['p']:.3g} | {row['holm_p']:.3g} "
                      f"| {row['detectable']['detectable']:.2f}{f' ({why})' if why else ''}")
            tail = cost_text(c, recs_a)
        lines.append(f"{start} | {rule_text(recs_a[0])} | {r['seeds']} | {c['a']}: "
                     f"{per_seed_scores(recs_a, c['metric'], c['a'])} | {c['b']}: "
                     f"{per_seed_scores(recs_b, c['metric'], c['b'])} | {result} | {budget} "
                     f"| {cpu_hours:.1f} on {device_text(recs_a + recs_b)} | {row['verdict']} "
                     f"at this stopping rule{tail} |")
    return "\n".join(lines) + "\n"


def reach(claim, d, result=None):
    """Whether the paper's A - B ('effect') is as far from the test's bound as the row detects (``d``); what bounds d;
    measured (``result``), whether the paper's A - B lies outside the row's 95% interval (a difference that large is
    not what these students show)."""
    bound = "; the test examples bound it, not the seeds" if d["interval_part"] >= d["seeds_part"] else ""
    if (e := claim.get("effect")) is None:
        return bound
    room = claim["margin"] - abs(e) if claim["test"] == "parity" else abs(e - claim.get("threshold", 0.0))
    outside = ("" if result is None or result["low"] <= e <= result["high"] else
               f"; the paper's A - B lies {'above' if e > result['high'] else 'below'} this row's 95% interval")
    return (f"; the paper's A - B, {e:+.2f}, is {room:.2f} from the test's bound: "
            f"{'within' if room >= d['detectable'] else 'below'} what this row can detect{bound}{outside}")


def cost_text(claim, records):
    """The cost half of a claim that makes one (claims.toml's 'cost': the paper's saving), from A's records."""
    if not claim.get("cost"):
        return ""
    if not (costs := [r["cost"] for r in records if r.get("cost")]):
        return "; cost: not recorded"
    saved, speed, extra = (statistics.mean(c[k] for c in costs)
                           for k in ("encoder_flops_saved_percent", "speedup", "extra_params_percent"))
    whole = [r["sentences_per_s"] / r["also"]["teacher"]["sentences_per_s"] for r in records
             if r.get("sentences_per_s") and (r.get("also") or {}).get("teacher", {}).get("sentences_per_s")]
    whole_text = (f", the whole model x{statistics.mean(whole):.2f} the teacher's sentences/s (the recipe's "
                  "measurement, the two in turn)" if whole else "")
    return (f"; cost: {saved:.1f}% of the encoder's FLOPs saved with {extra:.1f}% extra parameters, the encoder "
            f"x{speed:.2f} faster at length {costs[0]['length']}{whole_text} (the paper: {claim['cost']})")


def claims_summary(store, claims):
    """One line per claim, for the README and the method pages."""
    out = []
    for row in evaluated(store, claims):
        c = row["claim"]
        start = f"- {c['claim']} (" + ("ours" if c.get("ours") else "the paper's claim") + "): "
        if "result" not in row:
            out.append(f"{start}not yet tested; cells in the store: A {len(row['a_seeds'])}/{c.get('seeds', 3)}, B "
                       f"{len(row['b_seeds'])}/{c.get('seeds', 3)}")
            continue
        r, ratio, recs_a = row["result"], c["test"] == "ratio", row["records"][0]
        score = (f"kept {r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}] (a constant answer: "
                 f"{row['constant_ratio']:.3f})" if ratio else f"{r['diff']:+.2f} [{r['low']:+.2f}, {r['high']:+.2f}]")
        out.append(f"{start}{METRIC_NAMES[c['metric']]} on {recs_a[0]['split']} {score}, {row['verdict']} at "
                   f"{rule_text(recs_a[0])}, {r['seeds']} seeds" + ("" if ratio else f"; it detects "
                   f"{row['detectable']['detectable']:.2f}{reach(c, row['detectable'], r)}{cost_text(c, recs_a)}"))
    return "\n".join(out) + "\n"


def student_sizes(grid_path, reference_cell, data_dictionaries, margin=0.04):
    """Each cell's non-embedding parameters against the reference cell's, built from its fairseq-train command."""
    from fairseq import options, tasks

    from user_dir.common.counting import count_parameters  # importing user_dir registers its architectures

    cells, sizes = Grid(grid_path).cells, []
    for cell in [c for i, c in enumerate(cells) if c.name not in {d.name for d in cells[:i]}]:
        words = shlex.split([line for line in cell.commands() if line.startswith("fairseq-train ")][-1])
        parsed = options.parse_args_and_arch(options.get_training_parser(), input_args=[
            a.replace("ROOT", ROOT) for a in [data_dictionaries] + words[2:]])
        count = count_parameters(tasks.setup_task(parsed).build_model(parsed))
        arch = " ".join(a for a in words if a.startswith("--") and any(
            k in a for k in ("arch", "layers", "embed-dim", "ffn", "heads")))
        sizes.append({"cell": cell.name, "arch": arch, "non_embedding": count.total - count.embedding})
    reference = next(s["non_embedding"] for s in sizes if s["cell"] == reference_cell)
    for size in sizes:
        size["vs_reference"] = 100.0 * (size["non_embedding"] / reference - 1)
        size["within"] = abs(size["non_embedding"] / reference - 1) <= margin
    return sizes


def sizes_table(grid_path, reference_cell):
    """The grid's students' non-embedding parameters against the reference cell's (student_sizes)."""
    lines = head("cell | non-embedding parameters | against PET | within 4%") + [
        f"| {s['cell']} | {s['non_embedding']:,} | {s['vs_reference']:+.2f}% | {'yes' if s['within'] else 'NO'} |"
        for s in student_sizes(grid_path, reference_cell, os.path.join(ROOT, "checkpoints", "multi30k.de-en"))]
    return "\n".join(lines) + "\n"


def ladder_run(store, ladder):
    """A ladder's latest run (None before any), its rows with quality lost, speed-ups and CPU hours to make."""
    if not os.path.exists(ladder.runs_file):
        return None
    with open(ladder.runs_file) as f:
        e = [json.loads(line) for line in f if line.strip()][-1]
    teacher = next(r for r in e["rows"] if r["model"] == "teacher" and r["engine"] == "fairseq")
    described = {m["name"]: m for m in e["models"]}
    for row in e["rows"]:
        row["quality"] = statistics.mean(row["quality_seeds"].values())
        row["lost"] = teacher["deployed_quality"] - row["quality"]
        row["speedup"] = row["sentences_per_s"] / teacher["sentences_per_s"]
        row["latency_speedup"] = teacher["latency_ms"] / row["latency_ms"]
        records = [r for r in map(store.get, described[row["model"]]["records"].values()) if r is not None]
        row["cost_h"] = statistics.mean(sum(c["cpu_s"] for c in r["commands"] if c["stage"] not in SCORING_STAGES)
                                        for r in records) / 3600 if records else None
        row["cost_gpus"] = sorted({r["machine"].get("gpu") for r in records} - {None})
        row["cost_malloc"] = not any(map(default_malloc, records))
    return e


def ladder_table(store, path, summary=False):
    """A ladder's latest run and its advice per quality bound (``summary``: the advice alone, for the README)."""
    ladder = Ladder(path, store.root)
    spec, shown, e = ladder.spec, os.path.relpath(path, ROOT), ladder_run(store, ladder)
    newest = {g.name: store.find(grid=g.name)[-1:] for g in ladder.grids}  # as the claims: its newest record's origin
    cells = {name: {str(r["seed"]): r["key"] for r in store.find(grid=grid.name, cell=name)  # cell -> {seed: the key
                    if origin(r) == origin(newest[grid.name][0])}  # of its latest record}
             for grid in ladder.grids for name in dict.fromkeys(c.name for c in grid.cells)}
    without = [name for name, seeds in cells.items() if not seeds]
    if e is None:
        with_records = [f"{name} ({len(seeds)} seeds)" for name, seeds in cells.items() if seeds]
        return (f"Not measured yet. Cells with records in the store: {', '.join(with_records) or 'none'}; without: "
                f"{', '.join(without) or 'none'}. Measured alone on the machine by `python "
                f"scripts/experiments/ladder.py measure {shown}`.\n")
    settings = e["settings"]
    name, glue = METRIC_NAMES[settings["metric"]], settings.get("task") == "glue"
    lines = head(f"model | engine | {name} (mean over seeds) | lost vs teacher | {'predictions' if glue else 'hypotheses'}"
                 f" = fairseq's | non-emb. params | size MB | sent/s, batch {settings['batch']} | speed-up | ms/sentence, "
                 "batch 1 | speed-up (batch 1) | CPU h to make (mean over seeds)")
    for row in e["rows"]:
        n, values = row.get("identical_to_fairseq"), list(row["quality_seeds"].values())
        same = " | -" if n is None else f" | {n:,}/{row['sentences']:,}"  # outputs as in fairseq (the round trip)
        params = "-" if row["non_embedding_params"] is None else f"{row['non_embedding_params']:,}"
        cost = "-" if row["cost_h"] is None else f"{row['cost_h']:.2f}{'' if row['cost_malloc'] else '*'}" + (
            f" ({', '.join(row['cost_gpus'])})" if row["cost_gpus"] else "")
        lines.append(f"| {row['model']} | {row['engine']} | {mean_text(values)} ({len(values)} "
                     f"seed{'s' if len(values) > 1 else ''}) | {row['lost']:+.2f}{same} | {params} "
                     f"| {row['size_mb']:.1f} | {row['sentences_per_s']:.1f} | {row['speedup']:.2f}x "
                     f"| {row['latency_ms']:.1f} | {row['latency_speedup']:.2f}x | {cost} |")
    lines.append("")
    first_advice = len(lines)
    for bound in spec.get("losses", [0.5, 1.0]):
        within = [r for r in e["rows"] if r["lost"] <= bound]
        if not within:
            lines.append(f"- At <= {bound:g} {name} lost: no deployment.")
            continue
        fastest, smallest = max(within, key=lambda r: r["sentences_per_s"]), min(within, key=lambda r: r["size_mb"])
        lines.append(f"- At <= {bound:g} {name} lost: fastest {fastest['model']} in {fastest['engine']} "
                     f"({fastest['speedup']:.2f}x the fairseq teacher's sentences/s, {fastest['lost']:+.2f} lost); "
                     f"smallest {smallest['model']} in {smallest['engine']} ({smallest['size_mb']:.1f} MB, "
                     f"{smallest['lost']:+.2f} lost).")
    goal, goal_loss = spec.get("goal_speedup", 5.0), spec.get("goal_loss", 0.5)
    control = ladder.control  # the teacher's recipe trained by the students' rule: the goal asked against it too
    near = [r for r in e["rows"] if r["model"] not in ("teacher", control) and r["lost"] <= goal_loss]
    nearest = max(near, key=lambda r: r["speedup"]) if near else None  # the fastest student within the goal's loss
    met = nearest is not None and nearest["speedup"] >= goal
    lines.append(f"- Goal ({goal:g}x the fairseq teacher's sentences/s at <= {goal_loss:g} {name} lost): " + (
        f"{'met by' if met else 'not met; nearest'} {nearest['model']} in {nearest['engine']}, "
        f"{nearest['speedup']:.2f}x at {nearest['lost']:+.2f} lost ({len(nearest['quality_seeds'])} seed(s))." if nearest
        else f"not met; no student is within {goal_loss:g} lost."))
    if not met:
        for model in [] if glue else ["teacher"] + ([nearest["model"]] if nearest else []):
            parts = next((r.get("time_parts") or {} for r in e["rows"] if r["model"] == model
                          and r["engine"] == "fairseq"), {})  # its fairseq time's shares (ladder.py's measurement)
            shares = [", ".join(f"{k} {100 * parts[p][k]:.0f}%" for k in ("encoder", "decoder", "search"))
                      for p in ("batch", "one") if parts.get("batch")]
            lines.append(f"- Where the time goes, {model} in fairseq: " + (
                f"at batch {settings['batch']}: {shares[0]}; at batch 1: {shares[1]}." if shares else "not measured."))
    if control:
        base = next((r for r in e["rows"] if r["model"] == control and r["engine"] == "fairseq"), None)
        updates = next(m for m in e["models"] if m["name"] == "teacher").get("trained", {}).get("updates")
        best = max((r for r in e["rows"] if r["model"] not in ("teacher", control) and base["quality"] - r["quality"]
                    <= goal_loss), key=lambda r: r["speedup"], default=None) if base else None
        lines.append(f"- The teacher trained {f'{updates:,} updates' if updates else 'a fixed budget'} (its recipe's), the "
                     "students until validation stopped improving or their epoch cap: a student above it says the "
                     f"teacher stopped short. Against {control}, the teacher's recipe trained by the students' rule "
                     f"({ladder.control_grid}): " + ("not measured yet." if base is None else (
                         f"{base['quality']:.2f} ({len(base['quality_seeds'])} seed(s)); " + (
                             f"the fastest student within {goal_loss:g} of it is {best['model']} in {best['engine']}, "
                             f"{best['speedup']:.2f}x at {base['quality'] - best['quality']:+.2f} lost: the goal "
                             f"{'met' if best['speedup'] >= goal else 'not met'}." if best else
                             f"no student is within {goal_loss:g} of it: the goal not met."))))
    lines += [f"- Not deployed: {r['model']} in {r['engine']}: {r['reason']}" for r in e["refused"]]
    if summary:
        return "\n".join(lines[first_advice:]) + (f"\n- Measured {e['date']}: [{shown}'s table]"
                                                  f"(results/{ladder.name}.md).\n")
    described = {m["name"]: m for m in e["models"]}
    stale = [m for m, d in described.items() if m in cells and d["records"] != cells[m]]  # filed since: seed or teacher
    lines += [f"- Measured before the store's latest records of {', '.join(stale)}: measure again."] if stale else []
    lines += [f"- Cells without records yet (not on the ladder): {', '.join(without)}."] if without else []
    scored = (f"{name} on {settings['glue_task']}'s dev set (GLUE's, in points): fairseq rows are the records' "
              "scores, ONNX Runtime rows run each seed's fc-export-onnx graphs (its tokenizer checked to give every "
              "dev example's ids from the raw text); predictions = fairseq's: the examples whose predicted class (a "
              "regression head: score, within 1e-4) is the same model's in fairseq" if glue else
              f"{name} on the test set (beam {settings['beam']}): fairseq rows are the records' scores, other "
              "engines decode each seed's checkpoint; hypotheses = fairseq's: the lowest seed's, string for string")
    sizes = "ONNX Runtime: model.onnx, model.int8.onnx" if glue else "CTranslate2: model.bin"
    check = (f" A pipeline check on {settings['max_sentences']} sentences: not a ladder."
             if settings.get("max_sentences") else "")
    lines += ["", f"{scored}; lost: the fairseq teacher's score minus the mean. Speed: the lowest seed's checkpoint, "
              f"median of {settings['runs']} runs with the rows measured in turn, {settings['threads']} thread(s) per "
              "row, ratios against the fairseq teacher in the same run. Size: the weights as stored (fairseq: the "
              f"state dict; {sizes}). CPU h to make: the records' training and compression stages (scoring excluded; a "
              f"grid's shared preparation, e.g. its teacher-output cache, excluded; *: a seed made on a CPU before the "
              "recipes raised glibc's malloc threshold, which made its KD stages slower: scripts/recipes/common.sh)."
              f"{check}",
              "", f"Measured {e['date']} on {e['machine']} (load average {e['load_average_before'][0]:.2f} before, "
              f"{e['load_average_after'][0]:.2f} after) by `{e['command']}`."]
    return "\n".join(lines) + "\n"


def _results_rows(name):
    """{row name: row} of a results/*.json table (fc-measure's --json), and the table."""
    with open(os.path.join(ROOT, "results", name)) as f:
        table = json.load(f)
    return {r["name"]: r for r in table["rows"]}, table


def pet_shipped(kind):
    """The shipped PET student against the teacher: a sentence, its score line, or the PET page's rows."""
    rows, table = _results_rows("pet_multi30k.json")
    teacher, pet = rows["teacher"], rows["pet"]
    if kind == "score":  # pet.sh's line (record.score_line) of the two rows, as its WORK/result.json files them
        pet_row, teacher_row = ({"metrics": {"bleu_tok": r["bleu_tok"]}, "params": {"non_embedding":
                                 r["non_embedding_params"]}} for r in (pet, teacher))
        result = dict(pet_row, recipe="pet.sh", name="pet", sentences=pet["sentences"], also={"teacher": teacher_row})
        return f"```\n{score_line(result, 'work/pet')}\n```\n"
    if kind == "sentence":
        return (f"The shipped student (`checkpoints/multi30k.de-en/pet_student.pt`: the full CPU recipe at its defaults "
                f"of then, 3 + 20 epochs, one seed) scores {pet['bleu_tok']:.2f} BLEU (tok) and {pet['sacrebleu']:.2f} "
                f"sacreBLEU against the teacher's {teacher['bleu_tok']:.2f} and {teacher['sacrebleu']:.2f}, at "
                f"{pet['compression_rate']:.2f}% of its non-embedding parameters and {pet['speedup']:.2f}x its "
                f"sentences/s in fairseq ({table['date']}, {table['machine'].split(',')[0]}).\n")
    demo, _ = _results_rows("demo.json")
    return ("| comparison | teacher | PET | source |\n| --- | --- | --- | --- |\n"
            f"| shipped student, full CPU recipe, BLEU (tok) | {teacher['bleu_tok']:.2f} | {pet['bleu_tok']:.2f} at "
            f"{pet['compression_rate']:.2f}%, {pet['speedup']:.2f}x the sentences/s | results/pet_multi30k.md |\n"
            f"| demo: 200 + 600 updates, BLEU (tok) | {demo['teacher']['bleu_tok']:.2f} | {demo['pet']['bleu_tok']:.2f} "
            "| results/demo.md |\n")


def demo_run():
    """The README's demo sentence: the demo's report (results/demo.json's scores, results/demo.md's minutes)."""
    rows, _ = _results_rows("demo.json")
    with open(os.path.join(ROOT, "results", "demo.md")) as f:
        minutes = float(re.search(r"^\| total \| ([\d.]+) \|$", f.read(), re.M).group(1))
    return (f"One demo run: {rows['pet']['bleu_tok']:.2f} BLEU (tok) against the teacher's "
            f"{rows['teacher']['bleu_tok']:.2f} after 200 + 600 updates, in {minutes:g} minutes.\n")


def teacher_reference():
    """The reference teacher's scores on test_2016_flickr: results/teacher_multi30k.json (user_dir/tools/measure.py)."""
    r = _results_rows("teacher_multi30k.json")[0]["teacher_reference"]
    return (f"The reference teacher scores {r['sacrebleu']:.2f} sacreBLEU and {r['bleu_tok']:.2f} BLEU (tok) on the "
            f"{r['sentences']:,} sentences of test_2016_flickr.\n")


def deploy_table(store):
    """The deployment page's table: the teacher and shipped PET in fairseq and CTranslate2 (ladder_mt)."""
    e = ladder_run(store, Ladder(os.path.join(GRIDS, "ladder_mt.toml"), store.root))
    by, name = {(r["model"], r["engine"]): r for r in e["rows"]}, METRIC_NAMES[e["settings"]["metric"]]
    lines = head(f"model, engine | {name} | size MB | speed-up over the fairseq teacher (batch "
                 f"{e['settings']['batch']}) | hypotheses = fairseq's")
    for model, engine in (("teacher", "fairseq"), ("teacher", "ct2-int8"), ("pet-shipped", "fairseq"),
                          ("pet-shipped", "ct2-float32"), ("pet-shipped", "ct2-int8")):
        r = by[model, engine]
        same = "-" if engine == "fairseq" else f"{r['identical_to_fairseq']:,}/{r['sentences']:,}" \
            if "identical_to_fairseq" in r else "not compared in this run"
        lines.append(f"| {model}, {engine} | {r['deployed_quality']:.2f} | {r['size_mb']:.1f} | {r['speedup']:.2f}x "
                     f"| {same} |")
    change = by["pet-shipped", "ct2-int8"]["deployed_quality"] - by["pet-shipped", "fairseq"]["deployed_quality"]
    return "\n".join(lines) + (f"\n\nThe {by['teacher', 'fairseq']['sentences']:,} test sentences, beam "
                                f"{e['settings']['beam']}, {e['settings']['threads']} thread(s) per engine, measured "
                                f"{e['date']} ([results/ladder_mt.md](../../results/ladder_mt.md)). int8 weights "
                                f"change some hypotheses: {change:+.2f} {name} for PET.\n")


def deploy_glue_table(store):
    """The deployment page's GLUE rows: each model in fairseq and ONNX Runtime (grids/ladder_glue.toml)."""
    e = ladder_run(store, Ladder(os.path.join(GRIDS, "ladder_glue.toml"), store.root))
    if e is None:
        return ("Not measured yet: `python scripts/experiments/ladder.py measure grids/ladder_glue.toml` (alone on the "
                "machine) measures the GLUE grid's students; the last table of the driver it replaces is archived, "
                "[results/archive/deploy_glue.md](../../results/archive/deploy_glue.md).\n")
    lines = head(f"model, engine | {METRIC_NAMES[e['settings']['metric']]} | predictions = fairseq's | size MB "
                 f"| speed-up over the fairseq teacher (batch {e['settings']['batch']})")
    for r in e["rows"]:
        same = "-" if "identical_to_fairseq" not in r else f"{r['identical_to_fairseq']:,}/{r['sentences']:,}"
        lines.append(f"| {r['model']}, {r['engine']} | {r['deployed_quality']:.2f} | {same} | {r['size_mb']:.1f} "
                     f"| {r['speedup']:.2f}x |")
    return "\n".join(lines) + (f"\n\n{e['settings']['glue_task']} dev, {e['rows'][0]['sentences']:,} examples, "
                                f"{e['settings']['threads']} thread(s) per engine, measured {e['date']} "
                                "([results/ladder_glue.md](../../results/ladder_glue.md)).\n")


def glue_teachers_table():
    """The GLUE page's table of the MiniLM-L6 teachers: results/glue.json (scripts/recipes/glue_teachers.sh's report)."""
    with open(os.path.join(ROOT, "results", "glue.json")) as f:
        rows = json.load(f)["rows"]
    lines = head("task (MiniLM-L6, CPU recipe) | dev score (chosen on a held-out slice of train) | majority class "
                 "| published | gap")
    for r in rows:
        budget = f"{r['updates']:,} updates" if r["epochs"] != int(r["epochs"]) else f"{r['epochs']:g} epochs"
        metric, score = ("F1 / accuracy", f"{r['f1']:.2f} / {r['accuracy']:.2f}") if r.get("f1") is not None else \
            ("accuracy", f"{r['accuracy']:.2f}")
        published = "-" if r.get("published") is None else f"{r['published']:g}"
        gap = "-" if r.get("gap") is None else f"{r['gap']:+.2f}"
        lr = f"{r['lr']:.0e}".replace("e-0", "e-")
        lines.append(f"| {r['task']} {metric} ({budget}, lr {lr}) | {score} | {r['majority_class']:.2f} "
                     f"| {published} | {gap} |")
    return "\n".join(lines) + "\n"


def quickstart_score(store, cell):
    """A method page's quickstart: the score line of grids/quickstart.toml's CELL from its latest record."""
    grid = Grid(QUICKSTART, store=store.root)
    labels = {c.seed: c.label for c in grid.select(only=cell)}
    records = [r for r in grid.current_records(cell) if r["seed"] in labels]
    if not records:
        raise SystemExit(f"render: quickstart-{cell}: {os.path.relpath(store.root, ROOT)} holds no record of "
                         f"grids/quickstart.toml's cell {cell} with the grid's teacher and data; make it with `python "
                         f"scripts/experiments/grid.py run grids/quickstart.toml --only {cell} --jobs 1 --threads 1`")
    r = records[-1]
    work = os.path.relpath(grid.work_of(labels[r["seed"]], r["key"]), ROOT)
    return (f"```\n{score_line(r, work)}\n```\n\ngrids/quickstart.toml's cell `{cell}`, seed {r['seed']} "
            f"({r['date']}): {r['updates']:,} training updates, {r['cpu_s'] / 60:.1f} CPU minutes in all (every stage, "
            f"scoring included) on {device_text([r])}.\n")


def teacher_cache_table(store):
    """What the teacher-output cache saves a word-KD update: grids/teacher_cache.toml's CPU s per update."""
    by_seed = {}
    for record in store.find(grid="teacher_cache"):  # each seed's and cell's newest record (filing order) counts
        by_seed.setdefault(record["seed"], {})[record["cell"]] = record
    pairs = {seed: cells for seed, cells in sorted(by_seed.items()) if {"online", "cached"} <= set(cells)}
    if not pairs:
        return ("Not measured yet: `python scripts/experiments/grid.py run grids/teacher_cache.toml --jobs 1 "
                "--threads 1 --commit`, alone on the machine.\n")

    def per_update(record):  # the training stage's (CPU, wall) seconds, its start-up and final validation included
        stage = next(c for c in record["commands"] if c["stage"] == "train")
        updates = record["training"]["train"]["updates"]
        return stage["cpu_s"] / updates, stage["wall_s"] / updates

    lines = head("seed | updates | online: CPU s / update | cached: CPU s / update | no KD term: CPU s / update "
                 "| online / cached (CPU) | online / cached (wall)")
    ratios, shares = [], []
    for seed, cells in pairs.items():
        (cpu_on, wall_on), (cpu_ca, wall_ca) = per_update(cells["online"]), per_update(cells["cached"])
        ratios.append(cpu_on / cpu_ca)
        plain = per_update(cells["no-kd"])[0] if "no-kd" in cells else None
        if plain is not None:
            shares.append(((cpu_on - cpu_ca) / cpu_on, (cpu_ca - plain) / cpu_ca))
        lines.append(f"| {seed} | {cells['online']['training']['train']['updates']} | {cpu_on:.3f} | {cpu_ca:.3f} "
                     f"| {'-' if plain is None else f'{plain:.3f}'} | {cpu_on / cpu_ca:.2f}x | {wall_on / wall_ca:.2f}x |")
    first = next(iter(pairs.values()))["online"]
    lines += ["", f"The cache makes a word-KD update {statistics.mean(ratios):.2f}x cheaper in CPU time (the mean over "
              f"{len(ratios)} seed(s)); the training stage's CPU and wall seconds per update, its start-up and final "
              f"validation included. {device_text([first])}; {first['date']}."]
    if shares:
        teacher, loss = (statistics.mean(s) for s in zip(*shares))
        lines += ["", f"Where the time goes: the teacher's forward, which the cache removes, is {teacher:.0%} of an "
                  f"online update; the KD loss over the whole target vocabulary (both softmaxes and the gradient, "
                  f"[target tokens x vocabulary] each), which the cache keeps, is {loss:.0%} of a cached one (cached "
                  f"against no KD term, the mean over {len(shares)} seed(s))."]
    return "\n".join(lines) + "\n"


def stopping_table(store, grid_path, window=10):
    """How each patience-stopped student of a grid stopped: epochs, best loss, patience or cap, last fall."""
    grid = Grid(grid_path, store=store.root)
    lines = head(f"cell | seed | epochs | best epoch | best validation loss | stopped by | fall over its last {window} "
                 "epochs")
    capped, rows = 0, 0
    for cell in grid.cells:
        for record in grid.current_records(cell.name):
            if record["seed"] != cell.seed or not record["variables"].get("PATIENCE"):
                continue
            order = [c["stage"] for c in record["commands"] if record["training"].get(c["stage"])]
            state = record["training"][order[-1]]  # the last training stage (the store sorts the record's keys)
            cap = int(record["variables"].get("MAX_EPOCHS") or 60)
            curve = state.get("validation") or []
            capped, rows = capped + (state["epochs"] >= cap), rows + 1
            why = (f"the {cap}-epoch cap" if state["epochs"] >= cap
                   else f"patience ({record['variables']['PATIENCE']} epochs without a lower loss)")
            fall = f"{curve[-1 - window][2] - min(p[2] for p in curve):.3f}" if len(curve) > window else "-"
            lines.append(f"| {cell.name} | {record['seed']} | {state['epochs']:g} | {state.get('best_epoch', '-')} "
                         f"| {state['best_validation']:.3f} | {why} | {fall} |")
    if not rows:
        return (f"No student of {os.path.relpath(grid_path, ROOT)} has finished yet (`python scripts/experiments/"
                f"grid.py plan {os.path.relpath(grid_path, ROOT)}`).\n")
    return "\n".join(lines) + (f"\n\nThe epoch cap ended {capped} of {rows} students, patience {rows - capped}. The "
                                f"fall is the validation loss {window} epochs before the stop minus the best.\n")


def claims_where(render, field, *values):
    """A block: ``render`` (claims_table or claims_summary) of the claims whose FIELD is one of VALUES."""
    return lambda store: render(store, [c for c in load_claims() if c[field] in values])


BLOCKS = {
    "pet-sizes": lambda store: sizes_table(os.path.join(GRIDS, "pet.toml"), "pet"),
    "claims-pet": claims_where(claims_table, "method", "PET"),
    "claims-glue": claims_where(claims_table, "grid", "glue", "glue_sst2"),
    "claims-mt": claims_where(claims_table, "grid", "claims_mt"),
    **{f"claims-{m.lower()}-summary": claims_where(claims_summary, "method", m) for m in ("PET", "GhostBERT", "APC",
                                                                                        "Variator")},
    **{block: (lambda store, kind=kind: pet_shipped(kind))
       for block, kind in (("pet-shipped", "sentence"), ("pet-shipped-score", "score"), ("pet-results", "table"))},
    "demo-run": lambda store: demo_run(), "deploy-table": deploy_table, "teacher-cache": teacher_cache_table,
    "pet-stopping": lambda store: stopping_table(store, os.path.join(GRIDS, "pet.toml")),
    "deploy-glue-table": deploy_glue_table, "glue-teachers": lambda store: glue_teachers_table(),
    **{f"quickstart-{m}": (lambda store, m=m: quickstart_score(store, m)) for m in ("apc", "ghostbert", "variator")},
    **{f"ladder-{k}{s}": (lambda store, k=k, s=s: ladder_table(store, os.path.join(GRIDS, f"ladder_{k}.toml"),
                                                               summary=bool(s)))
       for k in ("mt", "glue") for s in ("", "-summary")},
    "teacher-reference": lambda store: teacher_reference(),
}


def render_pages(check=False, store_root=None, files=None):
    """Re-render (``check``: only compare) the blocks of ``files`` (default PAGES); 'PAGE: BLOCK' of each stale."""
    store = store_lib.Store(store_root or os.path.join(ROOT, "results", "store"))
    _EVALUATED.pop(store.root, None)
    cache, stale = {}, []
    for page in files or sorted({p for pattern in PAGES for p in glob.glob(os.path.join(ROOT, pattern))}):
        with open(page) as f:
            text = f.read()

        def replace(match):
            name = match.group(2)
            if name not in BLOCKS:
                raise SystemExit(f"{os.path.relpath(page, ROOT)}: unknown rendered block {name!r} "
                                 f"(one of {', '.join(BLOCKS)})")
            if name not in cache:
                cache[name] = BLOCKS[name](store)
            if match.group(3) != cache[name]:
                stale.append(f"{os.path.relpath(page, ROOT)}: {name}")
            return match.group(1) + cache[name] + match.group(4)

        new = BLOCK.sub(replace, text)
        if new != text and not check:
            with open(page, "w") as f:
                f.write(new)
    return stale


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is not current")
    p.add_argument("--store", default=None, help="the store (default results/store)")
    args = p.parse_args(argv)
    stale = render_pages(args.check, args.store)
    if args.check and stale:
        raise SystemExit("not current (python scripts/experiments/render.py):\n  " + "\n  ".join(stale))
    print(("re-rendered: " if stale else "every block current") + ", ".join(stale))


if __name__ == "__main__":
    main()
