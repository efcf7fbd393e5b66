"""A headless end-to-end check of an installation: the thing an installer or a user runs first.

`run(settings)` attaches a short sample text (written here, so it ships wherever this module
does), asks one question about it, then reopens the chat through the most compressed level
and reports how long the first token and the restore took. It exercises what a bundle can
get wrong: the model file being found, llama.cpp's shared libraries loading, the codec's
numba kernels compiling (and caching somewhere writable), the store writing and reading.
A cold start shows: `compiled_at_start` says whether any codec kernel had to be compiled
during the check (none should: the bundle ships them compiled, `make venv` compiles them in
a checkout), `compile_s` how long that took, `codec_cache` which cache served them and why.

It works in a temporary data directory, deleted afterwards, so it never touches the user's
documents, chats or caches; it never raises: every failure becomes `{"ok": false, "error"}`.
"""

from __future__ import annotations

import sys
import tempfile
import time
import traceback
from pathlib import Path

from codec.jit import jitcache

from .app import App
from .options import GenerationOptions, RestoreOptions
from .settings import Settings

# Small and fast on any model: the check is about the installation, not the user's setting.
N_CTX = 1024
# Greedy: every run of the check does the same work (a sampled first token could even end
# the answer at once).
GENERATION = GenerationOptions(max_tokens=8, temperature=0)
LEVEL = "compact"  # the most compressed level: the restore has to decode real codec output
QUESTION = "What colour is the door of the lighthouse?"

# Written for kvdesk (no third-party rights): a few hundred tokens, so the KV cache spans
# more than one 256-token chunk.
SAMPLE_TEXT = """\
# The Lighthouse at Carrow Point

The lighthouse at Carrow Point stands on a shelf of dark rock at the end of a long causeway.
It was built in 1871 from granite quarried three miles inland and carried out on carts at low
tide. The tower is white, but its door is painted green, a colour the first keeper chose
because, he wrote, it was the only paint the supply boat had brought that year.

The light itself turns once every twelve seconds. In fog a horn sounds two short notes and one
long note each minute, and the fishermen of the bay say they can tell the Carrow horn from any
other by the way the long note falls at the end.

Three keepers lived at the station until 1964, when the light was automated. The keepers'
cottage is now a small museum. It keeps the logbooks, a brass telescope, a barometer that
still works, and a shelf of letters the keepers' children wrote to a school on the mainland,
which they could only reach when the causeway was dry.

Visitors may cross the causeway for two hours either side of low tide. The tide tables are
posted at the car park, and a bell on the museum wall is rung half an hour before the water
returns. Every year somebody ignores it, and every year the lifeboat crew from Dunmore comes
out to fetch them, which the crew say is good practice.

The museum is open from April to October. Entry is free; the donations box by the door pays
for the green paint, which has to be renewed every spring because of the salt.
"""


def run(settings: Settings, *, model_flag: bool = False) -> dict:
    """Attach, ask, reopen compressed; `{"ok": True, "ttft_s", "restore_s", ...}` or an error.
    `model_flag`: the model was named by --model (a model not found says so)."""
    t0 = time.perf_counter()
    compiled_before, compile_s_before = jitcache.compiles()
    report: dict = {"ok": False, "frozen": bool(getattr(sys, "frozen", False))}
    with tempfile.TemporaryDirectory(prefix="kvdesk-selfcheck-") as tmp:
        app = None
        try:
            app = App(settings.with_overrides(data_dir=str(Path(tmp) / "data"), n_ctx=N_CTX),
                      model_flag=model_flag)
            report["model"] = str(app.model_path)
            sample = Path(tmp) / "lighthouse.md"
            sample.write_text(SAMPLE_TEXT, encoding="utf-8")
            doc = app.engine.attach(sample, levels=[LEVEL])
            answer = app.engine.ask(QUESTION, doc_ids=[doc.doc_id],
                                    generation=GENERATION)
            if not answer.tokens_generated:
                raise RuntimeError("the model generated no token")
            # The check is of the codec's path: while its kernels still compile (a bundle on a
            # CPU its shipped cache does not fit), a question would rightly be recomputed.
            app.engine.contexts.wait_codec()
            restored = app.engine.reopen(answer.chat_id, restore=RestoreOptions(level=LEVEL))
            if restored.recomputed_tokens or set(restored.chunk_levels) != {LEVEL}:
                raise RuntimeError(f"the chat did not come back through the {LEVEL} level: "
                                   f"chunks {restored.chunk_levels}, "
                                   f"{restored.recomputed_tokens} tokens recomputed")
            report.update(ok=True, ttft_s=answer.ttft_s, restore_s=round(restored.restore_s, 4),
                          tokens=restored.tokens, chunks=len(restored.chunk_levels),
                          level=LEVEL, answer=answer.answer)
        except Exception as e:  # noqa: BLE001 - a self-check reports every failure, never raises
            report.update(error=f"{type(e).__name__}: {e}",
                          traceback=traceback.format_exc(limit=-3))
        finally:
            if app is not None:
                try:
                    app.close()
                except Exception as e:  # noqa: BLE001 - a failing close fails the check too
                    if report["ok"]:
                        report.update(ok=False, error=f"closing: {type(e).__name__}: {e}",
                                      traceback=traceback.format_exc(limit=-3))
    compiled, compile_s = jitcache.compiles()
    report.update(compiled_at_start=compiled > compiled_before,
                  compile_s=round(compile_s - compile_s_before, 2),
                  codec_cache=jitcache.status()["reason"])
    report["seconds"] = round(time.perf_counter() - t0, 2)
    return report
