"""What the benchmark scripts share: where their CSV goes, how it is written, and the closing
report of rows that did not pass their check against the fp64 reference."""
from __future__ import annotations

import csv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def save_rows(rows: list[dict], meta: dict, name: str, csv_path: str | None, on_gpu: bool) -> Path:
    """GPU results go to benchmarks/results/ (to be committed), emulator self-checks to the ignored
    cache. Every row gets the run's metadata (GPU, versions, date) as extra columns."""
    folder = ROOT / "benchmarks" / "results" if on_gpu else ROOT / ".convlab-cache"
    out = Path(csv_path) if csv_path else folder / f"{name}_{meta['backend']}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    fields = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    with open(out, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=fields + [k for k in meta if k not in fields])
        wr.writeheader()
        for r in rows:
            wr.writerow({**r, **meta})
    print(f"# wrote {out}")
    return out


def report_failures(rows: list[dict], fmt) -> int:
    """Print the rows whose check is not 'ok...'; exit status 1 when any FAILed."""
    bad = [r for r in rows if not str(r.get("check", "ok")).startswith("ok")]
    if bad:
        print(f"# {len(bad)} rows did not pass their check:")
        for r in bad:
            print("#   " + fmt(r))
    return 1 if any(str(r.get("check")).startswith("FAIL") for r in bad) else 0
