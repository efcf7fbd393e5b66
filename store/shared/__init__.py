"""The shared room: the remote tier, where machines share documents' entries through
S3-compatible object storage, the local store staying the index and the cache.

    remote     `RemoteTier` and `RemoteConfig`: a team's prefix of a bucket, its chunk objects
               (content-addressed), manifests and calibrations; the one module that talks to
               S3 (boto3, imported on first use)
    manifest   an entry's manifest: all another machine needs to use it, checked on every read
    sync       push and pull: entries moved between the local store and the tier
    checking   `remote verify` and `status`: what is shared read back (put back), counted
    localcopy  a remote entry being copied in, invisible locally until every chunk is in
    titles     how a transfer names the entries and caches it moved
    heads      the passages' head: a passage's entry extending it travels with its chunks

Its question is "what do machines share, and how does it come in?". The top of the store's
stack: it stands on the `Store` facade, the caches room's background writer and the leaf
modules, and nothing of the store imports it but the package's API (`RemoteConfig`,
`RemoteTier`). It never lets a chat leave the machine, never imports the app, llama.cpp or the
codec, and nothing but `remote` ever imports boto3 (an import-linter contract).
"""
