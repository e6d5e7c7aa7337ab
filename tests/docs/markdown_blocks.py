"""Run a Markdown page's code blocks as a test: every ```python block, in order, in one
namespace (as ``__main__``, so functions defined there are shipped to workers by value); a
```text block right after a python block is that block's expected stdout, compared with
doctest's checker (``...`` matches anything, whitespace normalised).

Run as ``python -m tests.docs.markdown_blocks PAGE.md`` in a scratch directory: it exits
non-zero naming the first block that raised or printed something else, with both outputs.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import re
import sys
import traceback
from dataclasses import dataclass

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    line: int  #: 1-based line of the opening fence
    code: str
    expected: str | None  #: the ```text block right after it, if any


def blocks(markdown: str) -> list[Block]:
    """The page's python blocks, each with the text block that immediately follows it."""
    fences = [(m.group(1), m.group(2), m.start(), m.end()) for m in FENCE.finditer(markdown)]
    out = []
    for i, (lang, body, start, end) in enumerate(fences):
        if lang != "python":
            continue
        expected = None
        if i + 1 < len(fences):
            nlang, nbody, nstart, _ = fences[i + 1]
            if nlang == "text" and not markdown[end:nstart].strip():
                expected = nbody
        out.append(Block(markdown.count("\n", 0, start) + 1, body, expected))
    return out


def run(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        page = blocks(f.read())
    if not page:
        print(f"{path}: no python blocks", file=sys.stderr)
        return 1
    namespace: dict[str, object] = {"__name__": "__main__"}
    checker = doctest.OutputChecker()
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    for block in page:
        captured = io.StringIO()
        try:
            with contextlib.redirect_stdout(captured):
                exec(compile(block.code, f"{path}:{block.line}", "exec"), namespace)
        except BaseException:  # noqa: BLE001 - report any failure, naming the block
            print(f"{path}:{block.line}: the block raised\n{traceback.format_exc()}", file=sys.stderr)
            return 1
        got = captured.getvalue()
        if block.expected is not None and not checker.check_output(block.expected, got, flags):
            print(f"{path}:{block.line}: the block printed\n{got}\nbut the page shows\n{block.expected}",
                  file=sys.stderr)
            return 1
        print(f"{path}:{block.line}: ok", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1]))
