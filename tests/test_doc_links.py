"""Every relative link and every ``results/`` reference in the documentation resolves (issue 46).

The pages: README.md and every Markdown file under user_dir/, scripts/, preprocess/ (not the corpora's upstream
files in preprocess/data/), results/ and checkpoints/; not results/archive/, whose tables are kept as they were
written, naming scripts since deleted (git keeps them).
Outside fenced code blocks (read with test_readme_numbers' ``units``):

* a link ``[text](path)`` or ``[text](path#anchor)`` that is not http(s) or mailto names a file or folder that
  exists, relative to the page; an anchor is one of the target page's headings (GitHub's slugs);
* a ``results/...`` path (or ``scripts/``, ``user_dir/``, ``preprocess/``, ``tests/``, ``checkpoints/``: an old
  script name), in a code span or plain, names a file or folder that exists, relative to the checkout
  (as commands are run from it) or, for ``../results/...``, to the page. A glob (``results/translation_800_*.md``)
  or a placeholder (``results/NAME``, ``results/<table>.json``) matches at least one file; a command's
  output prefix (``--out results/apc_300_updates``) names at least one file ``results/apc_300_updates.*``.

That every number a page quotes is in the results file it cites is test_readme_numbers'.
"""
import glob
import os
import re

import pytest

from conftest import REPO
from test_readme_numbers import units

FOLDERS = ("user_dir", "scripts", "preprocess", "results", "checkpoints")
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?\s*\)")
# results/NAME... not inside a longer path (work/results/x.md is a run's own folder), optionally after ../
# (group 1: a command's --out before it); the same for a path into the other folders of the checkout
PATH_REF = re.compile(r"(--out\s+)?(?<![\w/.-])((?:\.\./)*(?:results|scripts|user_dir|preprocess|tests|checkpoints)/"
                         r"[\w.*/<>-]*[\w*>])")
# a placeholder in a documented path: results/NAME, results/<table>.json
PLACEHOLDER = re.compile(r"<[^>]*>|(?<![a-z])[A-Z]{2,}(?![a-z])")


def doc_pages(repo=REPO):
    """README.md and the Markdown pages of the documented folders, relative to ``repo``."""
    found = ["README.md"] if os.path.isfile(os.path.join(repo, "README.md")) else []
    for top in FOLDERS:
        for folder, subfolders, files in os.walk(os.path.join(repo, top)):
            # preprocess/data/ holds the corpora's upstream files, their links the upstream repository's
            # results/archive/ keeps superseded tables as they were written
            subfolders[:] = sorted(d for d in subfolders if not d.startswith((".", "__")) and d != "data"
                                   and os.path.join(folder, d) != os.path.join(repo, "results", "archive"))
            found += [os.path.relpath(os.path.join(folder, n), repo) for n in sorted(files) if n.endswith(".md")]
    return found


def slug(heading):
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lstrip("#").strip())  # a link's text
    text = re.sub(r"[^\w\- ]", "", text.replace("`", "").lower())
    return text.replace(" ", "-")


def anchors(text):
    """The anchors of a page's headings (outside code blocks), repeated ones numbered as GitHub does."""
    seen, fenced, out = {}, False, set()
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            base = slug(line)
            out.add(base if base not in seen else f"{base}-{seen[base]}")
            seen[base] = seen.get(base, 0) + 1
    out.update(re.findall(r"<a (?:name|id)=\"([^\"]+)\"", text))
    return out


def _exists(path, output=False):
    """A file or folder, a glob matching one, or a command's output prefix (--out results/apc_300_updates
    writes results/apc_300_updates.md, .json, ...); an ``--out`` path may also be a file's intermediate
    (--out results/teacher_multi30k.md.table, renamed to results/teacher_multi30k.md)."""
    path = PLACEHOLDER.sub("*", path)
    if "*" in path:
        return bool(glob.glob(path))
    if os.path.exists(path) or glob.glob(glob.escape(path) + ".*"):
        return True
    return output and any(path.startswith(f + ".") for f in glob.glob(glob.escape(path.split(".")[0]) + ".*"))


def link_problems(text, page, repo=REPO):
    """One line per relative link or results/ reference of page ``page`` (relative to ``repo``) that does not
    resolve."""
    here = os.path.dirname(os.path.join(repo, page))
    problems, cache = [], {}

    def page_anchors(path):
        if path not in cache:
            with open(path, encoding="utf-8") as f:
                cache[path] = anchors(f.read())
        return cache[path]

    for line, unit in units(text):
        where = f"{page}:{line}"
        for target in LINK.findall(unit) + IMAGE.findall(unit):
            if re.match(r"[a-z][\w+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            if not path:  # an anchor of this page
                if anchor.lower() not in anchors(text):
                    problems.append(f"{where}: link to {target}: no heading #{anchor} in {page}")
                continue
            full = os.path.normpath(os.path.join(here, path))
            if not os.path.exists(full):
                problems.append(f"{where}: link to {target}: {os.path.relpath(full, repo)} does not exist")
            elif anchor and full.endswith(".md") and anchor.lower() not in page_anchors(full):
                problems.append(f"{where}: link to {target}: no heading #{anchor} in {os.path.relpath(full, repo)}")
        prose = LINK.sub(lambda m: " ", unit)  # a link's target was checked above
        for out, ref in PATH_REF.findall(prose):
            ref = ref.rstrip(".")
            full = os.path.normpath(os.path.join(here if ref.startswith("..") else repo, ref))
            if not _exists(full, output=bool(out)):
                problems.append(f"{where}: {ref} does not exist")
    return problems


@pytest.mark.parametrize("page", doc_pages())
def test_every_relative_link_and_results_reference_of_a_page_resolves(page):
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        problems = link_problems(f.read(), page)
    assert not problems, f"{page}: references that do not resolve:\n" + "\n".join(problems)


def test_the_pages_include_the_readme_every_method_page_and_the_results():
    found = set(doc_pages())
    assert {"README.md", "user_dir/pet/README.md", "user_dir/apc/README.md", "scripts/README.md",
            "preprocess/README.md", "results/README.md", "results/claims.md"} <= found, found


def test_the_check_catches_a_missing_file_a_missing_heading_and_a_missing_results_file(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.md").write_text("# A\n\n## The `x` table (3 seeds)\n")
    (tmp_path / "docs").mkdir()
    page = ("# Top\n\n## Quick start\n\n"
            "See [a](../results/a.md), [its table](../results/a.md#the-x-table-3-seeds), [here](#quick-start),\n"
            "[the web](https://example.org/none.md), `results/a.md`, results/a.md. and results/*.md,\n"
            "`--out results/a` and `results/<name>.md`, results/NAME.md, `--out results/a.md.table`.\n\n"
            "```\npython x.py --out results/made_by_the_command.md [b](gone.md)\n```\n")
    assert link_problems(page, "docs/page.md", str(tmp_path)) == []
    bad = page + ("\n[b](../results/b.md) and [c](../results/a.md#no-such) and [d](#quick) "
                  "and `results/b.md` and results/c.png, results/z*.md, `bash scripts/old_name.sh`\n")
    problems = link_problems(bad, "docs/page.md", str(tmp_path))
    assert [p.split(": ", 1)[1] for p in problems] == [
        "link to ../results/b.md: results/b.md does not exist",
        "link to ../results/a.md#no-such: no heading #no-such in results/a.md",
        "link to #quick: no heading #quick in docs/page.md",
        "results/b.md does not exist", "results/c.png does not exist", "results/z*.md does not exist",
        "scripts/old_name.sh does not exist"]
    assert all(p.startswith("docs/page.md:13:") for p in problems)
    # a prefix is a whole file name's stem (results/a. not results/), a placeholder matches a file
    assert [p.split(": ", 1)[1] for p in link_problems("`--out results/b` or `results/ab`, results/<x>.png, "
                                                       "results/a.md.table, `--out results/b.md.table`\n",
                                                       "docs/page.md", str(tmp_path))] == [
        "results/b does not exist", "results/ab does not exist", "results/<x>.png does not exist",
        "results/a.md.table does not exist", "results/b.md.table does not exist"]


# ---- the method pages share one skeleton, each short, each linking the glossary (issue 46) -------------------
METHOD_PAGES = ["user_dir/pet/README.md", "user_dir/variator/README.md", "user_dir/ghost/README.md",
                "user_dir/apc/README.md", "user_dir/baselines/README.md", "user_dir/bert/README.md"]
SKELETON = ["What it does", "Quickstart", "Your own model", "Options", "Results", "Limits", "Citation"]
MAX_PAGE_BYTES = 10_000
GLOSSARY = "user_dir/GLOSSARY.md"


def skeleton_problems(text, limit=MAX_PAGE_BYTES):
    """What keeps a method page from the skeleton: over ``limit`` bytes, or its ``## `` headings (outside code
    blocks) not exactly SKELETON in order, or no link to the glossary, or no link to its NOTES.md."""
    problems = []
    if len(text.encode("utf-8")) > limit:
        problems.append(f"{len(text.encode('utf-8'))} bytes, over {limit}")
    headings, fenced = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            headings.append(line[3:].strip())
    if headings != SKELETON:
        problems.append(f"headings {headings}, not {SKELETON}")
    targets = [t.partition("#")[0] for _, unit in units(text) for t in LINK.findall(unit)]
    if "../GLOSSARY.md" not in targets:
        problems.append("no link to ../GLOSSARY.md")
    if "NOTES.md" not in targets:
        problems.append("no link to NOTES.md")
    return problems


@pytest.mark.parametrize("page", METHOD_PAGES)
def test_every_method_page_is_short_has_the_skeleton_and_links_the_glossary_and_its_notes(page):
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        problems = skeleton_problems(f.read())
    assert not problems, f"{page}: " + "; ".join(problems)
    assert os.path.isfile(os.path.join(REPO, os.path.dirname(page), "NOTES.md")), f"{page}: its NOTES.md is missing"


def test_the_glossary_exists_and_defines_the_papers_symbols_and_the_package_terms():
    with open(os.path.join(REPO, GLOSSARY), encoding="utf-8") as f:
        text = f.read()
    defined = anchors(text)
    assert {"k", "r", "m", "cmp", "compr-only", "finalized", "apc-50-ff", "warm-up-classes", "word-level-kd",
            "sequence-level-kd", "pruned-only", "ghost-module", "plugin", "bleu", "budget", "cluster-test", "holm",
            "tost-margin"} <= defined, defined


def test_every_results_reference_of_a_method_page_is_a_link():
    """A method page names a results file only as a Markdown link (outside code blocks), never in a code span."""
    span = re.compile(r"`[^`]*(?<![\w/.-])(?:\.\./)*results/[\w./-]*\.(?:md|json|png)[^`]*`")
    for page in METHOD_PAGES:
        with open(os.path.join(REPO, page), encoding="utf-8") as f:
            found = [unit for _, unit in units(f.read()) if span.search(LINK.sub(" ", unit))]
        assert not found, f"{page}: results files named in code spans, not links: {found}"


def test_the_skeleton_check_catches_a_long_page_a_missing_or_reordered_heading_and_a_missing_glossary_link():
    good = ("# X\n\n[the glossary](../GLOSSARY.md), [NOTES.md](NOTES.md)\n\n"
            + "".join(f"## {h}\n\ntext\n\n" for h in SKELETON) + "```\n## not a heading\n```\n")
    assert skeleton_problems(good) == []
    assert skeleton_problems(good, limit=100)[0].endswith("over 100")
    swapped = good.replace("## Options", "## TMP").replace("## Results", "## Options").replace("## TMP", "## Results")
    assert "not [" in skeleton_problems(swapped)[0]
    assert "not [" in skeleton_problems(good.replace("## Limits\n", "## Refused flags\n"))[0]
    assert skeleton_problems(good.replace("(../GLOSSARY.md)", "(GLOSSARY.md)")) == ["no link to ../GLOSSARY.md"]
    assert skeleton_problems(good.replace("(NOTES.md)", "(notes.md)")) == ["no link to NOTES.md"]
