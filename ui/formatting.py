"""Numbers and engine reports as the short phrases the window shows people.

Pure functions over `desktop_app.results` records: no Qt, no engine calls.
"""

from __future__ import annotations

from desktop_app.results import AskResult, AttachResult, RestoreReport, levels_summary


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def restore_line(report: RestoreReport) -> str:
    """E.g. "restored 4,096 tokens in 120 ms — 16 chunks: 14 high, 2 balanced"."""
    line = f"restored {report.tokens:,} tokens in {report.restore_s * 1000:,.0f} ms"
    if report.chunk_levels:
        line += f" — {levels_summary(report.chunk_levels)}"
    elif report.recomputed_tokens:
        line += f" — {report.recomputed_tokens:,} tokens recomputed"
    blended = report.blended or {}
    if blended.get("mode") == "exact":
        line += " · exact context"
    elif blended.get("mode") == "blended":
        line += " · blended from the documents' caches (approximate; made exact in the background)"
    return "; ".join([line, *report.messages])


def answer_stats(result: AskResult, generation_s: float) -> str:
    """E.g. "48 tokens · 31.2 tokens/s · first token after 0.12 s"."""
    rate = result.tokens_generated / generation_s if generation_s > 0 else 0.0
    return (f"{result.tokens_generated:,} tokens · {rate:.1f} tokens/s · "
            f"first token after {result.ttft_s:.2f} s")


def attach_notices(result: AttachResult) -> list[str]:
    """What the user should know about a document that was attached."""
    notices = list(result.warnings)
    if result.kept_tokens < result.tokens:
        notices.append(f"{result.title}: only the first {result.kept_tokens:,} of "
                       f"{result.tokens:,} tokens fit the context; the rest is left out")
    return notices
