"""Every rendered block of the pages (README.md, results/*.md, the method pages) is current: what
scripts/experiments/render.py makes from the store (results/store) and the claims (grids/claims.toml) now. This replaces
the hand-kept checks of copied numbers for every block rendered so far."""
import os
import subprocess
import sys

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
