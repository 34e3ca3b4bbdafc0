"""Every code block of the README and of ``docs/*.md`` runs as written (local backend),
so the documentation cannot drift from the code.

Blocks are fenced (```python, ```sh, ```bash), at the margin or indented inside a
list item (the fence's indentation is taken off its lines); an unfenced indented code
block fails the test, in a list too (the runner could not tell its language, nor, in
a list, code from prose). The line just before a fence may tag it:

- ``<!-- docs-test: skip: REASON -->``: not run here (a Slurm cluster, Docker, an
  installer, a fragment); the reason is the skip message;
- ``<!-- docs-test: slow -->``: run in the slow suite only (``-m slow``);
- ``<!-- docs-test: excerpt PATH -->``: the block must appear verbatim in ``PATH``,
  which is run instead.

Each file's blocks run in order in one scratch directory holding copies of
``examples/`` and ``configs/``, so a later block sees what an earlier one wrote.
``.venv/bin/`` in commands means this interpreter's directory. New ``docs/*.md`` files
are picked up without changes here.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^( *)```(\w*)\s*$")
CLOSE = re.compile(r"^ *```\s*$")
TAG = re.compile(r"^\s*<!--\s*docs-test:\s*(skip|slow|excerpt)\s*:?\s*(.*?)\s*-->\s*$")
LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s")
BIN = str(Path(sys.executable).parent)


def blocks(path):
    """(line, language, tag, argument, code) of each fenced block of ``path``."""
    return blocks_of(path.read_text(encoding="utf-8"))


def _dedent(line, indent):
    return line[len(indent):] if line.startswith(indent) else line.lstrip(" ")


def blocks_of(text):
    """(line, language, tag, argument, code) of each fenced block of markdown ``text``;
    a fence indented in a list item has its indentation taken off its lines."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match:
            start, indent, language = i, match.group(1), match.group(2)
            end = next((j for j in range(i + 1, len(lines)) if CLOSE.match(lines[j])),
                       len(lines))
            tag = TAG.match(lines[start - 1]) if start else None
            code = "\n".join(_dedent(line, indent) for line in lines[start + 1:end]) + "\n"
            found.append((start + 1, language, tag.group(1) if tag else None,
                          tag.group(2) if tag else "", code))
            i = end + 1
            continue
        i += 1
    return found


def indented_blocks(path):
    """Line numbers of unfenced indented code blocks of ``path``."""
    return indented_blocks_of(path.read_text(encoding="utf-8"))


def indented_blocks_of(text):
    """Line numbers of unfenced indented code blocks of markdown ``text``: lines
    indented by 4 spaces or more after a blank line, at the margin or in a list item
    (where a list's own prose continues with 2 spaces; a nested item is no code)."""
    lines, inside, found = text.splitlines(), False, []
    for n, line in enumerate(lines):
        if FENCE.match(line) or (inside and CLOSE.match(line)):
            inside = not inside
            continue
        if (not inside and line.startswith("    ") and line.strip() and n > 0
                and not lines[n - 1].strip() and not LIST_ITEM.match(line)
                and not TAG.match(line)):
            found.append(n + 1)
    return found


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_code_blocks_are_fenced(doc):
    assert indented_blocks(doc) == [], f"{doc.name}: indented code blocks at lines " \
        f"{indented_blocks(doc)}; fence them (```sh / ```python) so they are run"


def _cases():
    for doc in DOCS:
        for line, language, tag, argument, code in blocks(doc):
            marks = [pytest.mark.slow] if tag == "slow" else []
            if tag == "skip":
                marks.append(pytest.mark.skip(reason=f"{doc.name}:{line}: {argument}"))
            yield pytest.param(doc, line, language, tag, argument, code,
                               id=f"{doc.name}:{line}", marks=marks)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """One scratch directory per document (blocks of a file run in order)."""
    made = {}

    def get(doc):
        if doc not in made:
            where = tmp_path_factory.mktemp(doc.stem)
            for name in ("examples", "configs"):
                shutil.copytree(ROOT / name, where / name)
            (where / "scripts").symlink_to(ROOT / "scripts")
            made[doc] = where
        return made[doc]
    return get


def _is_excerpt(code, source):
    """Whether every non-blank line of ``code`` is a line of ``source`` (leading
    whitespace aside: the file's code may sit under ``if __name__ == "__main__"``), in
    the same order."""
    wanted = [line.strip() for line in code.splitlines() if line.strip()]
    lines = iter(line.strip() for line in source.splitlines())
    return all(any(line == want for line in lines) for want in wanted)


def _run(command, cwd):
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{command}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    return done


@pytest.mark.parametrize("doc,line,language,tag,argument,code", list(_cases()))
def test_block_runs(scratch, doc, line, language, tag, argument, code):
    where = scratch(doc)
    if tag == "excerpt":
        source = (ROOT / argument).read_text(encoding="utf-8")
        assert _is_excerpt(code, source), \
            f"{doc.name}:{line}: the block's lines are not lines of {argument}, in order"
        _run([sys.executable, str(where / argument)], where)
    elif language == "python":
        script = where / f"block_{line}.py"
        script.write_text(code)
        _run([sys.executable, str(script)], where)
    elif language in ("sh", "bash", "console", ""):
        script = code.replace(".venv/bin/", f"{BIN}/")
        _run(["bash", "-euo", "pipefail", "-c", script], where)
    else:
        pytest.fail(f"{doc.name}:{line}: unknown block language {language!r}")


LIST_DOC = """Intro.

- a step, then its command:

  <!-- docs-test: skip: an example -->
  ```sh
  .venv/bin/fiberrl ps
  ```
- another:

      .venv/bin/fiberrl backends

    - a nested item after a blank line is no code
"""


def test_the_runner_takes_fenced_blocks_inside_lists():
    (line, language, tag, argument, code), = blocks_of(LIST_DOC)
    assert (line, language, tag, argument) == (6, "sh", "skip", "an example")
    assert code == ".venv/bin/fiberrl ps\n"   # the fence's indentation taken off


def test_unfenced_code_inside_a_list_is_refused():
    assert indented_blocks_of(LIST_DOC) == [11]
