"""Numbers and tables as a reader wants them on the page: significant figures, and DataFrames as
HTML tables without an index column (convlab.display.book shows them; results.report and the profile
cards use them)."""
from __future__ import annotations

import html
import math
import numbers


def sig(value, digits: int = 3) -> str:
    """A number as a reader wants it in a table: floats to `digits` significant figures (thousands
    separated, no exponent), integers exact, None and NaN as a dash, text as it is."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, str) or isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if not isinstance(value, numbers.Real):
        return str(value)
    v = float(value)
    if not math.isfinite(v):
        return str(v)
    if v == 0:
        return "0"
    decimals = digits - 1 - math.floor(math.log10(abs(v)))
    if abs(round(v, decimals)) >= 10 ** (digits - decimals):   # 99.96 rounds up to 100: one decimal fewer
        decimals -= 1
    v = round(v, decimals)
    return f"{v:,.{max(decimals, 0)}f}"


def _index_as_columns(df):
    """df with its index as ordinary columns, unless it is the plain 0..n-1 row number."""
    plain = type(df.index).__name__ == "RangeIndex" and df.index.name is None
    return df if plain else df.reset_index()


def table_html(df, *, sig_digits: int = 3, caption: str | None = None) -> str:
    """df as an HTML table with no pandas index column (a named index becomes ordinary columns),
    numbers to sig_digits significant figures and right-aligned, text left-aligned, the caption
    inside, in a <div class="table-wrap"> that the site's stylesheet lets scroll sideways when wide."""
    df = _index_as_columns(df)

    def cell(v):
        kind = ' class="text"' if isinstance(v, str) else ""
        return f"<td{kind}>{html.escape(sig(v, sig_digits))}</td>"

    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(cell(v) for v in row) + "</tr>" for row in df.itertuples(index=False))
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return (f'<div class="table-wrap"><table class="convlab-table">{cap}<thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


class Table:
    """A table for the page: shown as HTML (table_html) and as aligned text."""

    def __init__(self, df, *, sig_digits: int = 3, caption: str | None = None):
        self.df, self.sig_digits, self.caption = df, sig_digits, caption

    def _repr_html_(self) -> str:
        return table_html(self.df, sig_digits=self.sig_digits, caption=self.caption)

    def __repr__(self) -> str:
        df = _index_as_columns(self.df)
        shown = df.apply(lambda col: col.map(lambda v: sig(v, self.sig_digits))) if len(df.columns) else df
        return (f"{self.caption}\n" if self.caption else "") + shown.to_string(index=False)


def table(df, *, sig: int = 3, caption: str | None = None) -> Table:
    """A DataFrame for the page: no index column (a named index becomes ordinary columns), numbers
    to `sig` significant figures, the caption inside the same output. Put it last in a cell or
    pass it to display()."""
    return Table(df, sig_digits=sig, caption=caption)
