"""Small helpers the chapters' notebooks share: showing a kernel file (a listing, or what changed
from another kernel), tables, profile cards side by side and glued figures for the page, and
running a demonstration on the CPU emulator even when the notebook runs on a GPU.

Also where the repository is (repo_root, path: convlab.gpu._paths) and the page's number format and
tables (sig, table, Table, table_html: convlab.measuring.tables), so a notebook finds them all here.
"""
from __future__ import annotations

import ast
import difflib
import html
import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

# paths and the page's tables live below (the runtime and the profiler use them too); the
# notebooks find them here as book.repo_root, book.path, book.sig, book.table
from ..gpu import runtime
from ..gpu._paths import path, repo_root
from ..measuring.cards import card_value, column_head
from ..measuring.tables import Table, sig, table, table_html  # noqa: F401 - re-exported for the notebooks
from .listings import Source


def progress(iterable, desc: str = "", **kwargs):
    """A tqdm progress bar for sweeps that stays short in a saved notebook: it redraws at most every
    30 s, so the executed notebook (and the website) keep a few lines instead of every step."""
    try:
        from tqdm import tqdm
    except ImportError:  # an offline GPU machine may lack tqdm: the sweep runs without a bar
        return iterable
    kwargs.setdefault("mininterval", 30.0)
    kwargs.setdefault("dynamic_ncols", False)
    return tqdm(iterable, desc=desc, **kwargs)


def on_emulator(demo: Callable[[], object] | str, timeout: float = 600) -> None:
    """Run `demo` on the CPU emulator in a fresh Python process and print what it printed.

    For the fault demonstrations (a missing bounds check, a missing barrier): the emulator names
    the fault, a GPU may not, so these run on the emulator wherever the notebook runs, and the
    page a GPU run leaves shows the emulator's real message. `demo` is a function that takes no
    arguments and imports what it uses (only its source travels: the notebook's variables stay
    behind), a function of convlab's own modules (imported there: defining_source), or Python
    source. The process runs in the notebook's folder with
    CONVLAB_BACKEND=emu and no GPU visible. If the demonstration itself fails, RuntimeError
    carries its output.
    """
    if callable(demo):
        try:
            code = defining_source(demo) + f"\n{demo.__name__}()\n"
        except (OSError, TypeError):
            raise TypeError(f"on_emulator({demo!r}): its source cannot be found; define it with `def` "
                            "in a notebook cell or a file, or pass the code as a string") from None
    else:
        code = textwrap.dedent(demo)
    root = str(repo_root())
    env = {**os.environ, "CONVLAB_BACKEND": "emu", "CUDA_VISIBLE_DEVICES": "", "CONVLAB_ROOT": root,
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", code], cwd=os.getcwd(), env=env, capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the emulator demonstration failed (exit status {done.returncode}):\n"
                           f"{done.stdout}{done.stderr}")
    print(done.stdout, end="")
    if done.stderr:
        print(done.stderr, end="", file=sys.stderr)


def defining_source(fn: Callable) -> str:
    """Python source that defines `fn` in a fresh process: the import of a function of convlab's
    own modules (a chapter's figure), else fn's own source (a notebook's function)."""
    module = getattr(fn, "__module__", "") or ""
    if module.split(".")[0] == "convlab" and fn.__qualname__ == fn.__name__:
        return f"from {module} import {fn.__name__}\n"
    return textwrap.dedent(inspect.getsource(fn))


def figure_on_emulator(make: Callable[[], object], timeout: float = 600):
    """The matplotlib Figure that `make()` returns, made on the CPU emulator.

    For pictures of a launch (cl.draw, cl.trace): the emulator records every access, a GPU does
    not. On the emulator `make` simply runs here; elsewhere it runs in a fresh Python process with
    CONVLAB_BACKEND=emu (as on_emulator: `make` is a function that takes no arguments and imports
    what it uses, or a function of a module there, such as a chapter's, which is imported), and the
    figure comes back pickled, its `convlab_data` included.
    """
    if runtime.device().backend == "emu":
        return make()
    if not callable(make):
        raise TypeError("figure_on_emulator(make): pass a function that returns a Figure")
    import pickle
    import tempfile

    with tempfile.TemporaryDirectory(prefix="convlab-figure-") as folder:
        out = Path(folder) / "figure.pickle"
        body = defining_source(make)
        on_emulator(f"{body}\nimport pickle\nwith open({str(out)!r}, 'wb') as f:\n"
                    f"    pickle.dump({make.__name__}(), f)\n", timeout=timeout)
        with out.open("rb") as f:
            return pickle.load(f)


GLUE_PREFIX = "application/papermill.record/"   # what myst-nb's {glue} roles read from a cell's outputs


def _as_glue_text(text: str) -> str:
    """The text/plain that {glue:text} shows as `text`. myst-nb reads it with ast.literal_eval first
    (to strip a string's quotes), which turns "2,304" into the tuple (2, 304): such text is stored
    quoted; text that reads back as itself (or not at all) is stored as it is."""
    try:
        back = ast.literal_eval(text)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return text
    return text if str(back) == text else repr(text)


def glue(name: str, value, fmt: str | None = None):
    """Store a value for the prose: a markdown cell shows it with {glue:text}`name`, so every number
    in the text comes from the data it describes. The same output myst_nb.glue writes, without
    needing myst-nb where the notebook runs. fmt formats the value here (e.g. ".2f"); None or NaN
    (no results committed yet) shows as a dash. A value with HTML (book.table(...)) is stored as
    HTML too, for a ```{glue:} name``` block (a table inside a dropdown, say). Returns the value."""
    from IPython.display import display

    missing = value is None or (isinstance(value, float) and value != value)
    text = "—" if missing else (format(value, fmt) if fmt else str(value))
    data = {GLUE_PREFIX + "text/plain": _as_glue_text(text)}
    if not missing and hasattr(value, "_repr_html_"):
        data[GLUE_PREFIX + "text/html"] = value._repr_html_()
    display(data, raw=True, metadata={"scrapbook": {"name": name, "mime_prefix": GLUE_PREFIX}})
    return value


# ---- pages: listings, diffs, tables, figures ---------------------------------------------------
# Outputs carry text/markdown (MyST, parsed by the site: _config.yml sets nb_render_markdown_format)
# and text/plain (what nbval and a terminal see).


def _fence(lines: list[str]) -> str:
    """A backtick fence longer than any run of backticks in the code."""
    longest = max((len(m) for ln in lines for m in re.findall(r"`+", ln)), default=0)
    return "`" * max(3, longest + 1)


def _code_block(lines: list[str], first: int, emphasize=(), caption: str | None = None,
                language: str = "cuda") -> str:
    """A MyST code-block with the file's line numbers; emphasize holds file line numbers."""
    fence = _fence(lines)
    opts = [f":lineno-start: {first}"]
    rel = sorted(n - first + 1 for n in emphasize if first <= n < first + len(lines))
    if rel:
        opts.append(":emphasize-lines: " + ",".join(map(str, rel)))
    if caption:
        opts.append(f":caption: {caption}")
    return "\n".join([f"{fence}{{code-block}} {language}", *opts, "", *lines, fence])


def _dropdown(title: str, body: str) -> str:
    colons = ":" * 4
    return f"{colons}{{dropdown}} {title}\n{body}\n{colons}"


def _language(file: str) -> str:
    return {".py": "python", ".cpp": "cpp", ".h": "cpp", ".cuh": "cuda"}.get(Path(file).suffix, "cuda")


def _show(markdown: str, plain: str) -> None:
    from IPython.display import display
    display({"text/markdown": markdown, "text/plain": plain}, raw=True)


def listing(path_spec, *, emphasize=(), fold: bool = True, caption: str | None = None) -> dict:
    """show_listing's output as a mime bundle {"text/markdown": ..., "text/plain": ...}."""
    src = Source(path_spec)
    caption = (caption or (src.file if src.whole else "{where}")).replace("{where}", src.describe())
    block = _code_block(src.lines, src.first, src.emphasized(emphasize), None if fold else caption,
                        _language(src.file))
    markdown = _dropdown(caption, block) if fold else block
    width = len(str(src.last))
    plain = "\n".join([f"// {caption}"] + [f"{src.first + i:>{width}}  {ln}" for i, ln in enumerate(src.lines)])
    return {"text/markdown": markdown, "text/plain": plain}


def show_listing(path_spec, *, emphasize=(), fold: bool = True, caption: str | None = None) -> None:
    """Show a workbook file, or part of it by name, highlighted with its own line numbers.

    path_spec: "kernels/03_tiled/conv2d_tiled_cached_halo.cu" (the whole file) or "...cu::NAME":
    the region marked NAME in the file (`// listing: NAME` ... `// end listing: NAME` at the ends of
    its first and last lines), else its __global__/__device__ function NAME, brace-matched ("...py::NAME":
    a def or class, Class.method). Never line numbers: convlab.display.listings. emphasize: what to highlight,
    "::NAME" (a marked region or function) or texts (every line shown that contains one).
    fold=True puts it in a closed dropdown titled with the file name (the whole file one click away);
    fold=False shows it open with the caption above; "{where}" in a caption reads "file, lines a–b".
    The copy button copies the code without the line numbers."""
    b = listing(path_spec, emphasize=emphasize, fold=fold, caption=caption)
    _show(b["text/markdown"], b["text/plain"])


def diff(old, new, *, context: int = 2, caption: str | None = None) -> dict:
    """show_diff's output as a mime bundle {"text/markdown": ..., "text/plain": ...}, plus "hunks":
    a list of (first, last, changed) per hunk, in line numbers of the new file."""
    a, b = Source(old), Source(new)
    matcher = difflib.SequenceMatcher(None, a.lines, b.lines, autojunk=False)
    parts, hunks = [], []
    # get_grouped_opcodes merges changes less than 2*context lines apart into one hunk
    for group in matcher.get_grouped_opcodes(context):
        j1, j2 = group[0][3], group[-1][4]
        i1, i2 = group[0][1], group[-1][2]
        changed = [b.first + j for tag, _, _, k1, k2 in group if tag in ("replace", "insert") for j in range(k1, k2)]
        removed = [a.first + i for tag, r1, r2, _, _ in group if tag in ("replace", "delete") for i in range(r1, r2)]
        first, last = b.first + j1, b.first + j2 - 1
        hunks.append((first, last, changed))
        where = f"lines {first}–{last}" if last > first else f"line {first}"
        cap = caption or f"{b.file}, {where} (highlighted: changed from {a.file})"
        if j2 > j1:
            parts.append(_code_block(b.lines[j1:j2], first, changed, cap, _language(b.file)))
        if removed:   # the old side of the hunk, its removed lines emphasized
            old_first, old_last = a.first + i1, a.first + i2 - 1
            old_where = f"lines {old_first}–{old_last}" if old_last > old_first else f"line {old_first}"
            parts.append(_dropdown(f"What these lines replace in {a.file} ({old_where})",
                                   _code_block(a.lines[i1:i2], old_first, removed, None, _language(a.file))))
    plain = "\n".join(difflib.unified_diff(a.lines, b.lines, a.file, b.file, n=context, lineterm=""))
    if not hunks:
        parts.append(f"*{b.file} and {a.file}: the same lines.*")
        plain = f"{a.file} and {b.file}: no difference"
    else:   # unified_diff counts from 1 in the lines given: shift to the files' own line numbers
        plain = re.sub(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@",
                       lambda m: f"@@ -{int(m.group(1)) + a.first - 1}{m.group(2) or ''} "
                                 f"+{int(m.group(3)) + b.first - 1}{m.group(4) or ''} @@",
                       plain, flags=re.MULTILINE)
    return {"text/markdown": "\n\n".join(parts), "text/plain": plain, "hunks": hunks}


def show_diff(old, new, *, context: int = 2, caption: str | None = None) -> None:
    """Show what changed from kernel `old` to kernel `new`: each hunk of the new file highlighted with
    its own line numbers, the changed lines emphasised, and the lines they replace from the old file
    in a folded dropdown. Specs as in show_listing (a file, or "file::NAME": a marked region or function).
    Changes less than 2*context lines apart share a hunk. The plain text is a unified diff."""
    b = diff(old, new, context=context, caption=caption)
    _show(b["text/markdown"], b["text/plain"])


class _Html:
    """An output that is HTML on the page and text in a terminal."""

    def __init__(self, html_text: str, text: str):
        self.html, self.text = html_text, text

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.text


def cards(cards: dict, rows=None, *, caption: str | None = None) -> _Html:
    """Several profile cards side by side as one compact table: one column per kernel of each named
    card (the name spanning its kernels), only `rows` (labels or ncu metric names; default: every
    row some card has a value for), the ncu metric name as each label's tooltip. Below it, the full
    cards, each under its name, folded in a <details> element.

        book.cards({"input-sized blocks": card_ib, "cached halo": card_ch},
                   ["duration (us)", "DRAM throughput (% of peak)", "L1 hit rate (%)"])
    """
    if not cards:
        raise ValueError("book.cards: no cards given")
    metric_of = {}
    for card in cards.values():
        metric_of.update(dict(card.rows))
    if rows is None:
        have = {lab for card in cards.values() for lab in card.table().index.get_level_values(0)}
        rows = [lab for lab in metric_of if lab in have]
    frames = {name: card.select(rows) for name, card in cards.items()}
    labels = [key[0] for key in next(iter(frames.values())).index]
    top = "".join(f'<th colspan="{max(len(df.columns), 1)}">{html.escape(name)}</th>' for name, df in frames.items())
    sub = "".join(column_head(c) for df in frames.values() for c in df.columns)
    body = []
    for r, label in enumerate(labels):
        cells = "".join(f"<td>{html.escape(card_value(v))}</td>" for df in frames.values() for v in df.iloc[r])
        body.append(f'<tr><th title="{html.escape(metric_of.get(label, ""))}">{html.escape(label)}</th>{cells}</tr>')
    sources = "; ".join(f"{name}: {card.caption()}" for name, card in cards.items())
    cap = caption or ", ".join(cards)
    full = "".join(f"<h4>{html.escape(name)}</h4>{card._repr_html_()}" for name, card in cards.items())
    page = (f'<div class="table-wrap"><table class="convlab-card"><caption>{html.escape(cap)}</caption>'
            f'<thead><tr><th rowspan="2"></th>{top}</tr><tr>{sub}</tr></thead><tbody>{"".join(body)}</tbody>'
            f"</table><p><small>{html.escape(sources)}</small></p></div>"
            f"<details><summary>The full profile cards</summary>{full}</details>")
    text = [cap]
    for name, df in frames.items():
        text += [f"{name}:", df.droplevel(1).apply(lambda col: col.map(card_value)).to_string()]
    return _Html(page, "\n".join(text))


def glue_figure(name: str, fig, *, dpi: int = 110) -> None:
    """Store a matplotlib figure for a numbered, captioned figure in a markdown cell, without showing
    it in the code cell (the figure is closed). The markdown cell:

        ```{glue:figure} ch3_times
        :name: fig-ch3-times
        :alt: GPU time of the four tiled kernels on LeNet's first layer, ...

        What to see: ...
        ```

    and the prose refers to it with {numref}`fig-ch3-times`. Saved at `dpi` (110: a figure 7.5 in
    wide shows about 1:1 in the page's content column; see plots.page_style)."""
    import base64
    import io

    import matplotlib.pyplot as plt
    from IPython.display import display

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    display({GLUE_PREFIX + "image/png": base64.b64encode(buf.getvalue()).decode("ascii"),
             GLUE_PREFIX + "text/plain": f"<figure {name}>"}, raw=True,
            metadata={"scrapbook": {"name": name, "mime_prefix": GLUE_PREFIX}})
