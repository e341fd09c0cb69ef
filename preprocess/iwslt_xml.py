"""Reading IWSLT (WIT3) release files: ``train.tags.*`` and the ``*.xml`` dev/test sets.

Mirrors the grep/sed lines of fairseq's prepare-iwslt14.sh: in training files, drop the
``<url>``, ``<talkid>``, ``<keywords>`` lines and strip ``<title>``/``<description>`` tags (and,
exactly like the script, keep every other line);
from XML files, keep the text of each ``<seg id=..>`` line, with curly apostrophes made straight.
"""
import re
from typing import List

from .textio import open_text

_DROP = ("<url>", "<talkid>", "<keywords>")
_TAGS = re.compile(r"</?(title|description)>")
_SEG = re.compile(r'<seg id="[0-9]*">\s*(.*?)\s*</seg>\s*$')


def read_train_tags(path: str) -> List[str]:
    out = []
    with open_text(path) as f:
        for line in f:
            if any(tag in line for tag in _DROP):
                continue
            out.append(_TAGS.sub("", line.rstrip("\n")))
    return out


def read_xml_segments(path: str) -> List[str]:
    out = []
    with open_text(path) as f:
        for line in f:
            if "<seg" in line:
                m = _SEG.search(line.rstrip("\n"))
                text = m.group(1) if m else re.sub(r'<seg id="[0-9]*">\s*|\s*</seg>\s*', "", line.strip())
                out.append(text.replace("\u2019", "'"))
    return out
