"""Rate-distortion plots from `benchmarks.bench_quality` runs: bits per element against KLD and
against top-1 agreement, one PNG per model, every text of that model in it.

    .venv/bin/python -m benchmarks.bench_quality --model default --text pydoc \
        --calibration cal-default.kvcl > runs/default-pydoc.txt          # and --text code, ...
    .venv/bin/python -m benchmarks.rd_plot runs/default-pydoc.txt runs/default-code.txt \
        --out benchmarks/rd_smollm2.png --title "SmolLM2-135M (Q4_1)"

Each run's rows are its JSON lines ({"config", "bits_per_element", "kld", "top1", ...}). Points:
the calibrated levels (high, balanced, compact), the model-independent ones (default-*),
llama.cpp's q8_0 and q4_0, CacheGen's bins (cachegen-1..3); the fp16-ulp row (the noise floor)
is a dashed line. --labels names the runs (e.g. two calibrations of one text). Needs
matplotlib (the dev extra).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GROUPS = {  # label, configs, marker
    "calibrated levels": (("compact", "balanced", "high"), "o"),
    "default levels": (("default-compact", "default-balanced", "default-high"), "s"),
    "CacheGen bins": (("cachegen-1", "cachegen-2", "cachegen-3"), "^"),
    "llama.cpp q4_0 / q8_0": (("q4_0", "q8_0"), "D"),
}


def rows_of(path: Path) -> tuple[str, dict[str, dict]]:
    """(text name, {config: row}) of one bench_quality output."""
    rows, text = {}, path.stem
    for line in path.read_text().splitlines():
        if line.startswith('{"config"'):
            row = json.loads(line)
            rows[row["config"]] = row
        elif ", text " in line and ", N=" in line:  # the table's caption
            text = line.split(", text ")[1].split(",")[0]
    return text, rows


def main() -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--title", default="")
    ap.add_argument("--labels", default="", help="comma-separated names of the runs (default: "
                    "their texts), e.g. to set two calibrations' runs of one text apart")
    args = ap.parse_args()
    labels = args.labels.split(",") if args.labels else []
    fig, (ax_kld, ax_top) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, path in enumerate(args.runs):
        text, rows = rows_of(path)
        text = labels[i] if i < len(labels) else text
        color = colors[i % len(colors)]
        for label, (configs, marker) in GROUPS.items():
            got = [rows[c] for c in configs if c in rows]
            if not got:
                continue
            xs = [r["bits_per_element"] for r in got]
            style = "-" if label != "llama.cpp q4_0 / q8_0" else ""
            ax_kld.plot(xs, [r["kld"] for r in got], marker=marker, linestyle=style, color=color,
                        label=f"{text}: {label}")
            ax_top.plot(xs, [r["top1"] for r in got], marker=marker, linestyle=style, color=color)
            for r in got:
                ax_kld.annotate(r["config"], (r["bits_per_element"], r["kld"]), fontsize=6,
                                xytext=(3, 3), textcoords="offset points")
        if "fp16-ulp" in rows:
            floor = rows["fp16-ulp"]
            ax_kld.axhline(floor["kld"], color=color, linestyle="--", linewidth=0.8,
                           label=f"{text}: fp16-ulp floor")
            ax_top.axhline(floor["top1"], color=color, linestyle="--", linewidth=0.8)
    ax_kld.set(xscale="log", yscale="log", xlabel="bits per element (log)",
               ylabel="KLD vs exact KV (log)")
    ax_top.set(xscale="log", xlabel="bits per element (log)", ylabel="top-1 agreement")
    for ax in (ax_kld, ax_top):
        ax.grid(True, which="both", alpha=0.3)
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks([0.5, 1, 2, 4, 8, 16])
    ax_kld.legend(fontsize=6)
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
