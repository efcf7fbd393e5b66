"""Ollama's API on the local server, for the tools that speak only it: the `ollama` Python and
JS clients, Open WebUI's Ollama mode, editor and notes plugins.

    GET  /                                    "Ollama is running" (tools' health check)
    GET  /api/version, /api/tags, /api/ps     the server; the model it serves (and its context);
                                              tags: each document too, as a model answering
                                              from it (`served`)
    POST /api/show                            that model: details, parameters in effect,
                                              chat template, capabilities
    POST /api/chat                            a conversation answered, streamed as Ollama
                                              streams (JSON lines) unless "stream": false;
                                              longer than the context, its oldest messages
                                              left out, as Ollama leaves them, a block at a
                                              time (its next turns keep the cut and find
                                              the rest cached), with room left for the
                                              answer (`fitted`); tools
                                              offered, calls answered (`desktop_app.tools`)
    POST /api/generate                        a prompt: through the chat template (with
                                              `system`), as it is (`raw`), or filled in
                                              between (`suffix`, where the model can)
    POST /api/embed, /api/embeddings          vectors from the model kvdesk retrieves with
                                              (`embeddings`: the same as /v1/embeddings)
    POST /api/pull                            the model served: "success", as Ollama says
                                              of a model it has; any other refused, and so
                                              are delete, copy, create and push: kvdesk
                                              downloads and manages no models

Answers go through the same engine call as OpenAI's chat completions, so a conversation has one
persistent prompt cache whichever API it comes through: the next turn, after a restart too,
starts from the stored conversation. Model names are those of `kvdesk models` (`served`). Errors
are Ollama's `{"error": "..."}` (`edges` reshapes the server's errors under /api/).

Routes only translate: the engine does the work, on worker threads (`bridge`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from .. import __version__
from ..app import App
from ..chat.completions import RawPrompt
from ..errors import ContextFullError
from ..results import Completion
from ..tools import RESULT, Offer, Watch, read
from . import bridge, embeddings, streams
from . import ollama_shapes as sh
from .failures import ApiError, cut_short, error_of, finished, refuse_cut
from .served import Served

# The Ollama release whose API this subset follows: clients that gate features on the
# server's version (Open WebUI, the JS client) read it.
OLLAMA_API_VERSION = "0.12.0"
# When Ollama would unload the model: kvdesk keeps it for as long as it serves.
NEVER = "9999-12-31T23:59:59Z"
# A conversation past the context loses its oldest turns in blocks of at least 1/SHIFT_SHARE
# of what the context holds beside its documents and system messages (in their text's
# tokens): after a cut the rest fills about half of it, and the turns after it find that in
# the prompt cache until it fills again. llama.cpp's and Ollama's context shift drop half too.
SHIFT_SHARE = 2


def install(api: FastAPI, app: App, stopping: bridge.Stopping) -> None:
    served = Served(app)

    async def check_model(name: str, *, documents: bool = False) -> None:
        """Refused unless `name` is the served model (or with `documents`, a document's)."""
        def known() -> bool:
            return served.picks(name, ollama=True) if documents else served.is_ollama_name(name)

        # On a thread: the first call may list the machine's models (headers, memoized).
        if not await asyncio.to_thread(known):
            raise ApiError(404, served.refusal(name, ollama=True), code="model_not_found",
                           param="model")

    def listed() -> dict:
        path = Path(app.model_path)
        st = path.stat()
        return {"name": served.ollama_name, "model": served.ollama_name,
                "modified_at": sh.timestamp(st.st_mtime), "size": st.st_size,
                "digest": sh.digest(app.model_hash), "details": details()}

    def details() -> dict:
        facts = app.model_facts
        arch = facts.architecture if facts else None
        return {"parent_model": "", "format": "gguf", "family": arch or "",
                "families": [arch] if arch else None,
                "parameter_size": _parameters(facts.parameters if facts else None),
                "quantization_level": (facts.quantization if facts else None) or ""}

    @api.api_route("/", methods=["GET", "HEAD"], response_class=PlainTextResponse)
    async def running():
        """Ollama's health check: tools test for this answer before they call the API."""
        return "Ollama is running"

    @api.api_route("/api/version", methods=["GET", "HEAD"])  # HEAD: health checks
    async def version():
        return {"version": OLLAMA_API_VERSION, "kvdesk": __version__}

    @api.api_route("/api/tags", methods=["GET", "HEAD"])  # HEAD: health checks
    async def tags():
        model = await asyncio.to_thread(listed)
        documents = await asyncio.to_thread(served.document_models)
        # (a digest of its own: clients that group models by digest keep them apart)
        return {"models": [model, *({**model, "name": f"{name}:latest", "model": f"{name}:latest",
                                     "digest": sh.digest(f"{app.model_hash}:{doc}")}
                                    for name, doc in documents)]}

    @api.api_route("/api/ps", methods=["GET", "HEAD"])  # HEAD: health checks
    async def ps():
        running = await asyncio.to_thread(listed)
        return {"models": [{**running, "expires_at": NEVER, "size_vram": 0,
                            "context_length": app.engine.runtime.n_ctx}]}

    @api.post("/api/show")
    async def show(body: sh.ShowRequest):
        await check_model(body.asked, documents=True)
        return await asyncio.to_thread(shown)

    def shown() -> dict:
        facts, engine = app.model_facts, app.engine
        values = engine.sampling().options
        ollama_names = {kvdesk: ollama for ollama, kvdesk in sh.SAMPLING.items()}
        parameters = "\n".join(f"{ollama_names[name]} {value}" for name, value in
                               values.model_dump().items() if value is not None)
        info = {"general.architecture": facts.architecture, "general.name": facts.name,
                "general.parameter_count": facts.parameters,
                f"{facts.architecture}.context_length": facts.context_length} if facts else {}
        return {"modelfile": f"# kvdesk serves this file as it is\nFROM {app.model_path}\n"
                             + "".join(f"PARAMETER {line}\n" for line in parameters.splitlines()),
                "parameters": parameters, "details": details(), "model_info": info,
                # the Jinja template kvdesk renders chats with: the file's own, if it has one
                "template": engine.runtime.chat_template.template,
                "capabilities": ["completion", "tools",
                                 *(["insert"] if engine.runtime.fim_tokens else [])],
                "modified_at": sh.timestamp(Path(app.model_path).stat().st_mtime)}

    @api.post("/api/chat")
    async def chat(body: sh.ChatRequest, request: Request):
        await check_model(body.model, documents=True)
        offered = body.offer()
        messages = body.conversation(offered)
        offer = offered.held(messages) if offered is not None else None  # (as on OpenAI's)
        options = served.answering(body.model, body.engine_options(offered, offer))
        if not messages:
            return sh.loaded(body.model, True, body.unloading())
        # (a tool's result is written as a user message: the question is the client's own)
        asked = [i for i, m in enumerate(body.messages) if m.role == "user"]
        question = asked[-1] + len(messages) - len(body.messages) if asked else None
        return await answer(request, body, lambda **kw: fitted(
            lambda msgs, room: app.engine.complete(msgs, leave_room=room, **options, **kw),
            messages, question), sh.chat_piece, offer)

    @api.post("/api/generate")
    async def generate(body: sh.GenerateRequest, request: Request):
        await check_model(body.model, documents=True)
        body.check_supported()
        options = served.answering(body.model, body.engine_options())
        if not body.prompt and not body.suffix:
            return sh.loaded(body.model, False, body.unloading())
        if body.raw or body.suffix:
            prompt = RawPrompt(body.prompt, body.suffix or None)
        else:
            prompt = [*([{"role": "system", "content": body.system}] if body.system else []),
                      {"role": "user", "content": body.prompt}]
        return await answer(request, body, lambda **kw: app.engine.complete(
            prompt, **options, **kw), sh.generate_piece)

    async def answer(request: Request, body, call: Callable[..., Completion],
                     piece: Callable[..., dict], offer: Offer | None = None):
        """The answer as one object, or streamed as JSON lines ending with the counts; with
        tools offered, an answer of calls as Ollama gives them (`tools.read`), the text of
        a call never streamed as text (`tools.Watch`)."""
        started, model = time.perf_counter(), body.model
        taken = [started]  # when the engine took it, after the requests queued before it

        def take() -> None:
            taken[0] = time.perf_counter()

        if not body.stream:
            done = await bridge.call(request, stopping, lambda cancel: call(cancel=cancel,
                                                                            on_start=take))
            refuse_cut(done)
            said = read(offer, done.text) if offer else None
            first = sh.calls_piece(model, said, done=True) if said and said.calls else \
                piece(model, done.text, done=True)
            return {**first, **sh.final(done, started, taken[0])}

        def last(d: Completion) -> list[dict]:
            # Ollama has no done_reason for an answer cut short: an error line, so that a
            # client does not keep it as a finished answer.
            if not finished(d):
                return [sh.error(cut_short())]
            said = read(offer, d.text) if offer else None
            rest = watches[0].finish(d.text, said)
            return [*([piece(model, rest)] if rest else []),
                    *([sh.calls_piece(model, said)] if said and said.calls else []),
                    {**piece(model, "", done=True), **sh.final(d, started, taken[0])}]

        def begin(emit) -> None:
            take()
            emit(bridge.READY)

        watches: list[Watch] = []  # the answer's, passing its text on (`emit`) as it can

        def work(emit, cancel):
            watches.append(Watch(offer, emit))
            return call(cancel=cancel, on_token=watches[0].feed, on_start=lambda: begin(emit))

        return streams.ndjson(await streams.objects(
            request, stopping, work,
            piece=lambda text: piece(model, text), done=last,
            error=lambda e: sh.error(error_of(e)[1]["error"]["message"])))

    def refuse(status: int, message: str, code: str | None, param: str | None):
        raise ApiError(status, message, code=code, param=param)

    async def vectors(request: Request, body: sh.EmbedRequest, given, field: str):
        await check_embedding_model(body.model)
        return await embeddings.embedded(request, stopping, lambda: app.engine, given,
                                         body.dimensions, refuse, truncate=body.truncate,
                                         field=field)

    async def check_embedding_model(name: str) -> None:
        embedder = await asyncio.to_thread(lambda: app.engine.embedder)
        if name not in (embedder.name, "default") and not await asyncio.to_thread(
                served.is_ollama_name, name):
            raise ApiError(404, f"model {name!r} does not make embeddings here: "
                           f"{embedder.name!r}, or the model served", code="model_not_found",
                           param="model")

    @api.post("/api/embed")
    async def embed(body: sh.EmbedRequest, request: Request):
        started = time.perf_counter()
        if body.input in ("", []):  # Ollama's request to load the model: no vectors
            await check_embedding_model(body.model)
            return {"model": body.model, "embeddings": []}
        found, tokens = await vectors(request, body, body.input, "input")
        return {"model": body.model, "embeddings": found.tolist(),
                "total_duration": sh.nanoseconds(time.perf_counter() - started),
                "load_duration": 0, "prompt_eval_count": tokens}

    @api.post("/api/embeddings")
    async def embeddings_legacy(body: sh.EmbedRequest, request: Request):
        """The older route: one `prompt`, one `embedding`; none (or "") is Ollama's request
        to load the model, answered with no vector, as Ollama answers it."""
        if not body.prompt:
            await check_embedding_model(body.model)
            return {"embedding": []}
        found, _ = await vectors(request, body, body.prompt, "prompt")
        return {"embedding": found[0].tolist()}


    @api.post("/api/pull")
    async def pull(body: sh.PullRequest):
        if not await asyncio.to_thread(served.is_ollama_name, body.asked):
            raise ApiError(404, served.not_managed(f"cannot pull {body.asked!r}"),
                           code="model_not_found", param="model")
        if not body.stream:
            return {"status": "success"}

        async def pulled():  # (Ollama's stream ends so, once the model is whole)
            yield {"status": "success"}

        return streams.ndjson(pulled())

    async def unmanaged(request: Request):
        raise ApiError(400, served.not_managed(f"{request.method} {request.url.path}"),
                       code="unsupported")

    for path, method in (("/api/delete", "DELETE"), ("/api/copy", "POST"),
                         ("/api/create", "POST"), ("/api/push", "POST")):
        api.add_api_route(path, unmanaged, methods=[method])


def fitted(complete: Callable[[list[dict], bool], Completion], messages: list[dict],
           question: int | None = -1) -> Completion:
    """A conversation longer than the context answered as Ollama answers it: its oldest
    messages left out until it fits (never a system message, nor the last one, nor the
    question, `question`'s index, and what follows it: an agent's call and its results;
    an answer with the question it answered), and said in the answer's notes, where
    OpenAI's routes refuse it. `question` -1: the last user message (a tool's result,
    written as one, is not the question: the caller says which is). It must fit
    with room for the answer (`complete`'s second argument: the engine's `leave_room`):
    Ollama fills its context with the history and shifts it as the answer grows, kvdesk's
    does not shift, so a history filling it would leave an answer of a few tokens, cut
    ("length"). What is left when nothing more may go is answered with the room there is,
    as before any went. Each refusal says by how many tokens and what each message holds,
    so enough turns go at once: a long history is measured a few times, not once a turn
    left out.

    They go as Ollama's context shift drops tokens, in spirit: a block at a time, at a cut
    that stays where it is as the conversation grows (`_cuts`), so that the next turns
    start with the same kept window and find it in the prompt cache until it overflows in
    turn. Leaving out just enough would start each turn's window one message later: no
    stored prefix past the system prompt, the whole context computed, and stored, a turn.
    The cut is the request's alone (no client's state): after a restart, or from another
    client, the same messages are cut at the same one."""
    if question == -1:
        question = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    kept = {len(messages) - 1, *(range(question, len(messages)) if question is not None
                                 else ())}
    t0, left_out, room = time.perf_counter(), 0, True
    at = list(range(len(messages)))  # each message's place in the request
    cuts: list[int] | None = None  # where a block may end, in the request's places
    while True:
        tried = time.perf_counter()
        try:
            done = complete(messages, room)
        except ContextFullError as e:
            measured = len(e.sizes) == len(messages)  # (else one turn a try)
            sizes = list(e.sizes) if measured else [0.0] * len(messages)
            if cuts is None:  # (the first refusal's: the whole request's)
                cuts = _cuts(messages, e.own, e.space, min(kept)) \
                    if measured and len(e.own) == len(messages) else []
            turn = _block(messages, at, kept, cuts, sizes, e.over) if measured else []
            freed, dropped = sum(sizes[i] for i in turn), len(turn)
            messages, sizes, at, kept = _without(turn, messages, sizes, at, kept)
            while not dropped or measured and freed < e.over:
                turn = _oldest_turn(messages, kept)
                if not turn:
                    if not dropped and not room:
                        raise  # nothing left to leave out
                    if not dropped:
                        room = False  # (tried with the room there is, as before any went)
                    break  # (tried again: the shares are estimates)
                freed += sum(sizes[i] for i in turn)
                messages, sizes, at, kept = _without(turn, messages, sizes, at, kept)
                dropped += len(turn)
            left_out += dropped
            continue
        if not left_out:
            return done
        # (the first token came after the tries that did not fit too)
        answer = ", with room for the answer," if room else ""
        return replace(done, ttft_s=round(done.ttft_s + tried - t0, 4), messages=[
            f"the conversation{answer} is longer than the context: its {left_out} oldest "
            "message(s) were left out, as Ollama leaves them out: a block at a time, so that "
            "the next turns start where this one does and find it in the prompt cache",
            *done.messages])


def _cuts(messages: list[dict], own: Sequence[int], space: int, end: int) -> list[int]:
    """Where a block of left-out messages may end: at a turn's first message (a user's, not
    a tool's result) before `end`, once a block's tokens of text have gone by since the
    start or the cut before: 1/SHIFT_SHARE of the `space` the system messages (kept, as
    Ollama's `num_keep` keeps their tokens) leave. Each depends on the messages before it
    only, so a conversation that grows keeps them."""
    system = sum(n for n, m in zip(own, messages, strict=True) if m["role"] == "system")
    block = (space - system) // SHIFT_SHARE
    cuts, since = [], 0
    for i, m in enumerate(messages[:end] if block > 0 else ()):
        if m["role"] == "user" and not m.get(RESULT) and since >= block:
            cuts.append(i)
            since = 0
        if m["role"] != "system":
            since += own[i]
    return cuts


def _block(messages: list[dict], at: list[int], kept: set[int], cuts: list[int],
           sizes: list[float], over: int) -> list[int]:
    """The messages before the first cut whose leaving out frees `over` tokens (by `sizes`),
    else before the last cut (what is left goes a turn at a time): positions in `messages`,
    whose places in the request are `at`."""
    turn: list[int] = []
    for cut in cuts:
        turn = [i for i, m in enumerate(messages) if at[i] < cut and i not in kept
                and m["role"] != "system"]
        if sum(sizes[i] for i in turn) >= over:
            break
    return turn


def _without(turn: list[int], messages: list[dict], sizes: list[float], at: list[int],
             kept: set[int]) -> tuple[list[dict], list[float], list[int], set[int]]:
    """The messages, their sizes and places, less those at `turn`; `kept` renumbered."""
    gone = set(turn)
    return ([m for i, m in enumerate(messages) if i not in gone],
            [n for i, n in enumerate(sizes) if i not in gone],
            [j for i, j in enumerate(at) if i not in gone],
            {i - sum(j < i for j in gone) for i in kept})


def _oldest_turn(messages: list[dict], kept: set[int]) -> list[int]:
    """The oldest message that may be left out, with what answered it."""
    turn = [i for i, m in enumerate(messages) if m["role"] != "system" and i not in kept][:1]
    while turn and turn[-1] + 1 < len(messages) and turn[-1] + 1 not in kept and messages[
            turn[-1] + 1]["role"] not in ("system", "user"):
        turn.append(turn[-1] + 1)
    return turn


def _parameters(n: int | None) -> str:
    """Ollama's way of saying a model's size: "135M", "3.2B"."""
    if not n:
        return ""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
