"""Sphinx hooks for the workbook's website (_config.yml loads this as a local extension; the
site's favicon.svg, stylesheet static/convlab_site.css and script static/convlab_site.js sit
beside it).

- Solution pages show the answer without the BEGIN/END SOLUTION lines that
  scripts/make_exercises.py cuts the exercises at: the notebooks keep them, the page drops them.
- A script that a page would load twice is loaded once: sphinx-thebe registers its settings
  (`const THEBE_JS_URL = ...`) both with the app and with the builder, and the second copy is a
  SyntaxError in the browser.
- Every page loads static/convlab_site.js: the sidebar buttons a reader sees work at every width
  (the theme binds only a hidden one), and wide tables show that they scroll.
"""
from __future__ import annotations

import re

from docutils import nodes

SOLUTION_MARKER = re.compile(r"^[ \t]*(###|//)[ \t]*(BEGIN|END) SOLUTION\b[^\n]*(\n|$)", re.MULTILINE)


def drop_solution_markers(app, doctree) -> None:
    for block in doctree.findall(nodes.literal_block):
        text = block.astext()
        if not SOLUTION_MARKER.search(text):
            continue
        kept = SOLUTION_MARKER.sub("", text)
        # rawsource is what Sphinx highlights; the text node is what it falls back to
        block.rawsource = kept
        block.children = [nodes.Text(kept)]


def load_each_script_once(app, pagename, templatename, context, doctree) -> None:
    seen, scripts = set(), []
    for script in context.get("script_files", []):
        # an inline script comes once with filename None and once with "" (sphinx-thebe)
        key = (getattr(script, "filename", script) or "", tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            scripts.append(script)
    context["script_files"] = scripts


def setup(app):
    app.connect("doctree-read", drop_solution_markers)
    app.connect("html-page-context", load_each_script_once)
    app.add_js_file("convlab_site.js", loading_method="defer")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
