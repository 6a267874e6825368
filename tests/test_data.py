"""
Tests for prepare_data.py, support/tokenizers.py and the token data support/data.py reads: CPU only,
offline, a few seconds. Token data that is not what meta.json says: a broken or incomplete meta.json is one
line naming the file and what is wrong; check_token_ids finds a token id the tokenizer cannot produce (from
meta.json's max_token_id, or by scanning the files in chunks); get_batch refuses a file rewritten since
load_meta checked it.

    python -m pytest -q tests/test_data.py

The GPT-2 tests read the GPT-2 vocabulary from TIKTOKEN_CACHE_DIR and real FineWeb records from the folder
NANOMESH_FINEWEB_SAMPLE; they are skipped, with the reason, when either is not set.
"""

import gzip
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent

import prepare_data as pd  # noqa: E402  (after the environment variable is set)
from prepare_data import main  # noqa: E402
from support.data import check_token_ids, get_batch, load_meta  # noqa: E402
from support.runtime import RunError  # noqa: E402
from support.tokenizers import ByteTokenizer, DataError, get_tokenizer  # noqa: E402
from test_train import write_dataset  # noqa: E402

# A folder of FineWeb(-Edu) .jsonl records and the GPT-2 vocabulary cached for offline use (docs/tests.md)
FINEWEB = Path(os.environ.get("NANOMESH_FINEWEB_SAMPLE", "<unset>"))
needs_fineweb = pytest.mark.skipif(
    not FINEWEB.is_dir(), reason="set NANOMESH_FINEWEB_SAMPLE to a folder of FineWeb .jsonl records")
needs_gpt2_cache = pytest.mark.skipif(
    not Path(os.environ.get("TIKTOKEN_CACHE_DIR", "<unset>")).is_dir(),
    reason="set TIKTOKEN_CACHE_DIR to a folder holding the GPT-2 vocabulary (docs/data.md)")


# ---------------------------------------------------------------------------------------------
# helpers

def write_jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def run(out_dir, *args):
    """Run prepare_data in this process; return (meta, dataset folder)."""
    meta = main([*map(str, args), "--out_dir", str(out_dir)])
    name = next(p for p in Path(out_dir).iterdir() if (p / "meta.json").exists())
    return meta, name


def load_split(folder, split):
    """Read a .bin file as train.py would: sizes must match meta.json exactly."""
    meta = json.loads((folder / "meta.json").read_text())
    tokens = np.fromfile(folder / f"{split}.bin", dtype=meta["dtype"])
    assert (folder / f"{split}.bin").stat().st_size == meta[f"{split}_tokens"] * np.dtype(
        meta["dtype"]
    ).itemsize
    return tokens


def documents(tokens, eot):
    """Split a token array into documents at EOT; the array must end with EOT."""
    assert len(tokens) and tokens[-1] == eot, "every document, including the last, ends with EOT"
    ends = np.flatnonzero(tokens == eot)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [tokens[s:e] for s, e in zip(starts, ends)]


def byte_docs(folder, split):
    return [bytes(d.astype(np.uint8)).decode("utf-8") for d in documents(load_split(folder, split), 256)]


def blake_u(text):
    """Independent re-implementation of the split hash, as a number in [0, 1)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little") / 2**64


def synthetic_texts(n, seed=0):
    rng = random.Random(seed)
    words = ["data", "token", "mesh", "über", "naïve", "日本", "loop", "grad", "vocab", "émigré", "🚀"]
    return [f"doc {i}: " + " ".join(rng.choice(words) for _ in range(rng.randint(3, 40))) for i in range(n)]


# ---------------------------------------------------------------------------------------------
# tokenizers

def test_byte_tokenizer_round_trip():
    tok = get_tokenizer("byte")
    assert (tok.name, tok.eot, tok.vocab_size) == ("byte", 256, 257)
    text = "héllo wörld — 日本語 🚀\n"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and len(ids) == len(text.encode("utf-8")) > len(text)
    assert tok.decode(ids) == text
    assert tok.encode_batch([text, "a"]) == [ids, [97]]
    assert tok.decode(ids + [256] + tok.encode("next")) == text + "<|endoftext|>next"
    assert tok.decode([0xE6, 0x97]) == "\ufffd"  # a cut multi-byte character must not raise
    tok.decode(list(range(257)))  # every id < vocab_size decodes
    with pytest.raises(ValueError):
        tok.decode([257])


@needs_gpt2_cache
def test_gpt2_tokenizer():
    tok = get_tokenizer("gpt2")
    assert (tok.name, tok.eot, tok.vocab_size) == ("gpt2", 50256, 50257)
    assert tok.encode("Hello world") == [15496, 995]
    assert 50256 not in tok.encode("a <|endoftext|> b")  # ordinary encoding: special text stays text
    assert tok.encode_batch(["Hello world", " the"]) == [[15496, 995], [262]]
    text = "naïve café — 日本語"
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode("日本")[:1]) == "\ufffd"  # first byte-level piece of 日: cut UTF-8, no raise
    tok.decode(list(range(50257)))  # every id < vocab_size decodes, partial UTF-8 included


def test_missing_tiktoken_vocab_names_cache_env(monkeypatch):
    import tiktoken

    def offline(name):
        raise ConnectionError("HTTPSConnectionPool(host='openaipublic.blob.core.windows.net'): Max retries")
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "/nowhere")      # the message quotes the variable's value
    with pytest.raises(DataError, match="TIKTOKEN_CACHE_DIR=/nowhere") as e:
        get_tokenizer("gpt2")
    assert "\n" not in str(e.value) and "shared" not in str(e.value)
    assert "online" in str(e.value) and "offline" in str(e.value)       # how to get it, either way
    with pytest.raises(DataError, match="gpt2"):
        get_tokenizer("gpt3")


def test_storage_dtype_and_uint16_guard():
    assert pd.storage_dtype(257) == np.uint16 and pd.storage_dtype(65536) == np.uint16
    assert pd.storage_dtype(65537) == np.uint32 and pd.storage_dtype(100277) == np.uint32
    ok = pd.to_storage(np.array([0, 65535]), 65536)
    assert ok.dtype == np.uint16 and ok.tolist() == [0, 65535]
    with pytest.raises(DataError, match="65536"):
        pd.to_storage(np.array([1, 65536]), 65536)  # would wrap to 0 in uint16
    with pytest.raises(DataError, match="50257"):
        pd.to_storage(np.array([50257]), 50257)  # in uint16 range but not a valid id
    big = pd.to_storage(np.array([70000, 100276]), 100277)
    assert big.dtype == np.uint32 and big.tolist() == [70000, 100276]


def test_pipeline_refuses_ids_that_would_wrap(tmp_path, monkeypatch):
    class WrapTokenizer(ByteTokenizer):  # claims a small vocabulary but emits a too-large id
        def encode_batch(self, texts, num_threads=None):
            return [[1, 65536 + 5] for _ in texts]
    monkeypatch.setattr(pd, "get_tokenizer", lambda name: WrapTokenizer())
    src = write_jsonl(tmp_path / "x.jsonl", ["a", "b", "c"])
    with pytest.raises(DataError, match="65541"):
        main(["--input", str(src), "--out_dir", str(tmp_path / "out"), "--num_proc", "1"])
    assert not (tmp_path / "out" / "x" / "meta.json").exists()
    assert not (tmp_path / "out" / "x" / "train.bin").exists()


@pytest.mark.parametrize("val_fraction", [0.3, 1e-6])  # 1e-6: val is the smallest-hash document
def test_meta_max_token_id_is_the_largest_id_in_the_files(tmp_path, monkeypatch, val_fraction):
    class ShiftedBytes(ByteTokenizer):  # EOT is id 0 and byte b is id b + 1: the largest id is a text's
        eot = 0

        def encode_batch(self, texts, num_threads=None):
            return [[b + 1 for b in t.encode("utf-8")] for t in texts]
    monkeypatch.setattr(pd, "get_tokenizer", lambda name: ShiftedBytes())
    texts = synthetic_texts(30, seed=3)
    src = write_jsonl(tmp_path / "in.jsonl", texts)
    meta, folder = run(tmp_path / "out", "--input", src, "--tokenizer", "byte", "--val_fraction",
                       val_fraction, "--num_proc", 1)
    assert meta["val_docs"] >= 1 and meta["train_docs"] >= 1
    written = np.concatenate([load_split(folder, "train"), load_split(folder, "val")])
    assert json.loads((folder / "meta.json").read_text())["max_token_id"] == written.max()
    assert meta["max_token_id"] == max(max(t.encode("utf-8")) for t in texts) + 1


def test_a_bin_changed_after_preparation_has_its_ids_checked_again(tmp_path, monkeypatch):
    """meta.json records each .bin's size and mtime: while they hold, max_token_id is trusted (no scan); a
    val.bin rewritten afterwards (same size, an id 257 the byte tokenizer cannot make) is scanned and
    refused, naming the file and prepare_data.py."""
    from support.data import check_token_ids
    from support.runtime import RunError
    src = write_jsonl(tmp_path / "in.jsonl", synthetic_texts(60, seed=4))
    meta, folder = run(tmp_path / "out", "--input", src, "--tokenizer", "byte", "--num_proc", 1)
    assert set(meta["files"]) == {"train.bin", "val.bin"}
    scans = []
    real_memmap = np.memmap
    monkeypatch.setattr(np, "memmap", lambda *a, **k: scans.append(a[0]) or real_memmap(*a, **k))
    check_token_ids(str(folder), meta, meta["vocab_size"])
    assert scans == []                                       # unchanged: meta.json's max_token_id holds
    val = np.fromfile(folder / "val.bin", dtype=meta["dtype"])
    val[3] = 257
    time.sleep(0.01)
    val.tofile(folder / "val.bin")                           # the same size, a new mtime
    with pytest.raises(RunError, match=r"val\.bin holds token id 257 at position 3, .*prepare_data\.py"):
        check_token_ids(str(folder), meta, meta["vocab_size"])
    assert len(scans) == 2


# ---------------------------------------------------------------------------------------------
# golden test against the real FineWeb sample (token_count computed by the dataset's own pipeline)

@needs_fineweb
@needs_gpt2_cache
def test_golden_token_counts_fineweb(tmp_path):
    records = [
        json.loads(line) for f in sorted(FINEWEB.glob("*.jsonl")) for line in open(f, encoding="utf-8")
    ]
    golden = [r for r in records if "token_count" in r]
    assert len(golden) == 1623
    tok = get_tokenizer("gpt2")
    counts = [len(ids) for ids in tok.encode_batch([r["text"] for r in golden])]
    assert counts == [r["token_count"] for r in golden]
    assert len(tok.encode(golden[0]["text"])) == golden[0]["token_count"]

    # Pipeline level: the two files whose records all carry token_count, in 2 processes.
    files = [
        f
        for f in sorted(FINEWEB.glob("*.jsonl"))
        if all("token_count" in json.loads(line) for line in open(f))
    ]
    assert sum(1 for f in files for _ in open(f)) == 1623
    meta, folder = run(tmp_path, "--input", *files, "--tokenizer", "gpt2", "--num_proc", 2)
    # + one EOT each
    assert meta["train_tokens"] + meta["val_tokens"] == sum(r["token_count"] for r in golden) + 1623
    assert meta["train_docs"] + meta["val_docs"] == 1623 and meta["val_docs"] >= 1
    assert (meta["dtype"], meta["eot"], meta["vocab_size"]) == ("uint16", 50256, 50257)
    # val holds exactly the documents whose hash is below val_fraction, and they decode back to the text
    expected_val = sorted(r["text"] for r in golden if blake_u(r["text"]) < meta["val_fraction"])
    val_texts = sorted(tok.decode(d) for d in documents(load_split(folder, "val"), tok.eot))
    assert val_texts == expected_val
    assert len(documents(load_split(folder, "train"), tok.eot)) == meta["train_docs"]


# ---------------------------------------------------------------------------------------------
# layout: EOT placement, empty documents, formats, max_tokens

def test_eot_after_each_document_and_empty_docs_skipped(tmp_path):
    texts = ["alpha", "", "   \n\t", "béta ✓", "gamma\n\nend"]
    src = write_jsonl(tmp_path / "in.jsonl", texts)
    meta, folder = run(tmp_path / "out", "--input", src, "--tokenizer", "byte", "--val_fraction", 0.5)
    kept = ["alpha", "béta ✓", "gamma\n\nend"]
    train, val = byte_docs(folder, "train"), byte_docs(folder, "val")
    assert sorted(train + val) == sorted(kept)  # the bins decode back to the documents
    # input order kept
    assert train == [t for t in kept if t in train] and val == [t for t in kept if t in val]
    assert meta["train_docs"] + meta["val_docs"] == 3
    assert meta["train_tokens"] + meta["val_tokens"] == sum(len(t.encode()) + 1 for t in kept)
    for split in ("train", "val"):
        tokens = load_split(folder, split)
        assert tokens[0] != 256 and tokens[-1] == 256  # EOT after each document, never before the first
        assert not np.any((tokens[1:] == 256) & (tokens[:-1] == 256))  # no double EOT from empty documents
    assert (meta["tokenizer"], meta["eot"], meta["vocab_size"], meta["dtype"]) == ("byte", 256, 257, "uint16")
    assert meta["sources"] == [str(src)] and "hash" in meta["split"] and meta["val_fraction"] == 0.5
    assert folder.name == "in"  # default --name is the first input's stem


def test_all_input_formats(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa
    write_jsonl(tmp_path / "a.jsonl", ["one", "two"])
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"text": "three", "id": 3}) + "\n\n" + json.dumps({"text": "four"}) + "\n")
    pq.write_table(pa.table({"text": ["five", None, "six"], "id": [5, 0, 6]}), tmp_path / "c.parquet")
    (tmp_path / "d.txt").write_text("seven\nstill seven\n", encoding="utf-8")
    inputs = [tmp_path / n for n in ("a.jsonl", "b.jsonl.gz", "c.parquet", "d.txt")]
    meta, folder = run(tmp_path / "out", "--input", *inputs, "--tokenizer", "byte", "--name", "mix")
    assert folder.name == "mix" and meta["sources"] == [str(p) for p in inputs]
    got = byte_docs(folder, "train") + byte_docs(folder, "val")
    assert sorted(got) == sorted(["one", "two", "three", "four", "five", "six", "seven\nstill seven\n"])


def test_max_tokens_keeps_whole_documents_in_order(tmp_path):
    texts = synthetic_texts(200)
    src = write_jsonl(tmp_path / "in.jsonl", texts)
    sizes = np.cumsum([len(t.encode()) + 1 for t in texts])
    limit = int(sizes[120]) - 3  # falls inside document 120: keep documents 0..119
    meta, folder = run(tmp_path / "out", "--input", src, "--tokenizer", "byte", "--max_tokens", limit,
                       "--val_fraction", 0.2, "--num_proc", 2)
    assert meta["train_tokens"] + meta["val_tokens"] == sizes[119] <= limit
    assert sorted(byte_docs(folder, "train") + byte_docs(folder, "val")) == sorted(texts[:120])


# ---------------------------------------------------------------------------------------------
# the validation split

def test_split_is_deterministic_across_processes_and_order(tmp_path):
    texts = synthetic_texts(400, seed=1)
    src = write_jsonl(tmp_path / "a.jsonl", texts)
    shuffled = texts[:]
    random.Random(2).shuffle(shuffled)
    src_shuffled = write_jsonl(tmp_path / "b.jsonl", shuffled)
    args = ("--tokenizer", "byte", "--val_fraction", 0.1)
    m1, f1 = run(tmp_path / "p1", "--input", src, "--num_proc", 1, *args)
    m2, f2 = run(tmp_path / "p2", "--input", src, "--num_proc", 2, *args)
    m3, f3 = run(tmp_path / "p3", "--input", src_shuffled, "--num_proc", 2, *args)
    for split in ("train", "val"):
        assert (f1 / f"{split}.bin").read_bytes() == (f2 / f"{split}.bin").read_bytes()
        assert sorted(byte_docs(f1, split)) == sorted(byte_docs(f3, split))
    assert {k: m1[k] for k in ("train_tokens", "val_tokens", "train_docs", "val_docs")} == \
           {k: m3[k] for k in ("train_tokens", "val_tokens", "train_docs", "val_docs")}
    # the rule itself, checked with an independent hash
    assert sorted(byte_docs(f1, "val")) == sorted(t for t in texts if blake_u(t) < 0.1)
    assert 20 <= m1["val_docs"] <= 65  # ~40 expected out of 400


def test_val_never_empty_on_tiny_input(tmp_path):
    texts = synthetic_texts(30, seed=3)
    assert min(blake_u(t) for t in texts) >= 1e-6  # precondition: no document hashes into val by itself
    src = write_jsonl(tmp_path / "in.jsonl", texts)
    meta, folder = run(tmp_path / "out", "--input", src, "--tokenizer", "byte", "--val_fraction", 1e-6)
    smallest = min(texts, key=blake_u)
    assert byte_docs(folder, "val") == [smallest] and meta["val_docs"] == 1
    assert byte_docs(folder, "train") == [t for t in texts if t != smallest]  # train rewritten without it
    assert meta["val_tokens"] == len(smallest.encode()) + 1

    two = write_jsonl(tmp_path / "two.jsonl", texts[:2])
    meta, folder = run(tmp_path / "out2", "--input", two, "--tokenizer", "byte")
    assert (meta["train_docs"], meta["val_docs"]) == (1, 1)


def test_pydoc_source_in_process(tmp_path):
    meta, folder = run(tmp_path, "--source", "pydoc", "--tokenizer", "byte", "--num_proc", 1)
    from pydoc_data.topics import topics
    nonempty = [t for t in topics.values() if t.strip()]
    assert folder.name == "pydoc" and meta["train_docs"] + meta["val_docs"] == len(nonempty)
    assert meta["train_tokens"] + meta["val_tokens"] == sum(len(t.encode()) + 1 for t in nonempty)
    assert meta["val_fraction"] == 0.05 and meta["val_tokens"] > 1025  # val longer than a 1024 context


# ---------------------------------------------------------------------------------------------
# atomic outputs

def test_interrupted_run_leaves_nothing_train_py_accepts(tmp_path, monkeypatch):
    src = write_jsonl(tmp_path / "in.jsonl", synthetic_texts(50))
    out = tmp_path / "out"
    run(out, "--input", src, "--tokenizer", "byte")
    folder = out / "in"
    assert (folder / "meta.json").exists()

    # 1) crash in the middle of tokenization; record what the folder looked like at that moment
    seen = {}
    original_add = pd.SplitWriter.add

    def crash_add(self, *a):
        seen["files"] = sorted(p.name for p in folder.iterdir())
        original_add(self, *a)
        raise KeyboardInterrupt
    monkeypatch.setattr(pd.SplitWriter, "add", crash_add)
    with pytest.raises(KeyboardInterrupt):
        main(["--input", str(src), "--tokenizer", "byte", "--out_dir", str(out), "--num_proc", "1"])
    assert "meta.json" not in seen["files"]  # the old meta.json was deleted before anything was written
    assert {"train.bin.tmp", "val.bin.tmp"} <= set(seen["files"])  # work in progress has *.tmp names
    assert not (folder / "meta.json").exists()
    assert not list(folder.glob("*.tmp"))  # and is cleaned up
    monkeypatch.undo()

    # 2) crash while writing meta.json, which comes last: the final bins are already complete by then
    def crash_meta(path, meta):
        seen["at_meta"] = {p.name: p.stat().st_size for p in path.parent.iterdir()}
        seen["meta"] = meta
        raise OSError("disk full")
    monkeypatch.setattr(pd, "write_meta", crash_meta)
    fresh = tmp_path / "fresh"
    with pytest.raises(OSError):
        main(["--input", str(src), "--tokenizer", "byte", "--out_dir", str(fresh)])
    assert seen["at_meta"] == {
        "train.bin": 2 * seen["meta"]["train_tokens"],
        "val.bin": 2 * seen["meta"]["val_tokens"],
    }
    assert sorted(p.name for p in (fresh / "in").iterdir()) == ["train.bin", "val.bin"]  # no meta.json


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes (POSIX)")
def test_sigkill_mid_write_leaves_data_train_py_refuses(tmp_path):
    """A real SIGKILL while the token file is being written. A named pipe at train.bin.tmp makes the write
    observable: prepare_data.py blocks in it once the pipe is full (64 KiB) and is killed there."""
    src = write_jsonl(tmp_path / "in.jsonl", synthetic_texts(2000))   # ~200K tokens, 400 KB of uint16
    out = tmp_path / "out"
    assert cli("--input", src, "--tokenizer", "byte", "--out_dir", out, "--num_proc", "1").returncode == 0
    folder = out / "in"
    os.mkfifo(folder / "train.bin.tmp")
    victim = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "prepare_data.py"),
            "--input",
            str(src),
            "--tokenizer",
            "byte",
            "--out_dir",
            str(out),
            "--num_proc",
            "1",
        ],
        stderr=subprocess.PIPE,
    )
    reader = {}
    opener = threading.Thread(
        target=lambda: reader.setdefault("f", open(folder / "train.bin.tmp", "rb")), daemon=True
    )
    opener.start()
    while opener.is_alive():                          # until prepare_data.py opens train.bin.tmp to write it
        opener.join(0.5)
        if victim.poll() is not None:
            open(folder / "train.bin.tmp", "wb").close()
            pytest.fail(f"prepare_data.py exited first: {victim.communicate()[1]}")
    assert len(reader["f"].read(4096)) == 4096        # it is writing tokens
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=60)
    reader["f"].close()
    assert victim.returncode == -signal.SIGKILL       # killed mid-write, not finished
    assert not (folder / "meta.json").exists()        # deleted before the first token was written
    r = subprocess.run([sys.executable, str(REPO / "train.py"), f"--data_dir={folder}", "--block_size=32",
                        "--vocab_size=320", "--device=cpu"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(
        f"error: no {folder}/meta.json (an interrupted prepare_data.py run left *.tmp files): "
        f"prepare the data first with `python prepare_data.py --input <your files> --name in"
    )
    (folder / "train.bin.tmp").unlink()               # a re-run recovers
    assert cli("--input", src, "--tokenizer", "byte", "--out_dir", out, "--num_proc", "1").returncode == 0
    assert (folder / "meta.json").exists() and not list(folder.glob("*.tmp"))


# ---------------------------------------------------------------------------------------------
# bad input: clear one-line errors, nothing written

@pytest.mark.parametrize("case", ["empty_file", "only_empty_docs", "one_doc", "bad_json", "no_text_field"])
def test_bad_inputs(tmp_path, case):
    src = tmp_path / "in.jsonl"
    content, message = {
        "empty_file": ("", "no non-empty documents in: .*in.jsonl"),
        "only_empty_docs": ('{"text": ""}\n{"text": "  \\n "}\n', "no non-empty documents in: .*in.jsonl"),
        "one_doc": ('{"text": "lonely"}\n', "at least 2"),
        "bad_json": ('{"text": "ok"}\n{"text": \n', "in.jsonl:2"),
        "no_text_field": ('{"content": "x"}\n', "in.jsonl:1: .*'text'"),
    }[case]
    src.write_text(content)
    out = tmp_path / "out"
    with pytest.raises(DataError, match=message) as e:
        main(["--input", str(src), "--tokenizer", "byte", "--out_dir", str(out), "--num_proc", "2"])
    assert "\n" not in str(e.value)
    assert not out.exists() or not any(out.rglob("*.bin*")) and not any(out.rglob("meta.json"))


def test_empty_file_among_good_ones_is_named(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", ["a", "b", "c"])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="empty.jsonl") as e:
        main(["--input", str(good), str(empty), "--tokenizer", "byte", "--out_dir", str(tmp_path / "out")])
    assert "good.jsonl" not in str(e.value)


def test_unknown_extension_and_missing_file(tmp_path):
    (tmp_path / "data.csv").write_text("text\nhello\n")
    with pytest.raises(DataError, match=r"data\.csv.*\.jsonl, \.jsonl\.gz, \.parquet, \.txt"):
        main(["--input", str(tmp_path / "data.csv"), "--tokenizer", "byte", "--out_dir", str(tmp_path / "o")])
    with pytest.raises(DataError, match="not found: .*nope.jsonl"):
        main(
            ["--input", str(tmp_path / "nope.jsonl"), "--tokenizer", "byte", "--out_dir", str(tmp_path / "o")]
        )
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("client", ["urllib", "huggingface_hub"])
def test_download_failure_points_to_input(tmp_path, monkeypatch, client):
    if client == "urllib":
        monkeypatch.setattr(pd, "hf_hub_download", None)
        monkeypatch.setattr(pd, "FINEWEB_URL", "http://127.0.0.1:9/{shard}")  # nothing listens on port 9
    else:
        def fail(*a, **k):
            raise OSError("We couldn't connect to 'https://huggingface.co'")
        monkeypatch.setattr(pd, "hf_hub_download", fail)
    out = tmp_path / "out"
    (out / "fineweb_edu").mkdir(parents=True)
    (out / "fineweb_edu" / "meta.json").write_text("{}")  # an earlier, complete dataset
    with pytest.raises(
        DataError, match="could not download FineWeb-Edu shard sample/10BT/000_00000.parquet"
    ) as e:
        main(["--tokenizer", "byte", "--out_dir", str(out)])
    assert "--input" in str(e.value) and "\n" not in str(e.value)
    # nothing written or removed
    assert sorted(p.name for p in out.rglob("*")) == ["fineweb_edu", "meta.json"]


# ---------------------------------------------------------------------------------------------
# the command line, as a user runs it

def cli(*args):
    return subprocess.run([sys.executable, str(REPO / "prepare_data.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))


def test_cli_pydoc_byte(tmp_path):
    r = cli("--source", "pydoc", "--tokenizer", "byte", "--out_dir", tmp_path)
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "pydoc" / "meta.json").read_text())
    assert meta["train_tokens"] > 400_000 and meta["val_tokens"] > 0 and meta["eot"] == 256
    load_split(tmp_path / "pydoc", "train"), load_split(tmp_path / "pydoc", "val")


@needs_fineweb
@needs_gpt2_cache
def test_cli_fineweb_head_gpt2(tmp_path):
    src = FINEWEB / "fineweb_edu_sample10bt_head.jsonl"
    r = cli("--input", src, "--tokenizer", "gpt2", "--out_dir", tmp_path)
    assert r.returncode == 0, r.stderr
    folder = tmp_path / "fineweb_edu_sample10bt_head"
    meta = json.loads((folder / "meta.json").read_text())
    # SOURCES.md token total + one EOT per doc
    assert meta["train_tokens"] + meta["val_tokens"] == 73_077 + 124
    assert meta["train_docs"] + meta["val_docs"] == 124 and meta["val_docs"] >= 1
    assert load_split(folder, "train").max() == 50256  # ids are real GPT-2 ids, the largest being EOT


def test_cli_error_is_one_line_and_nonzero(tmp_path):
    r = cli("--input", tmp_path / "missing.jsonl", "--tokenizer", "byte", "--out_dir", tmp_path)
    assert r.returncode == 1
    assert (
        r.stderr.strip().startswith("error: input file not found") and len(r.stderr.strip().splitlines()) == 1
    )


# ---------------------------------------------------------------------------------------------
# token data that is not what meta.json says (support/data.py)

REDO = r"re-run `python prepare_data.py --input <your files> --name fox --out_dir .*`$"


def edit_meta(folder, text):
    (folder / "meta.json").write_text(text)


@pytest.mark.parametrize("text, message", [
    ('{"tokenizer": "byte", "vocab_size": 257,', r"cannot read {meta}: not valid JSON \(Expecting property name "
                                                r"enclosed in double quotes: line 1 column 41 \(char 40\)\); "),
    ("[1, 2]", r"{meta} holds a JSON list, not an object of fields; "),
    ('{"tokenizer": "byte", "vocab_size": 257, "dtype": "uint16"}',
     r"{meta} lacks train_tokens, val_tokens: it is incomplete or not from prepare_data.py; "),
    ('{"tokenizer": 2, "vocab_size": 257, "dtype": "uint16", "train_tokens": 6000, "val_tokens": 800}',
     r"{meta}: tokenizer is 2, not a string; "),
    ('{"tokenizer": "byte", "vocab_size": "257", "dtype": "uint16", "train_tokens": 6000, "val_tokens": 800}',
     r"{meta}: vocab_size is '257', not an integer >= 0; "),
    ('{"tokenizer": "byte", "vocab_size": 257, "dtype": "float32", "train_tokens": 6000, "val_tokens": 800}',
     r"{meta}: dtype 'float32' is not an unsigned integer type such as 'uint16' or 'uint32'; "),
    ('{"tokenizer": "byte", "vocab_size": 257, "dtype": "nope", "train_tokens": 6000, "val_tokens": 800}',
     r"{meta}: dtype 'nope' is not an unsigned integer type"),
    ('{"tokenizer": "byte", "vocab_size": 257, "dtype": "uint16", "train_tokens": 6000, "val_tokens": 800, '
     '"max_token_id": -1}', r"{meta}: max_token_id is -1, not an integer >= 0; "),
])
def test_a_broken_or_incomplete_meta_json_is_one_line(tmp_path, text, message):
    folder = tmp_path / "fox"
    write_dataset(folder)
    edit_meta(folder, text)
    with pytest.raises(RunError, match="^" + message.format(meta=folder / "meta.json") + (
            REDO if message.endswith("; ") else "")) as error:
        load_meta(str(folder), 32)
    assert "\n" not in str(error.value)


def test_a_field_the_caller_needs_is_required(tmp_path):
    """train.py reads the tokenizer (needs=("tokenizer",)); probe.py's validation windows do not."""
    folder = tmp_path / "fox"
    write_dataset(folder)
    meta = json.loads((folder / "meta.json").read_text())
    del meta["tokenizer"]
    edit_meta(folder, json.dumps(meta))
    assert load_meta(str(folder), 32)["val_tokens"] == 800
    with pytest.raises(RunError, match=f"^{folder}/meta.json lacks tokenizer: it is incomplete"):
        load_meta(str(folder), 32, needs=("tokenizer",))


def test_token_ids_are_checked_by_a_scan_in_chunks(tmp_path):
    """The fox data holds bytes < 128: it passes for the byte vocabulary (257); a vocabulary of 100 ids is
    refused at the first id >= 100 ('s', 115, at position 5 of "The quick"), found across chunks of 7 tokens;
    a val.bin with one bad id far from the start is named with that position."""
    folder = tmp_path / "fox"
    ids = write_dataset(folder)
    meta = load_meta(str(folder), 32)
    check_token_ids(str(folder), meta, 257, chunk=7)
    first = int(np.argmax(ids >= 100))
    with pytest.raises(RunError, match=rf"^{folder}/train.bin holds token id {ids[first]} at position {first}, but "
                                       rf"the vocabulary has 100 ids \(0 to 99\): the data was not made with the byte "
                                       rf"tokenizer; "):
        check_token_ids(str(folder), meta, 100, chunk=7)
    val = np.fromfile(folder / "val.bin", dtype=np.uint16)
    val[777] = 300
    val.tofile(folder / "val.bin")
    with pytest.raises(RunError, match=rf"^{folder}/val.bin holds token id 300 at position 777, but the vocabulary "
                                       rf"has 257 ids \(0 to 256\)"):
        check_token_ids(str(folder), meta, 257, chunk=7)


def test_token_ids_are_checked_from_meta_json_while_the_files_are_as_recorded(tmp_path):
    """With max_token_id in meta.json and the files' size and mtime as it recorded them, the check reads it and
    not the files: 300 is refused for 257 ids though train.bin holds none above 127, and 127 passes. Once
    val.bin is rewritten (a 300 in it), the files are scanned and the 300 is refused."""
    from prepare_data import bin_fingerprints
    folder = tmp_path / "fox"
    write_dataset(folder)
    meta = json.loads((folder / "meta.json").read_text()) | {"files": bin_fingerprints(folder)}
    edit_meta(folder, json.dumps(meta | {"max_token_id": 300}))
    with pytest.raises(RunError, match=rf"^{folder}/meta.json records max_token_id 300, but the vocabulary has 257 "
                                       rf"ids \(0 to 256\)"):
        check_token_ids(str(folder), load_meta(str(folder), 32), 257)
    edit_meta(folder, json.dumps(meta | {"max_token_id": 127}))
    check_token_ids(str(folder), load_meta(str(folder), 32), 257)
    val = np.fromfile(folder / "val.bin", dtype=np.uint16)
    val[0] = 300
    time.sleep(0.01)
    val.tofile(folder / "val.bin")
    with pytest.raises(RunError, match=r"val\.bin holds token id 300 at position 0"):
        check_token_ids(str(folder), load_meta(str(folder), 32), 257)


def test_get_batch_refuses_a_file_rewritten_since_load_meta(tmp_path):
    """A batch reads the file load_meta checked; after train.bin is cut short, or rewritten with the same
    size, the next batch is one line naming the file; load_meta again accepts the new file."""
    folder = tmp_path / "fox"
    ids = write_dataset(folder)
    load_meta(str(folder), 32)
    path = str(folder / "train.bin")
    x, y = get_batch(path, np.uint16, [0, 10], 32, "cpu")
    assert x[1].tolist() == ids[10:42].tolist() and y[1].tolist() == ids[11:43].tolist()
    ids[:3000].tofile(path)
    with pytest.raises(RunError, match=rf"^{path} changed since the run checked it \(12000 bytes then, 6000 now\): "):
        get_batch(path, np.uint16, [0], 32, "cpu")
    edit_meta(folder, json.dumps(json.loads((folder / "meta.json").read_text()) | {"train_tokens": 3000}))
    load_meta(str(folder), 32)
    assert get_batch(path, np.uint16, [5], 32, "cpu")[0][0].tolist() == ids[5:37].tolist()
    replacement = folder / "train.bin.new"
    ids[1:3001].tofile(replacement)
    os.replace(replacement, path)                   # what a prepare_data.py run does: the same size, new data
    with pytest.raises(RunError, match=r"changed since the run checked it \(the same size, but rewritten or "
                                       r"replaced\)"):
        get_batch(path, np.uint16, [0], 32, "cpu")
