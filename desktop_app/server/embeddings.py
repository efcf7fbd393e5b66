"""`POST /v1/embeddings`: OpenAI's embeddings route, from the model kvdesk retrieves with.

RAG tools that speak OpenAI's API get the vectors kvdesk's own retrieval uses (the static
model of `passages.embed`: no download, no model context, milliseconds a text). `model` is
the embedder's name or "default"; `input` one text or up to 2,048; `encoding_format` float or
base64 (float32 little-endian, what the official client asks for by default); `dimensions`
keeps the first N of them, scaled back to unit length (the model is trained to be cut so).
Token arrays are refused: the embedder reads text with its own tokenizer, not the chat
model's. A text is read up to `MAX_INPUT_TOKENS` of the embedder's tokens, as OpenAI's models
read theirs: a longer one is refused, naming it (Ollama's route cuts it there instead, unless
asked not to); one longer than any text of that many tokens could be is refused by its length
alone, before it is tokenized. Errors are the API's usual OpenAI JSON (the handlers of `api`).

Routes only translate: `Engine.embed` does the work, on a worker thread (`bridge`).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Literal

import numpy as np
import pydantic
from fastapi import APIRouter, Request
from pydantic import Field

from ..passages.embed import normalise
from ..validation import RequestValues
from . import bridge
from .schemas import EmbeddingInput

MAX_INPUTS = 2048  # as OpenAI
MAX_INPUT_TOKENS = 8192  # a text's, as OpenAI's embedding models read


class EmbeddingsRequest(RequestValues):
    model_config = pydantic.ConfigDict(extra="ignore")  # user... as OpenAI-compatible servers
    model: str
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)


def router(engine: Callable, stopping: bridge.Stopping, refuse: Callable) -> APIRouter:
    """The route, over `engine()` (the app's, loaded on first use); `refuse(status, message,
    code, param)` raises the API's error."""
    routes = APIRouter()

    @routes.post("/v1/embeddings")
    async def embeddings(body: EmbeddingsRequest, request: Request):
        embedder = engine().embedder
        if body.model not in (embedder.name, "default"):
            refuse(404, f"model {body.model!r} does not make embeddings here: "
                   f"{embedder.name!r} or 'default'", "model_not_found", "model")
        vectors, tokens = await embedded(request, stopping, engine, body.input, body.dimensions,
                                         refuse)
        return {"object": "list", "model": embedder.name,
                "data": [{"object": "embedding", "index": i, "embedding": _encoded(v, body)}
                         for i, v in enumerate(vectors)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    return routes


async def embedded(request: Request, stopping: bridge.Stopping, engine: Callable, given,
                   dimensions: int | None, refuse: Callable, *, truncate: bool = False,
                   field: str = "input") -> tuple[np.ndarray, int]:
    """(vectors, tokens read) of one text or a list of them (the request's `field`), checked
    as every embeddings route checks them (OpenAI's and Ollama's): `refuse(status, message,
    code, param)`; with `truncate`, a text over MAX_INPUT_TOKENS is read to there."""
    embedder = engine().embedder
    texts = [given] if isinstance(given, str) else given
    if not texts or len(texts) > MAX_INPUTS:
        refuse(400, f"input: 1 to {MAX_INPUTS} texts, not {len(texts)}", None, "input")
    if not all(isinstance(t, str) for t in texts):
        refuse(400, "input: token arrays are not supported (the embedding model reads text "
               "with its own tokenizer): send the text (LangChain's OpenAIEmbeddings: "
               "check_embedding_ctx_length=False)", None, "input")
    if not all(t.strip() for t in texts):
        refuse(400, "input: an empty text has no embedding", None, "input")
    if dimensions is not None and dimensions > embedder.dimension:
        refuse(400, f"dimensions: at most {embedder.dimension} for {embedder.name}",
               None, "dimensions")
    def named(i: int) -> str:
        return field if isinstance(given, str) else f"{field}.{i}"

    def too_long(i: int, size: str) -> None:
        refuse(400, f"{named(i)}: {size}, more than the {MAX_INPUT_TOKENS:,} tokens of a text "
               f"{embedder.name} reads: shorten or split it", None, named(i))

    bound = MAX_INPUT_TOKENS * embedder.longest_token  # (longer: surely over, untokenized)
    texts = [t[:bound] if truncate else t for t in texts]
    for i, text in enumerate(texts):
        if len(text) > bound:
            too_long(i, f"{len(text):,} characters")

    def read(_) -> tuple[np.ndarray, int]:
        tokens = embedder.tokens(texts)
        for i, ids in enumerate(tokens):
            if len(ids) > MAX_INPUT_TOKENS and not truncate:
                too_long(i, f"{len(ids):,} tokens")
        tokens = [ids[:MAX_INPUT_TOKENS] for ids in tokens]
        return embedder.embed_tokens(tokens), sum(map(len, tokens))

    vectors, tokens = await bridge.call(request, stopping, read)
    if dimensions is not None:
        vectors = normalise(vectors[:, :dimensions])
    return vectors, tokens


def _encoded(vector: np.ndarray, body: EmbeddingsRequest) -> list[float] | str:
    if body.encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()
