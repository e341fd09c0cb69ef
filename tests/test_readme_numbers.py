"""Every number the README quotes about results is in the results file it cites (issue 24).

The rule, applied to README.md:

* The README is read in units: paragraphs (separated by blank lines, headings and fenced code
  blocks, which are skipped), and each table row and list item on its own.
* A unit that cites generated results files -- ``results/NAME.md`` / ``.json``, or a bare
  ``NAME.md`` that exists in ``results/`` -- must hold every result number it states in one of the
  files it cites. A result number is one with a decimal point (36.29, -0.94, 1.68x, 8.74%) or a
  whole number with ``x`` or ``%`` (73%, 2x). It is found when the cited file has the same value
  written as a number, perhaps with more trailing zeros (87.5 as 87.50, 73% as 73.0%), never
  another number that rounds to it (1.37 is not in 1.376, 1.6 not in 1.62).
* Not checked: numbers inside inline code (flags, commands), numbers in a clause about the paper
  (a clause -- the text between ``;``, ``(``, ``)``, `` -- `` and sentence ends -- that says
  "paper", "published" or "authors"), and units that cite no results file (configuration values, install notes).
  ``*_account.md`` files are prose written by hand, not a source: a unit citing only them must
  carry no result numbers.
* A unit that cites ``results/NAME`` which does not exist fails.
"""
import os
import re

import pytest

from conftest import REPO

RESULTS = os.path.join(REPO, "results")
# a results file named as results/NAME.md, results/SUB/NAME.md, ../../results/NAME.md (a page's link) or a bare NAME.md
CITATION = re.compile(r"(?<![\w/.-])((?:\.\./)*results/)?((?:[\w-]+/)*[\w.-]+\.(?:md|json))\b")
# a number not inside a word or a longer number; group 2: decimals, group 3: x or %
NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(x|%)?(?!\w|\.\d)")
PAPER_CLAUSE = re.compile(r"\b(paper|published|authors)\b", re.I)
# a reference to a part of a paper (section 4.1, Table 2, eq. 11, Fig. 3, Appendix B.4) is not a result
PAPER_REFERENCE = re.compile(r"(?:§\s*|\b(?:sections?|tables?|eqs?\.?|equations?|figs?\.?|figures?|appendix)\s+[A-Z]?)"
                             r"\d+(?:\.\d+)*", re.I)
CLAUSE_BREAK = re.compile(r";|\(|\)| -- |(?<=[.!?])\s+(?=[A-Z*])")  # and a sentence's end


def units(text):
    """(first line number, text) of each paragraph, table row and list item outside code blocks."""
    out, current, start, fenced = [], [], 0, False

    def close():
        if current:
            out.append((start, " ".join(current)))
        current.clear()

    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            close()
            fenced = not fenced
            continue
        if fenced:
            continue
        if not stripped or stripped.startswith("#"):
            close()
            continue
        if stripped.startswith("|") or re.match(r"(- |\* |\d+\. )", stripped):
            close()
            start = number
            current.append(stripped)
            if stripped.startswith("|"):
                close()
            continue
        if not current:
            start = number
        current.append(stripped)
    close()
    return out


def citations(unit, results_dir):
    """The results files a unit cites (sources, accounts) and the ``results/`` paths it names that do not exist."""
    sources, accounts, missing = [], [], []
    for explicit, name in CITATION.findall(unit):
        if "/" in name and not explicit:  # another folder's file (user_dir/pet/README.md), not a results file
            continue
        if name == "README.md":  # results/README.md is the index of the results files, holding none of their numbers
            continue
        path = os.path.join(results_dir, name)
        if not os.path.isfile(path):
            if explicit:
                missing.append("results/" + name)
            continue
        (accounts if name.endswith("_account.md") else sources).append(path)
    return list(dict.fromkeys(sources)), accounts, missing


def result_numbers(unit):
    """The result numbers a unit states, outside inline code and clauses about the paper."""
    text = PAPER_REFERENCE.sub(" ", re.sub(r"`[^`]*`", " ", unit))
    found = []
    for clause in CLAUSE_BREAK.split(text):
        if PAPER_CLAUSE.search(clause):
            continue
        for whole, decimals, suffix in NUMBER.findall(clause):
            if decimals or suffix:
                found.append(whole + decimals)
    return found


def appears_in(number, text):
    """``number`` written in ``text`` as a number of its own, perhaps with more trailing zeros (87.5 as 87.50,
    73 as 73.0): the same value, never another one rounded (1.37 is not 1.376, 1.6 is not 1.62)."""
    zeros = r"0*" if "." in number else r"(?:\.0+)?"
    return re.search(r"(?<![\w.])" + re.escape(number) + zeros + r"(?!\d|\.\d)", text) is not None


def mismatches(readme_text, results_dir, name="README.md"):
    """One line per number of page ``name`` not found in the results files its unit cites."""
    problems, cache = [], {}

    def read(path):
        if path not in cache:
            with open(path, encoding="utf-8") as f:
                cache[path] = f.read()
        return cache[path]

    for line, unit in units(readme_text):
        sources, accounts, missing = citations(unit, results_dir)
        where = f"{name}:{line} ({unit[:90]}...)"
        problems += [f"{where}: cites {m}, which does not exist" for m in missing]
        if not sources and not accounts:
            continue
        for number in result_numbers(unit):
            if not any(appears_in(number, read(p)) for p in sources):
                cited = ", ".join(os.path.basename(p) for p in sources) or "only hand-written accounts"
                problems.append(f"{where}: {number} is not in {cited}")
    return problems


# folders whose Markdown is not the project's documentation (generated results, environments, work, data)
NOT_PAGES = {"results", "work", "wheels", ".venv", ".git", "data", "fairseq_compress.egg-info"}


def pages():
    """Every Markdown page of the checkout outside results/ that cites a results file: README.md and the
    method and topic pages (user_dir/pet/README.md, ...), each a path relative to the checkout."""
    found = []
    for folder, subfolders, files in os.walk(REPO):
        subfolders[:] = sorted(d for d in subfolders if d not in NOT_PAGES and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".md"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                if any(citations(unit, RESULTS)[0] for _, unit in units(text)):
                    found.append(os.path.relpath(path, REPO))
    return found


def test_the_pages_checked_include_readme_and_every_method_page():
    found = set(pages())
    assert {"README.md", "user_dir/pet/README.md", "user_dir/baselines/README.md", "user_dir/variator/README.md",
            "user_dir/ghost/README.md", "user_dir/apc/README.md", "user_dir/bert/README.md",
            "user_dir/tools/README.md", "user_dir/deploy/README.md", "user_dir/serving/README.md",
            "scripts/README.md"} <= found, found


# pages known to quote a number their unit's results file does not hold, with the fix (strict: the test fails
# once the page is fixed, so the entry goes)
KNOWN_UNSOURCED = {}  # a page listed here fails strictly (xfail) until its numbers are sourced


RENDERED_BLOCK = re.compile(r"(<!-- rendered: [\w-]+ -->\n)(.*?)(<!-- /rendered -->)", re.S)


def typed(text):
    """A page without the contents of its rendered blocks (blank lines keep the line numbers): what scripts/
    experiments/render.py writes is checked current by tests/test_rendered.py; these checks read what is typed."""
    return RENDERED_BLOCK.sub(lambda m: m.group(1) + "\n" * m.group(2).count("\n") + m.group(3), text)


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=KNOWN_UNSOURCED[p]))
                                  if p in KNOWN_UNSOURCED else p for p in pages()])
def test_every_number_a_page_quotes_is_in_the_results_file_it_cites(page):
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        problems = mismatches(typed(f.read()), RESULTS, page)
    assert not problems, f"{page}: numbers without a source:\n" + "\n".join(problems)


def test_results_index_lists_every_results_file():
    """results/README.md (scripts/maint/results_index.py) names every committed file in results/ and its subfolders,
    each table with its status: superseded in results/archive/, current elsewhere."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("results_index", os.path.join(REPO, "scripts", "maint", "results_index.py"))
    results_index = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(results_index)
    with open(os.path.join(RESULTS, "README.md"), encoding="utf-8") as f:
        index = f.read()
    listed = set(re.findall(r"\[([\w./-]+)\]\(\1\)", index))
    files = set(results_index.results_files(RESULTS))
    assert files - listed == set(), f"not in results/README.md (run python scripts/maint/results_index.py): {files - listed}"
    assert listed - files == set(), f"results/README.md lists files that are gone: {listed - files}"
    rows = re.findall(r"^\| \[([\w./-]+\.md)\]\([^)]*\) \| (\w+) \|", index, re.M)
    assert {n for n in files if n.endswith(".md")} == {n for n, _ in rows}
    assert all(status == ("superseded" if name.startswith("archive/") else "current") for name, status in rows), rows
    assert any(n.startswith("archive/") for n in files), "results/archive/ is not read"



def score_line_problems(text, results_dir, name="README.md"):
    """A recipe's ``score:`` line a page shows in a code block is an expected output: each of its result numbers
    must be in a results file that the paragraph right after the block cites (the numbers check above skips
    code blocks)."""
    lines, problems, i = text.splitlines(), [], 0
    while i < len(lines):
        if not lines[i].strip().startswith("```"):
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")), len(lines))
        scores = [(j + 1, lines[j].strip()) for j in range(i + 1, end) if lines[j].strip().startswith("score: ")]
        after = end + 1
        while after < len(lines) and not lines[after].strip():
            after += 1
        paragraph = []
        while after < len(lines) and lines[after].strip() and not lines[after].strip().startswith(("```", "#")):
            paragraph.append(lines[after].strip())
            after += 1
        sources = citations(" ".join(paragraph), results_dir)[0]
        for number, score in scores:
            where = f"{name}:{number} ({score[:60]}...)"
            if not sources:
                problems.append(f"{where}: the paragraph after its code block cites no results file")
                continue
            texts = [open(p, encoding="utf-8").read() for p in sources]
            problems += [f"{where}: {n} is not in {', '.join(os.path.basename(p) for p in sources)}"
                         for n in result_numbers(score) if not any(appears_in(n, t) for t in texts)]
        i = end + 1
    return problems


@pytest.mark.parametrize("page", pages())
def test_every_score_line_a_page_shows_is_in_the_results_file_after_it(page):
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        problems = score_line_problems(typed(f.read()), RESULTS, page)
    assert not problems, f"{page}: expected-output lines without a source:\n" + "\n".join(problems)

@pytest.fixture
def results_dir(tmp_path):
    (tmp_path / "bench.md").write_text("| pet | 3 | 20.98 +- 0.30 | 8.74% | 1.62x |\nteacher 36.29, drop -0.80, "
                                       "F1 87.50, saves 73.0%, SST-2 -1.376\n")
    (tmp_path / "other.md").write_text("word-kd 24.54\n")
    (tmp_path / "bench_account.md").write_text("PET 20.98 and 99.99\n")
    return str(tmp_path)


def test_the_check_passes_numbers_found_in_any_cited_file(results_dir):
    readme = ("# Title\n\nThe benchmark (`results/bench.md`, `other.md`): PET **20.98 +- 0.30** at 8.74%,\n"
              "1.62x the teacher's speed, +0.80 below 36.29; word-KD 24.54 after 800 updates on 2 cores;\n"
              "F1 87.5, 73% saved.\n")
    assert mismatches(readme, results_dir) == []


def test_the_check_fails_a_drifted_number_and_names_it(results_dir):
    # the std drifted (0.31) and a speed-up (1.87x) has no source
    readme = "Text.\n\nThe benchmark (`results/bench.md`): PET 20.98 +- 0.31, 1.87x faster.\n"
    problems = mismatches(readme, results_dir)
    assert len(problems) == 2 and "README.md:3" in problems[0]
    assert "0.31 is not in bench.md" in problems[0] and "1.87 is not in bench.md" in problems[1]
    # a number that only starts like one in the file is not found (1.6 is not 1.62)
    assert mismatches("See results/bench.md: 1.6x.\n", results_dir) == [
        "README.md:1 (See results/bench.md: 1.6x....): 1.6 is not in bench.md"]
    # nor one the file's number would round to (-1.376 is -1.38, not -1.37)
    assert mismatches("See results/bench.md: -1.37.\n", results_dir)[0].endswith("1.37 is not in bench.md")


def test_a_rendered_block_is_left_to_the_render_check_and_keeps_the_line_numbers(results_dir):
    """What render.py writes between the markers is checked by tests/test_rendered.py against the store, not here;
    a number typed outside a block still is, named by its line."""
    page = ("The benchmark (`results/bench.md`):\n<!-- rendered: x -->\nPET 55.55 (`results/bench.md`)\n"
            "<!-- /rendered -->\nPET 66.66 (`results/bench.md`).\n")
    assert typed(page).count("\n") == page.count("\n") and "55.55" not in typed(page)
    problems = mismatches(typed(page), results_dir)
    assert len(problems) == 1 and "README.md:4" in problems[0] and "66.66 is not in bench.md" in problems[0]


def test_the_check_skips_paper_clauses_code_and_uncited_units_and_refuses_missing_files(results_dir):
    readme = ("PET `--lr 5.5` (results/bench.md): 20.98 (the paper's 34.36; ours 8.74%). As the paper says, 36.29.\n\n"
              "A paragraph with no citation: 12.34 and 56%.\n\n"
              "```\npython x.py --out results/bench.md 77.77\n```\n\n"
              "| row | `results/bench.md` | 36.29 | 11.11 |\n\n"
              "- a bullet citing results/nothing.md: 20.98\n")
    problems = mismatches(readme, results_dir)
    assert len(problems) == 2, problems
    # a clause about the paper ends with its sentence: the next sentence's numbers are checked
    assert mismatches("The paper agrees (results/bench.md). PET 20.99.\n", results_dir)[0].endswith(
        "20.99 is not in bench.md")
    assert "README.md:9" in problems[0] and "11.11 is not in bench.md" in problems[0]
    assert "README.md:11" in problems[1] and "cites results/nothing.md, which does not exist" in problems[1]
    # references to a paper's parts are not results; the result beside them still is
    assert mismatches("Fig. 3, §4.1, section 3.2, eq. 11, Table 2.1 (results/bench.md): 20.99.\n", results_dir) == [
        "README.md:1 (Fig. 3, §4.1, section 3.2, eq. 11, Table 2.1 (results/bench.md): 20.99....): 20.99 is not in bench.md"]
    # a hand-written account is no source: its numbers must be in a generated file
    assert mismatches("As `results/bench_account.md` says: 99.99.\n", results_dir) == [
        "README.md:1 (As `results/bench_account.md` says: 99.99....): 99.99 is not in only hand-written accounts"]


def test_the_score_line_check_needs_a_cited_source_after_the_block(results_dir):
    page = ("Run it; it reads\n\n```\nscore: pet BLEU (tok) 20.98 (teacher 36.29) at 8.74% -- x\n```\n\n"
            "(`results/bench.md`: the same run.)\n")
    assert score_line_problems(page, results_dir) == []
    # a drifted number, and a line whose paragraph cites nothing, fail and are named
    drifted = page.replace("20.98", "20.97")
    assert score_line_problems(drifted, results_dir) == [
        "README.md:4 (score: pet BLEU (tok) 20.97 (teacher 36.29) at 8.74% -- x...): 20.97 is not in bench.md"]
    assert "cites no results file" in score_line_problems(page.replace("`results/bench.md`", "a run"),
                                                          results_dir)[0]


def test_a_results_subfolder_citation_is_checked_and_another_folders_page_is_not_a_citation(results_dir):
    os.makedirs(os.path.join(results_dir, "claims"))
    with open(os.path.join(results_dir, "claims", "pet.md"), "w") as f:
        f.write("-3.65 [-4.46, -3.15]\n")
    assert mismatches("PET -3.65 [-4.46, -3.15] ([results/claims/pet.md](results/claims/pet.md)).\n", results_dir) == []
    assert mismatches("PET -3.66 (`results/claims/pet.md`).\n", results_dir)[0].endswith("3.66 is not in pet.md")
    # a page of another folder named in a unit is no results file: its numbers stay unchecked
    assert mismatches("See user_dir/pet/bench.md: 12.34.\n", results_dir) == []


# ---- claim sentences quote results/claims.md: its verdict with its budget, its numbers (issue 44) ----------
CLAIMS_CITATION = re.compile(r"(?<![\w/.-])(?:\.\./)*results/claims(?:\.md\b|/)")
VERDICT = re.compile(r"\b(not reproduced|reproduced|inconclusive|not recomputed)\b(?:[^;.()]*? at ((?:\d[\d,]*|[\d +]+)"
                     r"[^;()]*? on a CPU))?", re.I)
NOT_A_VERDICT = re.compile(r"\b(level with|both reproduced|at this budget)\b", re.I)
INTERVAL = re.compile(r"\[[+-]?\d+(?:\.\d+)?, [+-]?\d+(?:\.\d+)?\]")
# a difference quoted with its interval ("+0.75 [-0.86, +2.35]"): the table's A - B of the row holding that interval
QUOTED_DIFFERENCE = re.compile(r"(?<![\w.])([+-]\d+(?:\.\d+)?) (" + INTERVAL.pattern + ")")


def claims_rows(results_dir):
    """results/claims.md's rows as lists of cells (``\\|`` inside a cell is not a column break)."""
    path = os.path.join(results_dir, "claims.md")
    if not os.path.isfile(path):
        return None, ""
    text = open(path, encoding="utf-8").read()
    rows, legacy = [], False
    for line in text.splitlines():  # the rows of the benchmark tables' table (the store's are checked by rendering)
        if line.startswith("| "):
            legacy = legacy or line.startswith("| method |")
            if legacy and not line.startswith("| method |"):
                rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
        elif line.strip():
            legacy = False
    return rows, text


def claim_problems(text, results_dir, name="README.md"):
    """A unit that cites the claims (results/claims.md or results/claims/...) and says a verdict must cite
    results/claims.md, say each verdict with its budget as the table does (a row whose verdict is 'VERDICT at
    BUDGET', or for 'not recomputed' a row of that budget which was not recomputed), use no verdict the table
    does not give ('level with', 'both reproduced', a budget-less 'at this budget'), and quote only intervals the
    table holds."""
    rows, table = claims_rows(results_dir)
    problems = []
    for line, unit in units(text):
        if not CLAIMS_CITATION.search(unit) or not VERDICT.search(re.sub(r"`[^`]*`", " ", unit)):
            continue
        where = f"{name}:{line} ({unit[:90]}...)"
        if rows is None or not re.search(r"(?<![\w/.-])(?:\.\./)*results/claims\.md\b", unit):
            problems.append(f"{where}: states a claim's verdict but does not cite results/claims.md")
            continue
        prose = re.sub(r"`[^`]*`", " ", unit)
        problems += [f"{where}: '{m.group(1)}' is not a verdict of results/claims.md" for m in NOT_A_VERDICT.finditer(prose)]
        for m in VERDICT.finditer(prose):
            verdict, budget = m.group(1).lower(), m.group(2)
            if not budget:
                problems.append(f"{where}: '{verdict}' without its budget ('{verdict} at N updates on a CPU')")
            elif verdict == "not recomputed":
                if not any(r[4] == budget and "not recomputed" in r[-2] for r in rows):
                    problems.append(f"{where}: no row of budget '{budget}' is 'not recomputed' in results/claims.md")
            elif not any(r[-2] == f"{verdict} at {budget}" for r in rows):
                problems.append(f"{where}: no row of results/claims.md says '{verdict} at {budget}'")
        problems += [f"{where}: the interval {i} is not in results/claims.md" for i in INTERVAL.findall(prose)
                     if i not in table]
        problems += [f"{where}: '{m.group(0)}' is not a difference and interval of results/claims.md"
                     for m in QUOTED_DIFFERENCE.finditer(prose) if m.group(2) in table and m.group(0) not in table]
    return problems


@pytest.mark.parametrize("page", pages())
def test_every_claim_verdict_a_page_states_is_the_claims_tables(page):
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        problems = claim_problems(f.read(), RESULTS, page)
    assert not problems, f"{page}: claim sentences that are not the claims table's:\n" + "\n".join(problems)


def test_the_claim_check_catches_a_verdict_without_budget_a_foreign_interval_and_a_made_up_verdict(tmp_path):
    (tmp_path / "claims.md").write_text(
        "| method | ... |\n"
        "| A | beats B | paper | A - B > 0 | 300 updates on a CPU | sel | A vs B | f1 | 3 | 1.00 | 0.50 | "
        "+0.50 [+0.10, +0.90] | ... | 0.01 | 0.02 | - | reproduced at 300 updates on a CPU | `x.md` |\n"
        "| C | on par | paper | \\|A - B\\| < 1 | 800 updates on a CPU | sel | C vs D | f1 | 3 | 1.00 | 0.50 | "
        "+0.50 (no interval: not re-tested) | - | - | - | - | not recomputed with the cluster test; rerun | `y.md` |\n")
    good = ("A beats B by +0.50 [+0.10, +0.90], reproduced at 300 updates on a CPU; C is not recomputed with the "
            "cluster test at 800 updates on a CPU ([results/claims.md](results/claims.md)).\n")
    assert claim_problems(good, str(tmp_path)) == []
    bad = {"A beats B, reproduced (results/claims.md).\n": "without its budget",
           "A beats B, reproduced at 800 updates on a CPU (results/claims.md).\n": "no row of results/claims.md says",
           "A beats B by +0.50 [+0.10, +0.95], reproduced at 300 updates on a CPU (results/claims.md).\n":
               "[+0.10, +0.95] is not in",
           "A beats B by +0.55 [+0.10, +0.90], reproduced at 300 updates on a CPU (results/claims.md).\n":
               "'+0.55 [+0.10, +0.90]' is not a difference and interval",
           "C is level with D, inconclusive at 800 updates on a CPU (results/claims.md).\n": "'level with'",
           "C, not recomputed at 300 updates on a CPU (results/claims.md).\n": "no row of budget",
           "A beats B, reproduced at 300 updates on a CPU (results/claims/x.md).\n": "does not cite results/claims.md"}
    for text, expected in bad.items():
        problems = claim_problems(text, str(tmp_path))
        assert problems and expected in problems[0], (text, problems)


# ---- the README's decision table: each method row points to its rendered claims, or to the archive (issue 56) ----
# the README's method names (the table's first column) -> results/claims.md's method column
DECISION_METHODS = {"PET": "PET", "PET's competitors": "PET", "Variator": "Variator", "GhostBERT": "GhostBERT",
                    "APC": "APC"}
# methods whose claims are rendered from the store (scripts/experiments/render.py; tests/test_rendered.py checks them):
# their row points to the rendered block instead of quoting numbers
STORE_RENDERED = {"PET", "PET's competitors", "Variator", "GhostBERT", "APC"}
STORE_POINTER = "[claims](results/claims.md): rendered from the store, below the table"
# a method whose claims have not run through the grid yet points to its archived short-budget rows, quoting none
ARCHIVE_POINTER = "(results/archive/claims_short_cpu_budgets.md)"


def decision_table(text):
    """(line number, method, expected-change cell) of each row of the first table whose header has an
    'expected change' column."""
    lines, rows = text.splitlines(), []
    for i, line in enumerate(lines):
        if line.startswith("| method |") and "expected change" in line:
            header = [c.strip() for c in line.strip().strip("|").split("|")]
            column = next(j for j, c in enumerate(header) if c.startswith("expected change"))
            for number, row in enumerate(lines[i + 2:], i + 3):
                if not row.startswith("|"):
                    break
                cells = [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]
                rows.append((number, cells[0], cells[column]))
            break
    return rows


def decision_table_problems(text, results_dir, name="README.md"):
    """One line per problem of the decision table: a method row quoting no claim, a quote not in the form above,
    or one no row of results/claims.md of that method holds (its comparison, metric, A - B head, verdict with
    budget; for a ratio row, whose comparison and metric are '-': a part of its claim and 'ratio')."""
    rows, _ = claims_rows(results_dir)
    table = decision_table(text)
    if not table:
        return [f"{name}: no decision table (a '| method | ... | expected change ... |' header)"]
    problems = []
    for line, method, cell in table:
        where = f"{name}:{line} ({method})"
        family = DECISION_METHODS.get(re.sub(r"\s*\(.*", "", method))
        if re.sub(r"\s*\(.*", "", method) in STORE_RENDERED:
            if STORE_POINTER not in cell:
                problems.append(f"{where}: its claims are rendered from the store: the cell says '{STORE_POINTER}'")
            continue
        if family is None:
            problems.append(f"{where}: not a method of results/claims.md")
            continue
        if ARCHIVE_POINTER not in cell or VERDICT.search(re.sub(r"\[[^\]]*\]\([^)]*\)", " ", cell)):
            problems.append(f"{where}: not rendered from the store yet: the cell links {ARCHIVE_POINTER} and "
                            "states no verdict")
    return problems


def test_the_readme_decision_table_quotes_the_claims_table():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        problems = decision_table_problems(f.read(), RESULTS)
    assert not problems, "README.md's decision table against results/claims.md:\n" + "\n".join(problems)


def test_the_decision_table_check_needs_the_rendered_claims_or_the_archive_without_a_verdict(tmp_path, monkeypatch):
    monkeypatch.setitem(DECISION_METHODS, "A", "A")
    head = "| method | compresses | expected change | page |\n| --- | --- | --- | --- |\n"
    rendered = f"| PET | translation | 37.84 against 36.29<br>{STORE_POINTER} | p |\n"
    archived = "| A | both | not run through the grid yet: [archived rows](results/archive/claims_short_cpu_budgets.md) | p |\n"
    assert decision_table_problems(head + rendered + archived, str(tmp_path)) == []
    bad = {rendered.replace(STORE_POINTER, "[claims](results/claims.md)"): "rendered from the store",
           archived.replace("yet:", "yet, reproduced at 300 updates on a CPU:"): "states no verdict",
           archived.replace("results/archive/claims_short_cpu_budgets.md", "results/claims.md"): "not rendered",
           archived.replace("| A |", "| B |"): "not a method"}
    for text, expected in bad.items():
        problems = decision_table_problems(head + text, str(tmp_path))
        assert problems and expected in problems[0], (text, problems)
    assert "no decision table" in decision_table_problems("| model | x |\n", str(tmp_path))[0]
