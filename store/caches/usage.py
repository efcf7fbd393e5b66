"""Where the stored KV's bytes go: by model and by what each cache is for.

`kvdesk docs` ends with it, so that the disk a data directory takes is accounted for: the
documents' own caches, long documents' passages, chats' caches, and the rest (the
local API's prompts, the passages' shared system prompt), each model's apart. It only reads.
"""

from __future__ import annotations

from ..datadir.db import Connections

KINDS = ("documents", "passages", "chats", "prompts")

_BY_KIND = """
SELECT e.model, CASE WHEN e.passage THEN 'passages' WHEN e.document_id IS NOT NULL
       THEN 'documents' WHEN e.chat_id IS NOT NULL THEN 'chats' ELSE 'prompts' END,
       coalesce(sum(c.nbytes), 0)
FROM kv_chunks c JOIN kv_entries e ON e.id = c.entry_id GROUP BY 1, 2
"""


class UsageStore:
    _db: Connections

    def usage_by_kind(self) -> dict[str, dict[str, int]]:
        """{model fingerprint: {kind (`KINDS`): bytes of its stored chunks}}, the kinds it
        has any of; writes under way count with what they will be."""
        out: dict[str, dict[str, int]] = {}
        for model, kind, nbytes in self._db.get().conn.execute(_BY_KIND):
            out.setdefault(model, {})[kind] = nbytes
        return out
