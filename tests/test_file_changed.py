"""A document whose file changed after it was attached, without a model: the listing, a
question and a new attach of the file say so (the answers use the text attached then)."""

from __future__ import annotations

import os

from test_store_helpers import open_store

from desktop_app.chat import documents
from desktop_app.chat.library import Library


def attached(store, path):
    """A document as attach stores it: the extracted text's hash, the file's path."""
    got = documents.extract(path)
    return store.add_document(got.content_hash, got.title, got.text, type=got.kind,
                              source_path=str(path))


def test_a_changed_file_is_said_in_the_listing_a_question_and_the_next_attach(tmp_path):
    path = tmp_path / "notes.md"
    path.write_text("The gate code is 4417.\n")
    with open_store(tmp_path / "data") as store:
        library = Library(store)
        old = attached(store, path)
        later = old.created + 10
        os.utime(path, (later, later))  # touched, the same text: not changed
        assert library.changed_files([old.id]) == []
        path.write_text("The gate code is 9020.\n")
        os.utime(path, (later + 1, later + 1))
        (listed,) = library.documents("model-a")
        assert listed.file_changed and listed.newer is None
        (note,) = library.changed_files([old.id])
        assert f"document {old.id} ({path}) changed after it was attached" in note
        new = attached(store, path)
        assert library.earlier_versions(new.id) == [
            f"document {old.id} is an earlier version of this file, attached before it "
            f"changed: `kvdesk rm doc {old.id}` removes it"]
        assert library.changed_files([new.id]) == [] and library.earlier_versions(old.id) == []
        listing = {d.doc_id: d for d in library.documents("model-a")}
        assert listing[old.id].newer == new.id and not listing[new.id].file_changed
        (note,) = library.changed_files([old.id, 99])  # (99: deleted meanwhile, not said)
        assert note.endswith(f"answers use the text attached then; document {new.id} holds "
                             "its new text")
        path.unlink()  # a file gone is not "changed": the attached text stands
        assert library.changed_files([old.id, new.id]) == []


def test_a_fat_drives_time_two_seconds_early_still_counts_as_changed(tmp_path):
    """A FAT drive keeps a file's time to 2 s, rounded down: an edit just after the attach
    may read as made before it."""
    path = tmp_path / "notes.md"
    path.write_text("The gate code is 4417.\n")
    with open_store(tmp_path / "data") as store:
        old = attached(store, path)
        path.write_text("The gate code is 9020.\n")
        early = old.created - 1.5
        os.utime(path, (early, early))
        (listed,) = Library(store).documents("model-a")
        assert listed.file_changed



def test_a_path_this_locale_cannot_encode_is_not_checked_as_a_file_gone(tmp_path, monkeypatch):
    """A document attached under UTF-8 (`山.md`), listed and asked about under a Latin-1 or
    ASCII locale: its path cannot be encoded, so its file is not checked, never a traceback."""
    path = tmp_path / "山.md"
    path.write_text("The gate code is 4417.\n")
    real_stat = os.stat

    def latin1_stat(p, *args, **kwargs):  # (what os.stat does where the locale is Latin-1)
        os.fspath(p).encode("latin-1")
        return real_stat(p, *args, **kwargs)

    with open_store(tmp_path / "data") as store:
        doc = attached(store, path)
        library = Library(store)
        path.write_text("The gate code is 9020.\n")  # (changed: it would be read, if it could)
        later = doc.created + 10
        os.utime(path, (later, later))
        monkeypatch.setattr(os, "stat", latin1_stat)
        (listed,) = library.documents("model-a")
        assert not listed.file_changed and library.changed_files([doc.id]) == []
        assert documents.stored(library.document(doc.id), read=True).text == doc.text
