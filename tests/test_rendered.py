"""Every rendered block of the pages (README.md, results/*.md, the method pages) is current: what
scripts/experiments/render.py makes from the store (results/store) and the claims (grids/claims.toml) now. This replaces
the hand-kept checks of copied numbers for every block rendered so far."""
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

RENDER = os.path.join(REPO, "scripts", "experiments", "render.py")


def test_every_rendered_block_is_current():
    proc = subprocess.run([sys.executable, RENDER, "--check"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_check_names_a_block_that_drifted(tmp_path):
    sys.path.insert(0, os.path.dirname(RENDER))
    import render

    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    start = text.index("<!-- rendered: claims-pet-summary -->")
    page = tmp_path / "README.md"
    page.write_text(text[:start] + text[start:].replace("\n- ", "\n- PET beats it by +9.99 [+9.00, +10.00]; ", 1))
    assert [line.split(": ")[-1] for line in render.render_pages(check=True, files=[str(page)])] == ["claims-pet-summary"]
    assert page.read_text() != text  # a check changes nothing
    render.render_pages(files=[str(page)])
    assert page.read_text() == text and render.render_pages(check=True, files=[str(page)]) == []


def test_every_student_of_the_pet_grid_is_within_4_percent_of_pet():
    """PET Table 7 keeps its competitors within about 4% of PET's non-embedding parameters: each cell's model, built
    from its recipe's own fairseq-train command, is."""
    sys.path.insert(0, os.path.dirname(RENDER))
    import render

    sizes = render.student_sizes(os.path.join(REPO, "grids", "pet.toml"), "pet",
                                 os.path.join(REPO, "checkpoints", "multi30k.de-en"))
    assert {s["cell"] for s in sizes} == {"pet", "patient-kd", "can", "word-kd"}
    assert all(s["within"] for s in sizes), sizes


def backbone_store(tmp_path):
    """Three seeds of a cell 'v' whose records file the backbone's predictions beside the plugged model's (as
    variator.sh and apc.sh do) on 200 labelled examples: (store, labels, {seed: {"a": accuracy, "b": accuracy}})."""
    import random

    sys.path.insert(0, os.path.dirname(RENDER))
    import store as store_lib

    rng = random.Random(0)
    labels = [int(rng.random() < 0.7) for _ in range(200)]  # 70% positive
    teacher = [y if rng.random() < 0.85 else 1 - y for y in labels]  # the backbone: 85% right
    store = store_lib.Store(str(tmp_path / "store"))
    accuracy = {}
    for seed in (1, 2, 3):
        plugged = [p if rng.random() < 0.95 else 1 - p for p in teacher]  # the plugin changes ~5% of its answers
        work = tmp_path / f"w{seed}"
        (work / "outputs").mkdir(parents=True)
        for name, preds in (("variator-k4", plugged), ("teacher", teacher)):
            (work / "outputs" / f"{name}.txt").write_text("".join(f"{p}\n" for p in preds))
        (work / "outputs" / "references.txt").write_text("".join(f"{y}\n" for y in labels))
        acc = {name: 100 * sum(p == y for p, y in zip(preds, labels)) / len(labels)
               for name, preds in (("a", plugged), ("b", teacher))}
        accuracy[seed] = acc
        result = {"recipe": "variator.sh", "name": "variator-k4", "variables": {"UPDATES": "4140", "SEED": str(seed),
                                                                         "PRETRAIN_UPDATES": "200"},
                  "commands": [{"stage": "plugin", "cpu_s": 3600.0}], "teacher": {"sha256": "t"},
                  "data": {"fingerprint": "d"}, "metrics": {"accuracy": acc["a"]}, "outputs": "outputs/variator-k4.txt",
                  "split": "dev", "sentences": len(labels),
                  "references": str(work / "outputs" / "references.txt"),
                  "also": {"teacher": {"metrics": {"accuracy": acc["b"]}, "outputs": "outputs/teacher.txt",
                                       "sentences_per_s": 80.0}}, "sentences_per_s": 100.0,
                  "cost": {"encoder_flops_saved_percent": 40.0 + seed, "extra_params_percent": 1.0, "speedup": 1.5,
                           "length": 128}, "training": {"plugin": {"epochs": 20}}, "cpu_s": 3600.0,
                  "machine": {"cpu": "test", "malloc": "4294967296"}}
        store.add(f"k{seed}", "glue", "v", seed, result, str(work))
    return store, labels, accuracy


def claim_of(**fields):
    return dict({"id": "c", "method": "Variator", "claim": "a plugin loses under 2 points", "paper": "the paper's words",
                 "grid": "glue", "a": "v", "b": "v:teacher", "metric": "accuracy", "seeds": 3}, **fields)


def test_a_claim_against_the_backbone_row_of_its_own_records_is_tested_and_carries_its_cost(tmp_path, monkeypatch):
    """A claim whose B is 'CELL:ROW' (the backbone each Variator record files beside its plugged model): paired by
    seed, its difference is the pooled metric's (A's predictions against B's, on the same labels), its verdict the one
    rule's, and the row states the cost A's records measured beside the paper's and its CPU hours once."""
    import render

    store, _, accuracy = backbone_store(tmp_path)
    claim = claim_of(test="greater", threshold=-2.0, cost="53% saved")
    monkeypatch.setattr(render, "load_claims", lambda path=None: [claim])
    render._EVALUATED.clear()
    (row,) = render.claims_table(store, [claim]).splitlines()[2:]
    diff = sum(a["a"] - a["b"] for a in accuracy.values()) / 3  # accuracy pools alike: the mean of the seeds'
    assert f"| {diff:+.2f} [" in row, row
    means = [sum(a[k] for a in accuracy.values()) / 3 for k in ("a", "b")]
    assert f"| v: {means[0]:.2f} +- " in row and f"| v:teacher: {means[1]:.2f} +- 0.00 " in row
    assert "| A: s1 20, s2 20, s3 20 | 3.0 on CPU" in row  # B is a row of A's records: its epochs are A's
    assert "| 4140 updates | 3 |" in row and "| 3.0 on CPU (test, 1 thread a run) |" in row  # no pretrain stage ran
    record = store.records()[0]
    assert render.rule_text(dict(record, commands=[{"stage": "pretrain"}, {"stage": "plugin"}])) == \
        "200 pretrain updates, 4140 updates"
    assert row.endswith("at this stopping rule; cost: 42.0% of the encoder's FLOPs saved with 1.0% extra parameters, "
                        "the encoder x1.50 faster at length 128, the whole model x1.25 the teacher's sentences/s (the "
                        "recipe's measurement, the two in turn) (the paper: 53% saved) |"), row
    verdict = row.split("|")[-2].split(" at this")[0].strip()
    assert verdict in {"reproduced", "not reproduced", "inconclusive"}
    summary = render.claims_summary(store, [claim])
    assert summary.startswith(f"- a plugin loses under 2 points (the paper's claim): accuracy on dev {diff:+.2f} [")
    assert f"{verdict} at 4140 updates, 3 seeds; it detects " in summary and "; cost: 42.0%" in summary
    for r in store.find(cell="v"):  # the same files filed as another cell, trained 10 epochs: B's epochs said apart
        kept = {k: v for k, v in r.items() if k not in ("key", "grid", "cell", "seed", "date", "training")}
        work = tmp_path / f"w{r['seed']}"
        store.add(f"w{r['seed']}", "glue", "w", r["seed"], dict(kept, training={"plugin": {"epochs": 10}},
                  references=str(work / "outputs" / "references.txt")), str(work))
    two_cells = claim_of(b="w", test="greater", threshold=-2.0)
    monkeypatch.setattr(render, "load_claims", lambda path=None: [two_cells])
    render._EVALUATED.clear()
    (two,) = render.claims_table(store, [two_cells]).splitlines()[2:]
    assert "| A: s1 20, s2 20, s3 20; B: s1 10, s2 10, s3 10 |" in two, two


def test_a_waiting_row_states_what_its_seeds_can_detect_and_whether_the_test_examples_bound_it(tmp_path, monkeypatch):
    """Before its cells land, a row prints the difference its seeds can detect from the earlier table's spread
    (significance.detectable_difference: the larger of the interval's part and the seeds' part), and says when the
    test examples' interval is the larger, which no number of seeds lowers."""
    import render
    import store as store_lib

    table = tmp_path / "prior.json"
    store = store_lib.Store(str(tmp_path / "store"))
    rows = []
    for width, spread in ((3.92, 0.1), (0.392, 2.0)):  # interval se 1 (part 2.80); seeds' spread 2 (part 2.93)
        table.write_text(json.dumps({"comparisons": [{"label": "x", "high": width / 2, "low": -width / 2,
                                                      "per_seed_std": spread}]}))
        claim = claim_of(test="greater", threshold=0.0, prior={"table": str(table), "comparison": "x", "budget": "b"})
        monkeypatch.setattr(render, "load_claims", lambda path=None: [claim])
        render._EVALUATED.clear()
        rows.append(render.claims_table(store, [claim]).splitlines()[2])
    assert "| waiting: A 0/3 seeds, B 0/3 seeds in the store |" in rows[0]
    assert f"| about 2.80 before running (3 seeds; the spread of {table}, b; the test examples bound it, not the " \
           "seeds) |" in rows[0], rows[0]
    assert f"| about 2.93 before running (3 seeds; the spread of {table}, b) |" in rows[1], rows[1]
    assert "| grids/glue.toml's | waiting" in rows[0]  # cell v is not in glue.toml: the grid's name stands for its rule
    # the stopping rule A's grid sets, its own cell's variables only (glue.toml's GhostBERT epochs are not APC's)
    for grid, cell, rule in (("glue", "apc-mrpc", "100 compress updates, 163 finetune epochs"),
                             ("pet", "can", "patience 3 epochs on validation loss, at most 60 epochs")):
        claim = claim_of(grid=grid, a=cell, b="other", test="greater", threshold=0.0)
        monkeypatch.setattr(render, "load_claims", lambda path=None: [claim])
        render._EVALUATED.clear()
        assert f"| {rule} | waiting: A 0/3" in render.claims_table(store, [claim]).splitlines()[2]


def test_a_row_says_whether_it_can_detect_the_papers_own_difference_and_a_prior_may_be_a_measured_claim(
        tmp_path, monkeypatch):
    """claims.toml's 'effect' (the paper's A - B): its distance from the test's bound (a parity row: the margin's room
    left) against the row's detectable difference, before running and after; a waiting row's prior may name a claim
    measured here, whose cells' spread then sizes it."""
    import render
    from user_dir.common.significance import detectable_difference

    store, _, _ = backbone_store(tmp_path)
    measured = claim_of(id="m", test="greater", threshold=-2.0, effect=1.5)  # 3.5 from the bound
    claims = [measured, claim_of(id="w", b="other", test="greater", threshold=0.0, effect=0.25, prior={"claim": "m"}),
              claim_of(id="q", b="other", test="parity", margin=2.0, margin_source="ours", effect=0.5,
                       prior={"claim": "m"})]
    monkeypatch.setattr(render, "load_claims", lambda path=None: claims)
    render._EVALUATED.clear()
    done, waiting, parity = render.claims_table(store, claims).splitlines()[2:]
    r = render.evaluated(store, claims)[0]["result"]
    d = detectable_difference((r["high"] - r["low"]) / 3.92, r["per_seed_std"], 3)
    assert d["detectable"] < 3.5 and d["interval_part"] > d["seeds_part"], d  # the examples bound it, within reach
    assert (f"| {d['detectable']:.2f} (the paper's A - B, +1.50, is 3.50 from the test's bound: within what this row "
            "can detect; the test examples bound it, not the seeds; the paper's A - B lies above this row's 95% "
            "interval) |") in done, done
    assert (f"| about {d['detectable']:.2f} before running (3 seeds; the spread of claim m's cells as measured; the "
            "paper's A - B, +0.25, is 0.25 from the test's bound: below what this row can detect; the test examples "
            "bound it, not the seeds) |") in waiting, waiting
    assert "the paper's A - B, +0.50, is 1.50 from the test's bound: below" in parity, parity  # margin 2 - |0.5|
    assert (f"3 seeds; it detects {d['detectable']:.2f}; the paper's A - B, +1.50, is 3.50 from the test's bound: "
            "within") in render.claims_summary(store, [measured])
    assert "| accuracy on dev (200 examples) |" in done and "- a plugin loses under 2 points (the paper's claim): " \
        "accuracy on dev " in render.claims_summary(store, [measured])
    # measured, a paper's A - B above the row's 95% interval (+1.50 above [-4.17, -1.00]) is said to be; inside, not
    assert r["high"] < 1.5
    inside = dict(measured, effect=round((r["low"] + r["high"]) / 2, 2))
    monkeypatch.setattr(render, "load_claims", lambda path=None: [inside])
    render._EVALUATED.clear()
    assert "interval" not in render.claims_table(store, [inside]).splitlines()[2].split("|")[13]


def test_a_retention_claim_is_a_ratio_interval_with_the_constant_answers_ratio_beside_it(tmp_path, monkeypatch):
    """test = "ratio": A / B pooled over seeds with its two-sided cluster-bootstrap interval, no p (outside Holm), the
    one rule's ratio verdict, and what answering the most frequent label for every example keeps."""
    import render

    store, labels, accuracy = backbone_store(tmp_path)
    ratio = sum(a["a"] for a in accuracy.values()) / sum(a["b"] for a in accuracy.values())
    constant = 100 * labels.count(1) / len(labels) / accuracy[1]["b"]
    for bar, verdict in ((ratio - 0.2, "reproduced"), (ratio + 0.2, "not reproduced")):
        claim = claim_of(test="ratio", ratio=bar)
        monkeypatch.setattr(render, "load_claims", lambda path=None: [claim])
        render._EVALUATED.clear()
        (row,) = render.claims_table(store, [claim]).splitlines()[2:]
        assert f"| A / B > {bar:g} (retention: a two-sided 95% interval, no p) |" in row
        assert f"| A / B {ratio:.3f} [" in row and "| - | - | - |" in row, row
        assert row.endswith(f"| {verdict} at this stopping rule; a constant answer (the most frequent label) keeps "
                            f"{constant:.3f} |"), row
        assert f"kept {ratio:.3f} [" in render.claims_summary(store, [claim])


def test_the_teacher_cache_table_divides_the_training_stages_cpu_time_by_its_updates(tmp_path):
    sys.path.insert(0, os.path.dirname(RENDER))
    import render
    import store as store_lib

    store = store_lib.Store(str(tmp_path / "store"))
    assert render.teacher_cache_table(store).startswith("Not measured yet")
    for cell, cpu, wall in (("online", 500.0, 520.0), ("cached", 200.0, 260.0)):
        record = {"key": cell, "grid": "teacher_cache", "cell": cell, "seed": 1, "date": "d",
                  "commands": [{"stage": "train", "cpu_s": cpu, "wall_s": wall}, {"stage": "measure", "cpu_s": 99.0,
                                                                                    "wall_s": 99.0}],
                  "training": {"train": {"updates": 200}}, "machine": {"cpu": "test"}}
        store._append(record)
    text = render.teacher_cache_table(store)
    assert "| 1 | 200 | 2.500 | 1.000 | - | 2.50x | 2.00x |" in text and "2.50x cheaper in CPU time" in text
    assert "Where the time goes" not in text  # without the no-KD cell there is nothing to split
    store._append({"key": "no-kd", "grid": "teacher_cache", "cell": "no-kd", "seed": 1, "date": "d",
                   "commands": [{"stage": "train", "cpu_s": 150.0, "wall_s": 150.0}],
                   "training": {"train": {"updates": 200}}, "machine": {"cpu": "test"}})
    text = render.teacher_cache_table(store)
    assert "| 1 | 200 | 2.500 | 1.000 | 0.750 | 2.50x | 2.00x |" in text
    # the teacher: (2.5 - 1) / 2.5 of an online update; the KD loss: (1 - 0.75) / 1 of a cached one
    assert "the teacher's forward, which the cache removes, is 60% of an online update" in text
    assert "is 25% of a cached one" in text and "1 of 1 with glibc's default malloc threshold" in text
    # measured again (the recipes' allocator setting, more updates): each seed's and cell's newest record counts
    store._append({"key": "online-2", "grid": "teacher_cache", "cell": "online", "seed": 1, "date": "d2",
                   "commands": [{"stage": "train", "cpu_s": 300.0, "wall_s": 300.0}],
                   "training": {"train": {"updates": 300}}, "machine": {"cpu": "test", "malloc": "4294967296"}})
    text = render.teacher_cache_table(store)
    assert "| 1 | 300 | 1.000 | 1.000 | 0.750 | 1.00x | 0.77x |" in text and "1 thread a run); d2" in text


def test_a_quickstart_block_is_its_cells_score_line_from_its_latest_record_of_the_grids_teacher_and_data(tmp_path):
    """A method page's quickstart: grids/quickstart.toml's cell as its recipe's score line (record.score_line, what the
    recipe printed: variator.sh's form, else the student against the teacher), from the cell's latest record of the
    grid's teacher and data, with its updates and CPU time; without one, an error naming the grid command that makes
    it."""
    sys.path.insert(0, os.path.dirname(RENDER))
    import render
    import store as store_lib
    from grid import Grid

    store = store_lib.Store(str(tmp_path / "store"))
    with pytest.raises(SystemExit, match=r"`python scripts/experiments/grid\.py run grids/quickstart\.toml --only apc "):
        render.quickstart_score(store, "apc")
    grid = Grid(render.QUICKSTART, store=store.root)
    current = {"teacher": {"sha256": grid.teacher_sha}, "data": {"fingerprint": grid.data_fingerprint()}}

    def record(key, cell, recipe, bleu, **fields):
        store._append({"key": key * 64, "grid": "quickstart", "cell": cell, "seed": 1, "recipe": recipe,
                       "name": cell, "date": "2026-11-29 07:00", "metrics": {"bleu_tok": bleu},
                       "params": {"non_embedding": 2771712}, "sentences": 1000, "updates": 300, "cpu_s": 900.0,
                       "machine": {"cpu": "test", "malloc": "4294967296"},
                       "also": {"teacher": {"metrics": {"bleu_tok": 36.29}, "params": {"non_embedding": 5529600}}},
                       **current, **fields})

    record("a", "apc", "apc.sh", 35.0)
    record("b", "apc", "apc.sh", 35.58)
    record("c", "apc", "apc.sh", 99.0, teacher={"sha256": "another teacher"})  # stale: never shown
    assert render.quickstart_score(store, "apc") == (
        "```\nscore: apc BLEU (tok) 35.58 (teacher 36.29) at 50.12% of the teacher's non-embedding parameters, 1000 "
        "sentences -- work/grid/apc-s1-bbbbbbbbbb/measure.md\n```\n\ngrids/quickstart.toml's cell `apc`, seed 1 "
        "(2026-11-29 07:00): 300 training updates, 15.0 CPU minutes in all (every stage, scoring included) on CPU "
        "(test, 1 thread a run).\n")
    record("d", "variator", "variator.sh", 35.35, variables={"K": "4"},
           cost={"encoder_flops_saved_percent": 44.93, "extra_params_percent": 0.664})
    assert render.quickstart_score(store, "variator").startswith(
        "```\nscore: variator k=4 BLEU4 35.35 (backbone alone 36.29), 44.9% of the encoder's FLOPs saved with 0.66% "
        "extra parameters -- work/grid/variator-s1-dddddddddd\n```\n")
    with pytest.raises(SystemExit, match="ghostbert"):
        render.quickstart_score(store, "ghostbert")


def test_the_stopping_table_says_whether_patience_or_the_cap_ended_each_student(tmp_path):
    """render.stopping_table: per current record of grids/pet.toml, its last training stage's epochs and best epoch,
    the cap (MAX_EPOCHS) or patience as what ended it, and the validation loss's fall over the epochs before the stop;
    a record of another teacher is not shown."""
    sys.path.insert(0, os.path.dirname(RENDER))
    import render
    import store as store_lib
    from grid import Grid

    store = store_lib.Store(str(tmp_path / "store"))
    path = os.path.join(REPO, "grids", "pet.toml")
    assert render.stopping_table(store, path).startswith("No student of grids/pet.toml has finished yet")
    grid = Grid(path, store=store.root)
    current = {"teacher": {"sha256": grid.teacher_sha}, "data": {"fingerprint": grid.data_fingerprint()}}

    def record(key, cell, epochs, best_epoch, curve, **fields):
        store._append({**{"key": key * 64, "grid": "pet", "cell": cell, "seed": 1,
                            "variables": {"PATIENCE": "3", "MAX_EPOCHS": "12"},
                            "commands": [{"stage": "warmup"}, {"stage": "kd"}, {"stage": "measure"}],
                            "training": {"warmup": {"epochs": 3}, "kd": {
                                "epochs": epochs, "best_epoch": best_epoch, "best_validation": min(curve),
                                "validation": [[e + 1, 10 * (e + 1), loss] for e, loss in enumerate(curve)]}}},
                       **current, **fields})

    record("a", "pet", 12, 12, [5.0 - 0.1 * e for e in range(12)])  # still falling at the cap
    record("b", "patient-kd", 8, 5, [5.0, 4.8, 4.6, 4.5, 4.4, 4.45, 4.41, 4.42])
    record("c", "can", 12, 12, [1.0] * 12, teacher={"sha256": "another teacher"})
    text = render.stopping_table(store, path, window=10)
    assert "| pet | 1 | 12 | 12 | 3.900 | the 12-epoch cap | 1.000 |" in text  # epoch 2's 4.9 minus 3.9
    assert "| patient-kd | 1 | 8 | 5 | 4.400 | patience (3 epochs without a lower loss) | - |" in text
    assert "| can |" not in text and "The epoch cap ended 1 of 2 students, patience 1." in text


@pytest.mark.parametrize("made_again", [{"teacher": {"sha256": "t2"}}, {"data": {"fingerprint": "d2"}}])
def test_a_claim_pairs_only_records_of_its_newest_teacher_and_data(tmp_path, monkeypatch, made_again):
    """A teacher made again with other weights (a GLUE teacher prepared on a new machine), or data prepared again (a
    subset added to score on), starts the claim's row afresh: the older records are neither paired with the new one's
    nor counted as its seeds."""
    import render

    store, _, _ = backbone_store(tmp_path)
    (first,) = store.find(cell="v", seed=1)
    result = {k: v for k, v in first.items() if k not in ("key", "grid", "cell", "seed", "date")}
    work = tmp_path / "w1"  # the same files again, filed as another teacher's
    result.update(made_again, outputs="outputs/variator-k4.txt",
                  references=str(work / "outputs" / "references.txt"),
                  also={"teacher": dict(first["also"]["teacher"], outputs="outputs/teacher.txt")})
    store.add("k-new", "glue", "v", 1, result, str(work))
    claim = claim_of(test="greater", threshold=-2.0)
    monkeypatch.setattr(render, "load_claims", lambda path=None: [claim])
    render._EVALUATED.clear()
    (row,) = render.claims_table(store, [claim]).splitlines()[2:]
    assert "| waiting: A 1/3 seeds, B 1/3 seeds in the store |" in row, row
