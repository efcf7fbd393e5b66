"""Model discovery: the folders LM Studio, GPT4All, Jan, Ollama and the Hugging Face cache keep
GGUF files in (their real layouts, under a fake home), headers read without tensors, a status
for what kvdesk supports, refuses or cannot read, and `--model NAME`."""

from __future__ import annotations

import json
import os

import gguf
import numpy as np
import pytest

from desktop_app.app import App
from desktop_app.cli import main
from desktop_app.model import gguf_header, models
from desktop_app.settings import Settings

OLLAMA_DIGEST = "ab" * 32


def write_gguf(path, arch, *, window=None, n_layer=4, heads=8, kv_heads=2, embd=256,
               context=8192, file_type=gguf.LlamaFileType.MOSTLY_Q4_K_M, split=None,
               strings=()):
    """A real GGUF file: a model's header (and `strings`, (key, value) pairs) and one small
    tensor."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}")
    w.add_context_length(context)
    w.add_block_count(n_layer)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_embedding_length(embd)
    w.add_file_type(file_type)
    if window:
        w.add_sliding_window(window)
    if split:
        w.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_NO, split[0])
        w.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_COUNT, split[1])
    for key, value in strings:
        w.add_string(key, value)
    w.add_token_list([f"t{i}" for i in range(1000)])
    w.add_tensor("token_embd.weight", np.zeros((1000, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def home(tmp_path):
    """A home folder holding each app's models where that app keeps them (Linux layout)."""
    home = tmp_path / "home"
    write_gguf(home / ".lmstudio/models/lmstudio-community/Qwen2.5-0.5B-Instruct-GGUF/"
               "Qwen2.5-0.5B-Instruct-Q4_K_M.gguf", "qwen2", context=32768)
    write_gguf(home / ".cache/lm-studio/models/TheBloke/Mamba-GGUF/mamba-130m.Q8_0.gguf",
               "mamba")
    write_gguf(home / ".local/share/nomic.ai/GPT4All/Llama-3.2-1B-Instruct-Q4_0.gguf", "llama")
    write_gguf(home / "jan/models/gemma-3-270m/model.gguf", "gemma3", window=512, n_layer=18,
               heads=4, kv_heads=1, embd=1024)
    write_gguf(home / ".local/share/Jan/data/llamacpp/models/jamba-mini/model.gguf", "jamba")
    write_gguf(home / ".local/share/Jan/data/llamacpp/models/qwen2-vl/mmproj.gguf", "clip")
    # Ollama: a manifest per name:tag, naming its model layer's blob.
    store = home / ".ollama/models"
    write_gguf(store / f"blobs/sha256-{OLLAMA_DIGEST}", "llama", context=131072)
    for ns, name, tag, digest in [("library", "llama3.2", "3b", OLLAMA_DIGEST),
                                  ("someone", "tuned", "latest", OLLAMA_DIGEST[:-2] + "cd")]:
        manifest = store / "manifests/registry.ollama.ai" / ns / name / tag
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
            {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:00"},
            {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}",
             "size": 1}]}))
    broken = store / "manifests/registry.ollama.ai/library/broken/latest"
    broken.parent.mkdir(parents=True)
    broken.write_text("{not json")
    # The Hugging Face hub cache: snapshots link to content-addressed blobs.
    repo = home / ".cache/huggingface/hub/models--bartowski--SmolLM2-135M-Instruct-GGUF"
    blob = write_gguf(repo / "blobs/0123abcd", "llama", file_type=gguf.LlamaFileType.MOSTLY_Q8_0)
    link = repo / "snapshots/5f6e/SmolLM2-135M-Instruct-Q8_0.gguf"
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    return home


def listing(home, folders=(), memo_dir=None):
    found = models.discover(folders, memo_dir=memo_dir, home=home, env={}, platform="linux")
    return {m.name: m for m in found}


def test_every_apps_models_are_listed_with_their_header(home):
    found = listing(home)
    assert {name: (m.source, m.architecture, m.status) for name, m in found.items()} == {
        "lmstudio-community/Qwen2.5-0.5B-Instruct-GGUF/Qwen2.5-0.5B-Instruct-Q4_K_M.gguf":
            ("lmstudio", "qwen2", "untested"),
        "TheBloke/Mamba-GGUF/mamba-130m.Q8_0.gguf": ("lmstudio", "mamba", "refused"),
        "Llama-3.2-1B-Instruct-Q4_0.gguf": ("gpt4all", "llama", "supported"),
        "gemma-3-270m/model.gguf": ("jan", "gemma3", "supported"),
        "jamba-mini/model.gguf": ("jan", "jamba", "refused"),
        "qwen2-vl/mmproj.gguf": ("jan", "clip", "refused"),
        "llama3.2:3b": ("ollama", "llama", "supported"),
        "someone/tuned:latest": ("ollama", None, "unreadable"),  # its blob is missing
        "broken:latest": ("ollama", None, "unreadable"),
        "bartowski/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct-Q8_0.gguf":
            ("huggingface", "llama", "supported"),
    }
    ollama = found["llama3.2:3b"]
    assert ollama.path.endswith(f"blobs/sha256-{OLLAMA_DIGEST}")
    assert (ollama.context_length, ollama.quantization, ollama.parameters) == (131072, "Q4_K_M",
                                                                               8000)
    # 4 layers x (K + V) x 2 KV heads x 32 channels x 2 bytes
    assert ollama.kv_bytes_per_token == 4 * 2 * 2 * 32 * 2
    gemma = found["gemma-3-270m/model.gguf"]
    # 3 of 18 layers attend to everything, 15 to a window of 512 positions.
    assert (gemma.sliding_window, gemma.kv_bytes_per_token) == (512, 3 * 2 * 256 * 2)
    assert gemma.kv_window_bytes == 512 * 15 * 2 * 256 * 2
    assert "hybrid" in found["jamba-mini/model.gguf"].reason
    assert "recurrent" in found["TheBloke/Mamba-GGUF/mamba-130m.Q8_0.gguf"].reason
    assert "manifest" in found["broken:latest"].reason
    assert "No such file" in found["someone/tuned:latest"].reason
    assert found["bartowski/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct-Q8_0.gguf"] \
        .quantization == "Q8_0"


def test_other_platforms_folders(tmp_path):
    home = tmp_path / "home"
    mac = dict(models.locations(home, {}, "darwin"))
    assert mac["gpt4all"] == home / "Library/Application Support/nomic.ai/GPT4All"
    win = models.locations(home, {"LOCALAPPDATA": "C:/L", "APPDATA": "C:/R",
                                  "OLLAMA_MODELS": "D:/ollama", "HF_HOME": "D:/hf"}, "win32")
    assert ("gpt4all", tmp_path.__class__("C:/L/nomic.ai/GPT4All")) in win
    assert ("jan", tmp_path.__class__("C:/R/Jan/data/llamacpp/models")) in win
    assert ("ollama", tmp_path.__class__("D:/ollama")) in win
    assert ("huggingface", tmp_path.__class__("D:/hf/hub")) in win


def test_unreadable_files_get_a_status_never_a_crash(home, tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.gguf").write_text("not a model at all")
    (folder / "empty.gguf").write_bytes(b"")
    good = write_gguf(folder / "whole.gguf", "llama")
    (folder / "cut.gguf").write_bytes(good.read_bytes()[:200])
    # GGUF magic and version, then absurd counts.
    (folder / "huge.gguf").write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes([255]) * 16)
    (folder / "old.gguf").write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(16))
    write_gguf(folder / "big-00001-of-00002.gguf", "llama", split=(0, 2))
    write_gguf(folder / "big-00002-of-00002.gguf", "llama", split=(1, 2))
    found = listing(home, [folder])
    reasons = {n: m.reason for n, m in found.items() if m.source == "folder"}
    assert reasons["notes.gguf"] == "not a GGUF file"
    assert "shorter than its magic" in reasons["empty.gguf"]
    assert "ends inside its header" in reasons["cut.gguf"]
    assert "not a model header" in reasons["huge.gguf"]
    assert "GGUF version 1" in reasons["old.gguf"]
    assert found["whole.gguf"].status == "supported"
    assert "part 1 of 2" in found["big-00001-of-00002.gguf"].reason
    assert "big-00002-of-00002.gguf" not in found
    assert all(found[n].status == "unreadable"
               for n in ("notes.gguf", "empty.gguf", "cut.gguf", "huge.gguf", "old.gguf"))


def test_a_huge_file_is_read_no_further_than_its_header(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "big.gguf", "llama")
    header = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(8 << 30)  # 8 GB of (sparse) tensor data after it
    read = []
    real_open = open

    def counting(*args, **kwargs):
        f = real_open(*args, **kwargs)
        real_read = f.read

        def counted(n=-1):
            assert n != -1, "the whole file read"
            data = real_read(n)
            read.append(len(data))
            return data

        f.read = counted
        return f

    monkeypatch.setattr(gguf_header, "open", counting, raising=False)
    assert gguf_header.read(path).architecture == "llama"
    assert sum(read) <= max(header, 1 << 20) * 2


def test_headers_are_remembered(home, tmp_path, monkeypatch):
    first = listing(home, memo_dir=tmp_path / "data")
    assert (tmp_path / "data" / models.MEMO_FILE).is_file()

    def no_reads(path):
        raise AssertionError(f"{path} read again")

    monkeypatch.setattr(gguf_header, "read", no_reads)
    assert listing(home, memo_dir=tmp_path / "data") == first


def test_a_model_is_chosen_by_its_listed_name(home, monkeypatch):
    listed = [(m.name, m.path) for m in listing(home).values()]
    blob = dict(listed)["llama3.2:3b"]
    assert models.find_named("llama3.2:3b", listed) == blob
    assert models.find_named("LLAMA3.2:3B", listed) == blob
    assert models.find_named("someone/tuned", listed) == dict(listed)["someone/tuned:latest"]
    assert models.find_named("Llama-3.2-1B-Instruct-Q4_0", listed).endswith(".gguf")
    assert models.find_named("nothing-like-it", listed) is None
    with pytest.raises(models.ModelNotFoundError, match="several models"):
        models.find_named("model.gguf", listed)
    monkeypatch.setenv("HOME", str(home))
    for var in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "HF_HOME",
                "HF_HUB_CACHE", "OLLAMA_MODELS"):
        monkeypatch.delenv(var, raising=False)
    assert str(App(Settings(model="llama3.2:3b")).model_path) == blob
    with pytest.raises(models.ModelNotFoundError, match="kvdesk models"):
        _ = App(Settings(model="llama9:70b")).model_path


def test_cli_models_json(home, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(home))
    for var in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "HF_HOME",
                "HF_HUB_CACHE", "OLLAMA_MODELS"):
        monkeypatch.delenv(var, raising=False)
    main(["models", "--json"])
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    assert (by_name["default"]["source"], by_name["default"]["status"]) == ("kvdesk",
                                                                          "supported")
    assert by_name["llama3.2:3b"]["kv_bytes_per_token"] == 1024
    main(["models"])
    out = capsys.readouterr().out
    assert "llama3.2:3b" in out and "refused: hybrid memory" in out
