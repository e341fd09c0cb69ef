"""scripts/claims.py: the verdicts follow the 95% interval of A - B against each claim's threshold."""
import json
import os
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))
import claims  # noqa: E402


def comparison(label, low, high, p, seeds=3, a=30.0, b=29.0):
    return {"label": label, "a": a, "b": b, "diff": (low + high) / 2, "low": low, "high": high, "p": p,
            "seeds": seeds, "metric": "sacreBLEU"}


@pytest.mark.parametrize("c,threshold,expected", [
    (comparison("x", 0.2, 1.0, 0.01), 0.0, "reproduced"),
    (comparison("x", 0.2, 1.0, 0.2), 0.0, "inconclusive at this budget"),  # interval and p disagree
    (comparison("x", -1.0, -0.2, 0.01), 0.0, "not reproduced"),
    (comparison("x", -0.5, 0.5, 0.6), 0.0, "inconclusive at this budget"),
    (comparison("x", -1.5, -0.5, 0.01), -2.0, "reproduced"),  # a drop under 2 points
    (comparison("x", -3.0, -2.5, 0.01), -2.0, "not reproduced"),
    (comparison("x", 0.2, 1.0, 0.01, seeds=1), 0.0, "inconclusive (1 seed)"),
])
def test_verdicts(c, threshold, expected):
    assert claims.verdict(c, threshold) == expected


def test_table_reads_comparisons_anywhere_in_a_drivers_json_and_names_what_is_missing(tmp_path, monkeypatch):
    spec = dict(claims.CLAIMS[0], json="results/claims/x.json")  # label ^pet vs word-kd$
    missing = dict(claims.CLAIMS[1], json="results/claims/missing.json")
    monkeypatch.setattr(claims, "CLAIMS", [spec, missing])
    os.makedirs(tmp_path / "results" / "claims")
    data = {"provenance": {"command": "python scripts/bench_translation.py --seeds 1,2,3"},
            "parts": [{"comparisons": [comparison("pet vs word-kd, best-of-N", -9.0, -8.0, 0.001),
                                       comparison("pet vs word-kd", 3.0, 4.0, 0.001)]}]}
    (tmp_path / "results" / "claims" / "x.json").write_text(json.dumps(data))
    text = claims.render(str(tmp_path), ["--out", "x"])
    row = next(line for line in text.splitlines() if line.startswith("| PET"))
    assert "| pet vs word-kd |" in row and "[+3.00, +4.00]" in row and "| reproduced |" in row
    assert "python scripts/bench_translation.py --seeds 1,2,3" in text
    row = next(line for line in text.splitlines() if line.startswith("| Variator"))
    assert "not measured yet" in row and missing["command"] in row


def test_the_committed_claims_table_is_what_the_script_writes_from_the_committed_json():
    """results/claims.md (what README quotes) is scripts/claims.py's rendering of results/claims/*.json as committed:
    no row edited by hand, none left behind by a newer measurement."""
    with open(os.path.join(REPO, "results", "claims.md"), encoding="utf-8") as f:
        committed = f.read()
    assert committed == claims.render(REPO, ["--out", "results/claims.md"])
