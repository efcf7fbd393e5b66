"""Which names the served model answers to, in each API the server speaks.

A server serves the one model it loaded. OpenAI's routes know it by its file's name (its stem)
and as "default", and take Ollama's names for it too, as Ollama's own OpenAI routes do.
Ollama's know it by the name `kvdesk models` gives it (an Ollama store's `name:tag`, another
app's file by its path under that app's folder, without ".gguf", "default" for the shipped
model), and, as Ollama reads a name without a tag, with ":latest" added. A request for any
other model is refused, saying which models are served and how to serve another; so is a
request to download or manage one (Ollama's pull of another model, delete, copy, create, push).

Each attached document is listed as a model too, "doc-ID-title" (`document_models`): the
served model answering from that document, for the tools that pick a model from the list
and cannot add kvdesk's own request field (Open WebUI, Continue, the `ollama` client). A
request naming one answers from it as if it named it in `kvdesk.documents`, first; its id
decides, whatever follows it (a title renamed since).

It never loads a model: names come from the settings, the file's path and its header.
"""

from __future__ import annotations

import re
import unicodedata
from functools import cached_property
from pathlib import Path

from ..app import App

# "doc-12-user-manual", "doc-12" and Ollama's "doc-12-user-manual:latest": document 12
_DOCUMENT_MODEL = re.compile(r"doc-(\d{1,12})(?:-[^:\s]*)?(?::latest)?", re.IGNORECASE)


class Served:
    def __init__(self, app: App):
        self.app = app

    @cached_property
    def file_id(self) -> str:
        return Path(self.app.model_path).stem

    @property
    def openai_ids(self) -> tuple[str, str]:
        return self.file_id, "default"

    @cached_property
    def listed_name(self) -> str:
        """The model's name as `kvdesk models` lists it."""
        chosen = self.app.settings.model
        if chosen is None:
            return "default"
        if not chosen.endswith(".gguf") and not Path(chosen).expanduser().is_file():
            return chosen  # chosen by its listed name
        path = str(Path(self.app.model_path).resolve())
        # A path: its listed name if some app's folder holds it (headers only, memoized).
        return next((m.name for m in self.app.list_models()
                     if str(Path(m.path).resolve()) == path), self.file_id)

    @property
    def ollama_name(self) -> str:
        """The listed name as Ollama's names go: ":latest" where it has no tag, and a file's
        without its ".gguf" (a file in a folder: the stem OpenAI's routes call it)."""
        name = self.listed_name
        if ":" in name:
            return name
        return f"{name[:-5] if name.lower().endswith('.gguf') else name}:latest"

    def is_ollama_name(self, name: str) -> bool:
        """Whether `name` (Ollama's way: a missing tag is ":latest") means the served model
        (by its listed name with ".gguf" too, as /api/tags once listed it)."""
        full = name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"
        return full in (self.ollama_name, f"{self.listed_name}:latest",
                        f"{self.file_id}:latest", "default:latest")

    def is_openai_name(self, name: str) -> bool:
        """Whether `name` means the served model on OpenAI's routes: its ids, or any name
        Ollama's routes take (Ollama's own OpenAI routes take those: clients set up for it
        send them)."""
        return name in self.openai_ids or self.is_ollama_name(name)

    def document_models(self) -> list[tuple[str, int]]:
        """(model name, document id) of each attached document, oldest first."""
        return [(f"doc-{i}-{_slug(title)}".rstrip("-"), i)
                for i, title in sorted(self.app.store.document_titles().items())]

    def document_of(self, name: str) -> int | None:
        """The document a document's model name picks; None for any other name."""
        m = _DOCUMENT_MODEL.fullmatch(name)
        return int(m[1]) if m else None

    def picks(self, name: str, *, ollama: bool) -> bool:
        """Whether `name` means the served model, alone or answering from a document that is
        attached (one removed is no model: `/api/show` said it was)."""
        doc = self.document_of(name)
        if doc is not None:
            return doc in self.app.store.document_titles()
        return self.is_ollama_name(name) if ollama else self.is_openai_name(name)

    def answering(self, name: str, options: dict) -> dict:
        """A request's engine options (`KvdeskOptions.engine_options`) with the document its
        model name picks first among its documents."""
        doc = self.document_of(name)
        if doc is None:
            return options
        return {**options, "documents": [doc, *(d for d in options["documents"] if d != doc)]}

    def not_managed(self, asked: str) -> str:
        """Why Ollama's model management (pull of another model, delete, copy, create, push)
        is refused: a server serves the model its settings pick, and downloads none."""
        return (f"{asked}: kvdesk does not download or manage models; this server serves "
                f"{self.ollama_name!r}, the model its settings pick (the setting `model`, or "
                "`kvdesk --model NAME serve`; `kvdesk models` lists the models on this machine)")

    def refusal(self, name: str, *, ollama: bool) -> str:
        if (doc := self.document_of(name)) is not None:
            return (f"model {name!r}: no document {doc} is attached (`kvdesk docs` lists them, "
                    "and the models list names each one's model)")
        served = repr(self.ollama_name) if ollama else " or ".join(map(repr, self.openai_ids))
        return (f"model {name!r} is not served here: this server serves {served}; to use "
                f"another, start `kvdesk --model NAME serve` (`kvdesk models` lists them)")


def _slug(title: str) -> str:
    """A title as a model name's letters: its letters (any script's, with their marks) in
    lower case, digits and dashes, 40 at most ("доклад-2024-pdf", "müller-vertrag-txt")."""
    kept = "".join(c if c.isalnum() or unicodedata.category(c).startswith("M") else "-"
                   for c in unicodedata.normalize("NFC", title.lower()))
    return re.sub("-+", "-", kept).strip("-")[:40].rstrip("-")
