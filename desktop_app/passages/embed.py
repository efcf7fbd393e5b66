"""Texts as dense vectors, with an embedding model that ships inside its wheel.

The default is WordLlama's `l2_supercat` model at 256 dimensions: static token embeddings
(distilled from large models' embedding layers), averaged over a text's tokens. Its weights
(16 MB) and tokenizer come in the `wordllama` wheel, so nothing is downloaded, ever: the
files are read from the package's own folder with downloads disabled (wordllama's default
lookup misses the tokenizer it ships and would fetch it from the Hugging Face hub). Why this
one: model2vec's wheel ships no weights (its models come from the Hugging Face hub, and with
HF_HUB_OFFLINE=1 it cannot load one), and the chat model's own input token embeddings,
averaged the same way, find a planted fact's passage among the first 8 for 12 % of questions
against wordllama's 35 % (benchmarks/RESULTS.md, "Retrieval in long documents").

Vectors are float32, L2-normalised (a text with no token is the zero vector), so a dot
product is the cosine. This module never touches the store or the model.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from ..errors import EngineError


class Embedder(Protocol):
    """What retrieval and the embeddings endpoint embed with."""

    @property
    def name(self) -> str: ...  # names the vectors it makes: stored beside them

    @property
    def dimension(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...  # float32 [n, dimension]

    def count_tokens(self, texts: Sequence[str]) -> int: ...  # its own tokens, in all

    # Each text's tokens, then the vectors of texts given so (cut, perhaps): `embed` and
    # `count_tokens` of the same texts with one tokenizing (the embeddings endpoint's).
    def tokens(self, texts: Sequence[str]) -> list[np.ndarray]: ...

    def embed_tokens(self, tokens: Sequence[np.ndarray]) -> np.ndarray: ...

    @property
    def longest_token(self) -> int: ...  # characters: a text has at least len/this tokens


def normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length; an all-zero row (a text with no token) stays zero."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


class WordLlamaEmbedder:
    """WordLlama's static embeddings, loaded from its wheel on first use (~0.5 s)."""

    CONFIG = "l2_supercat"
    DIMENSION = 256

    def __init__(self):
        self._model = None
        self._tokenizer = None  # (`_unpadded`)
        self._longest: int | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return f"wordllama-{self.CONFIG}-{self.DIMENSION}"

    @property
    def dimension(self) -> int:
        return self.DIMENSION

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.DIMENSION), dtype=np.float32)
        return normalise(self._loaded().embed(texts, norm=False))

    def count_tokens(self, texts: Sequence[str]) -> int:
        # The tokenizer pads a batch to its longest text: count the real tokens only.
        return sum(sum(e.attention_mask) for e in self._loaded().tokenizer.encode_batch(
            list(texts), add_special_tokens=False))

    def tokens(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int32) for e in
                self._unpadded().encode_batch(list(texts), add_special_tokens=False)]

    def embed_tokens(self, tokens: Sequence[np.ndarray]) -> np.ndarray:
        """What `embed` gives of the texts these are the tokens of (wordllama's pooling, one
        text at a time: no batch padded to its longest)."""
        model = self._loaded()
        table = model.embedding
        out = np.zeros((len(tokens), self.DIMENSION), dtype=np.float32)
        for i, ids in enumerate(tokens):
            ids = np.clip(np.asarray(ids, dtype=np.int32), 0, table.shape[0] - 1)
            out[i] = model.avg_pool(table[ids][None], np.ones((1, len(ids)), np.float32))[0]
        return normalise(out)

    @property
    def longest_token(self) -> int:
        if self._longest is None:
            self._longest = max(map(len, self._unpadded().get_vocab()))
        return self._longest

    def _unpadded(self):
        """The model's tokenizer, not padding a batch (a copy: the model's own pads)."""
        with self._lock:
            tokenizer = self._tokenizer
        if tokenizer is None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_str(self._loaded().tokenizer.to_str())
            tokenizer.no_padding()
            with self._lock:
                self._tokenizer = self._tokenizer or tokenizer
        return self._tokenizer

    def _loaded(self):
        with self._lock:
            if self._model is None:
                try:
                    import wordllama
                except ImportError as e:  # a broken install, said plainly
                    raise EngineError("the embedding model is not installed (the wordllama "
                                      "package); reinstall kvdesk") from e
                # The wheel's folder has the layout of wordllama's cache (weights/,
                # tokenizers/): pointing the cache there finds both, with no download.
                try:
                    self._model = wordllama.WordLlama.load(
                        config=self.CONFIG, dim=self.DIMENSION, disable_download=True,
                        cache_dir=Path(wordllama.__file__).parent)
                except OSError as e:  # FileNotFoundError: a damaged install or bundle
                    raise EngineError(f"the embedding model's files cannot be read ({e}); "
                                      "reinstall kvdesk") from e
            return self._model
