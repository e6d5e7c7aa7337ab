"""``abs-engine report DIR``: one self-contained HTML file of a finished (or running) job,
drawn from the statistics stored beside its checkpoints (monitor/store.py) by the
dashboard's own page and script, with everything inlined: it opens from disk, offline,
and fetches nothing.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from typing import Any

from .dashboard import STATIC
from .store import read_stats

_LINK = re.compile(r'<link\b[^>]*\bhref="static/([A-Za-z0-9_./-]+\.css)"[^>]*>')
_SCRIPT = re.compile(r'<script\b[^>]*\bsrc="static/([A-Za-z0-9_./-]+\.js)"[^>]*>\s*</script>')


def _asset(name: str) -> str:
    path = os.path.normpath(os.path.join(STATIC, name))
    if not path.startswith(STATIC + os.sep):
        raise ValueError(f"the dashboard page names an asset outside its directory: {name!r}")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if re.search(r"</(script|style)", text, re.IGNORECASE):
        raise ValueError(f"asset {name!r} cannot be inlined: it contains a closing script or style tag")
    return text


def json_for_script(doc: Any) -> str:
    """JSON that is safe inside an HTML <script> element: no ``<`` (so no ``</script>``, no
    ``<!--``) and no line separators that end a JavaScript string."""
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render(doc: dict[str, Any]) -> str:
    """The report page for a stored statistics document."""
    with open(os.path.join(STATIC, "index.html"), encoding="utf-8") as f:
        page = f.read()
    page = _LINK.sub(lambda m: f"<style>\n{_asset(m.group(1))}\n</style>", page)
    first = True

    def script(m: re.Match[str]) -> str:
        nonlocal first
        data = f"<script>window.ABS_REPORT = {json_for_script(doc)};</script>\n" if first else ""
        first = False
        return f"{data}<script>\n{_asset(m.group(1))}\n</script>"

    page = _SCRIPT.sub(script, page)
    if first or "static/" in page:
        raise ValueError("the dashboard page does not have the script and style links the report inlines")
    return page


def write_report(source: str | dict[str, Any], out: str) -> None:
    """Write the report of the job whose checkpoint directory is ``source`` to ``out``
    (CheckpointError if its statistics are missing or damaged), or of a statistics document
    (``read_stats``'), or of ``{"pipelines": [{"name": ..., **document}, ...]}``."""
    html = render(read_stats(source) if isinstance(source, str) else source)
    # A fresh temporary name (O_EXCL): a link planted where the report goes is replaced by
    # the rename, never written through.
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=os.path.dirname(os.path.abspath(out)))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(html)  # (0600, as mkstemp made it: the report holds the job's failures and sizes)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
