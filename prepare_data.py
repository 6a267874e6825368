"""
Turn text into the token files train.py reads: out_dir/NAME/{train.bin, val.bin, meta.json}.

    python prepare_data.py                                   # FineWeb-Edu sample-10BT (needs internet)
    python prepare_data.py --max_tokens 100_000_000          # ... only the first 100M tokens
    python prepare_data.py --source pydoc --tokenizer byte   # CPU quick start, works on any machine
    python prepare_data.py --input a.jsonl b.parquet --name mydata   # local files, offline

Layout (as in nanoGPT / build-nanogpt): each .bin file is a flat array of token ids (np.uint16 when the
vocabulary fits, else np.uint32; see meta.json "dtype"), with one EOT token after every document.
train.py memmaps the files and checks that each file's size equals tokens * itemsize from meta.json.
FineWeb-Edu shards are downloaded one by one into OUT_DIR/fineweb_edu_parquet/ and kept for re-runs
(sample-10BT: 14 shards, tens of GB; --max_tokens stops early, within the first shard for <~1B tokens).

Design choices, each tested in test_data.py:
- The train/val split is decided per whole document by a hash of its text, so it does not depend on
  the order of the input, the number of processes or how much was downloaded (modded-nanogpt keeps a
  fixed val set for the same reason). val is never empty: if no document hashes into it, the document
  with the smallest hash is moved there.
- Empty or whitespace-only documents are skipped, so they never produce a stray EOT.
- Token ids are checked against the vocabulary before they are stored: a uint16 file never wraps.
- Outputs are atomic: the old meta.json is deleted first, the .bin files are written as *.tmp and
  renamed, meta.json is written last. An interrupted run leaves nothing train.py accepts.
- Output is identical for any --num_proc (Pool.imap keeps the input order).
"""

import argparse
import gzip
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import sys
import urllib.request
from pathlib import Path

import numpy as np
from tqdm import tqdm

try:  # optional: the Hugging Face client (resumable downloads, HF cache); plain urllib otherwise
    from huggingface_hub import hf_hub_download
except ImportError:
    hf_hub_download = None

# FineWeb-Edu sample-10BT: 14 parquet shards in the HF dataset repo (columns: text, id, url, ...).
FINEWEB_REPO = "HuggingFaceFW/fineweb-edu"
FINEWEB_SHARDS = [f"sample/10BT/{i:03d}_00000.parquet" for i in range(14)]
FINEWEB_URL = "https://huggingface.co/datasets/HuggingFaceFW/fineweb-edu/resolve/main/{shard}"

INPUT_EXTENSIONS = (".jsonl", ".jsonl.gz", ".parquet", ".txt")
DOCS_PER_CHUNK = 64  # documents per task sent to a worker (the unit of encode_batch)


class DataError(ValueError):
    """A problem with the inputs or the environment; the CLI prints it as one line and exits non-zero."""


# ---------------------------------------------------------------------------------------------
# Tokenizers. sample.py uses the same helper: `from prepare_data import get_tokenizer`.

class ByteTokenizer:
    """UTF-8 bytes as tokens 0..255 plus EOT = 256. Needs no files; suits CPU-scale runs and tests."""

    name = "byte"
    eot = 256
    vocab_size = 257

    def encode(self, text):
        """str -> list[int] of UTF-8 byte values (no EOT)."""
        return list(text.encode("utf-8"))

    def encode_batch(self, texts, num_threads=None):
        """list[str] -> list[list[int]]; num_threads is accepted for symmetry with tiktoken and ignored."""
        return [list(t.encode("utf-8")) for t in texts]

    def decode(self, ids):
        """list[int] -> str. EOT becomes "<|endoftext|>" (as with GPT-2); invalid UTF-8 becomes U+FFFD.

        Raises ValueError for an id outside [0, vocab_size)."""
        parts, run = [], bytearray()
        for i in ids:
            i = int(i)
            if i == self.eot:
                parts.append(run.decode("utf-8", errors="replace") + "<|endoftext|>")
                run = bytearray()
            elif 0 <= i < 256:
                run.append(i)
            else:
                raise ValueError(f"token id {i} is outside the byte vocabulary [0, {self.vocab_size})")
        parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)


class TiktokenTokenizer:
    """GPT-2 BPE via tiktoken (vocab 50257, EOT 50256). Encodes "ordinary" text: special-token strings
    such as "<|endoftext|>" inside a document are encoded as plain text, never as the EOT id."""

    def __init__(self, encoding):
        self._enc = encoding
        self.name = "gpt2"
        self.eot = encoding.eot_token
        self.vocab_size = encoding.n_vocab

    def encode(self, text):
        """str -> list[int] (no special tokens, no EOT)."""
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts, num_threads=8):
        """list[str] -> list[list[int]], encoded on num_threads threads (tiktoken's default is 8)."""
        return self._enc.encode_ordinary_batch(texts, num_threads=num_threads)

    def decode(self, ids):
        """list[int] -> str; bytes that are not valid UTF-8 become U+FFFD. Raises for id >= vocab_size."""
        return self._enc.decode([int(i) for i in ids], errors="replace")


class HFTokenizer:
    """A released model's own tokenizer (its tokenizer.json) through the `tokenizers` library, named
    "hf:<hub id or folder>". EOT is the model's end-of-text token: tokenizer_config.json's eos_token, else
    config.json's eos_token_id. Encodes ordinary text, with no special tokens added (no BOS)."""

    def __init__(self, name, tokenizer, eot):
        self.name, self._tok, self.eot = name, tokenizer, eot
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text):
        """str -> list[int] (no special tokens, no EOT)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts, num_threads=None):
        """list[str] -> list[list[int]]; the library parallelises by itself (num_threads is ignored)."""
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids):
        """list[int] -> str, special tokens (e.g. the EOT) included as text."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def hf_tokenizer(name):
    """HFTokenizer for "hf:<hub id or folder>": tokenizer.json (and tokenizer_config.json / config.json for
    the EOS) from a local folder, or from the hub through huggingface_hub. Raises DataError naming what is
    missing."""
    source = name[3:]
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DataError(
            f"the tokenizer {name!r} needs the tokenizers library: pip install tokenizers"
        ) from None
    folder = Path(source)
    if not folder.is_dir():                         # a hub id: fetch the three small files in one call
        try:
            from huggingface_hub import snapshot_download
        except ImportError:
            raise DataError(f"{source!r} is not a local folder, and fetching it from the hub needs "
                            f"huggingface_hub: pip install huggingface_hub") from None
        try:
            folder = Path(snapshot_download(source, allow_patterns=["tokenizer.json", "tokenizer_config.json",
                                                                    "config.json"]))
        # offline, unknown repo: reported below as no tokenizer.json
        except Exception:
            pass
    files = {file: folder / file for file in ("tokenizer.json", "tokenizer_config.json", "config.json")
             if (folder / file).is_file()}
    if "tokenizer.json" not in files:
        where = (
            "the folder"
            if Path(source).is_dir()
            else "no local folder of that name, and the hub did not provide it"
        )
        raise DataError(
            f"no tokenizer.json for {source!r} ({where}): give a folder holding tokenizer.json, or a hub id "
            f"(online)"
        )
    tokenizer = Tokenizer.from_file(str(files["tokenizer.json"]))
    eos = None
    if "tokenizer_config.json" in files:
        eos = json.loads(files["tokenizer_config.json"].read_text()).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
    eot = tokenizer.token_to_id(eos) if eos else None
    if eot is None and "config.json" in files:
        eot = json.loads(files["config.json"].read_text()).get("eos_token_id")
    if not isinstance(eot, int):
        raise DataError(
            f"{source!r} names no end-of-text token: tokenizer_config.json has no eos_token in the "
            f"vocabulary, and config.json no eos_token_id"
        )
    return HFTokenizer(name, tokenizer, eot)


def get_tokenizer(name):
    """Return the tokenizer called `name`: "gpt2" (tiktoken), "byte" (UTF-8 bytes) or "hf:<hub id or folder>"
    (a released model's own tokenizer.json, see hf_tokenizer).

    The object has .name, .vocab_size, .eot (ints), .encode(str) -> list[int],
    .encode_batch(list[str]) -> list[list[int]] and .decode(list[int]) -> str.
    Raises DataError for an unknown name, a missing tiktoken package, or when tiktoken cannot get the
    GPT-2 vocabulary files (no network): the message says to set TIKTOKEN_CACHE_DIR.
    """
    if name == "byte":
        return ByteTokenizer()
    if name.startswith("hf:") and len(name) > 3:
        return hf_tokenizer(name)
    if name != "gpt2":
        raise DataError(f"unknown tokenizer {name!r}; choose 'gpt2', 'byte' or 'hf:<hub id or folder>'")
    try:
        import tiktoken
    except ImportError:
        raise DataError("the gpt2 tokenizer needs tiktoken: pip install tiktoken (or use --tokenizer byte)")
    try:
        encoding = tiktoken.get_encoding("gpt2")
    except Exception as e:  # offline, tiktoken fails with a requests ConnectionError to its file host
        cache = os.environ.get("TIKTOKEN_CACHE_DIR", "<unset>")
        reason = " ".join(str(e).split())[:160]
        raise DataError(
            "tiktoken could not load the gpt2 vocabulary (offline?): set TIKTOKEN_CACHE_DIR to the "
            "absolute path "
            "of a folder holding the cached files, e.g. shared/tiktoken_cache (now "
            f"TIKTOKEN_CACHE_DIR={cache}), "
            f"or use --tokenizer byte [{type(e).__name__}: {reason}]"
        ) from e
    return TiktokenTokenizer(encoding)


def storage_dtype(vocab_size):
    """np.uint16 when every id (0 .. vocab_size-1) fits in 16 bits, else np.uint32."""
    return np.uint16 if vocab_size <= 2**16 else np.uint32


# ---------------------------------------------------------------------------------------------
# Document sources. Each reader yields the documents of one source as str, in file order.

def read_input_file(path):
    """Yield the documents (str) of one local file.

    .jsonl / .jsonl.gz: one JSON object per line, the document is its "text" field (blank lines skipped).
    .parquet: the "text" column (needs pyarrow).  .txt: the whole file is one document.
    Raises DataError for an unknown extension, a missing "text" field/column, bad JSON or bad UTF-8.
    """
    path = Path(path)
    kind = input_kind(path)
    try:
        if kind in (".jsonl", ".jsonl.gz"):
            opener = gzip.open if kind == ".jsonl.gz" else open
            with opener(path, "rt", encoding="utf-8") as f:
                for line_no, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        yield json.loads(line)["text"]
                    except (json.JSONDecodeError, KeyError, TypeError) as e:
                        raise DataError(
                            f"{path}:{line_no}: expected a JSON object with a 'text' field ({e!r})"
                        )
        elif kind == ".parquet":
            yield from read_parquet_texts(path)
        else:  # .txt
            yield path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not valid UTF-8 ({e})")
    except (OSError, EOFError) as e:  # includes a truncated or corrupt .gz
        raise DataError(f"{path}: cannot read ({e})")


def input_kind(path):
    """Return which of INPUT_EXTENSIONS `path` has; raises DataError naming the file otherwise."""
    name = str(path).lower()
    for ext in sorted(INPUT_EXTENSIONS, key=len, reverse=True):  # ".jsonl.gz" before ".jsonl"
        if name.endswith(ext):
            return ext
    raise DataError(f"unsupported input file {path}: extension must be one of {', '.join(INPUT_EXTENSIONS)}")


def read_parquet_texts(path):
    """Yield the "text" column of a parquet file, batch by batch (never the whole file in memory)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(
            "reading parquet (FineWeb-Edu or --input *.parquet) needs pyarrow: pip install pyarrow"
        )
    try:
        parquet = pq.ParquetFile(path)
        if "text" not in parquet.schema_arrow.names:
            raise DataError(f"{path}: no 'text' column (columns: {', '.join(parquet.schema_arrow.names)})")
        for batch in parquet.iter_batches(batch_size=1024, columns=["text"]):
            yield from batch.column(0).to_pylist()
    except DataError:
        raise
    except Exception as e:  # pyarrow raises its own error types for corrupt files
        raise DataError(f"{path}: cannot read parquet ({type(e).__name__}: {e})")


def read_pydoc():
    """Yield the topics of the Python reference manual shipped with CPython (pydoc_data.topics),
    one document per topic, sorted by topic name. ~465 KB of English text; needs nothing else."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise DataError(
            "this Python has no pydoc_data module (some distributions strip it); use --input FILE"
        )
    for key in sorted(topics):
        yield topics[key]


def download_fineweb_shard(shard, dest_dir):
    """Download one FineWeb-Edu parquet shard (e.g. "sample/10BT/000_00000.parquet") unless it is
    already in dest_dir; return its local path. Uses huggingface_hub when installed, else urllib.
    Raises DataError (one line, pointing to --input) when the download fails."""
    url = FINEWEB_URL.format(shard=shard)
    try:
        if hf_hub_download is not None:
            return Path(hf_hub_download(FINEWEB_REPO, shard, repo_type="dataset", local_dir=dest_dir))
        dest = Path(dest_dir) / shard
        if not dest.exists():
            part = dest.with_name(dest.name + ".part")
            # nothing is created before this succeeds
            with urllib.request.urlopen(url, timeout=60) as response:
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    with open(part, "wb") as f:
                        while block := response.read(1 << 20):
                            f.write(block)
                except BaseException:
                    part.unlink(missing_ok=True)
                    raise
            os.replace(part, dest)
        return dest
    except Exception as e:
        reason = " ".join(str(e).split())[:200]
        raise DataError(
            f"could not download FineWeb-Edu shard {shard} from {url} ({type(e).__name__}: {reason}); "
            f"without internet, use local files instead: "
            f"python prepare_data.py --input FILE.jsonl|.jsonl.gz|.parquet|.txt"
        ) from e


def read_fineweb_shard(shard, dest_dir):
    """Download (if needed) and yield the documents of one FineWeb-Edu shard."""
    yield from read_parquet_texts(download_fineweb_shard(shard, dest_dir))


# ---------------------------------------------------------------------------------------------
# Tokenization (runs in the worker processes)

_worker = {}  # per-process state: the tokenizer and how many tiktoken threads to use


def _init_worker(tokenizer_name, num_threads):
    """Pool initializer: load the tokenizer once per worker process."""
    _worker["tokenizer"] = get_tokenizer(tokenizer_name)
    _worker["num_threads"] = num_threads


def _tokenize_chunk(chunk):
    """(source_index, texts) -> (source_index, tokens, doc_lens, hashes); see tokenize_documents."""
    source_index, texts = chunk
    return (source_index, *tokenize_documents(_worker["tokenizer"], texts, _worker["num_threads"]))


def doc_hashes(texts):
    """Deterministic 64-bit hash of each document's UTF-8 text (blake2b): np.uint64 array, shape (n_docs,).
    hash / 2**64 is uniform in [0, 1); the split rule compares it with val_fraction."""
    return np.array(
        [int.from_bytes(hashlib.blake2b(t.encode("utf-8"), digest_size=8).digest(), "little") for t in texts],
        dtype=np.uint64,
    )


def tokenize_documents(tokenizer, texts, num_threads=8):
    """Encode non-empty documents and append one EOT to each.

    Returns (tokens, doc_lens, hashes): tokens is a 1-D array of storage_dtype(vocab_size) holding all
    documents back to back, doc_lens (np.int64, shape (n_docs,)) counts each document's tokens including
    its EOT, hashes come from doc_hashes(). Raises DataError if an id is >= vocab_size (it would wrap).
    """
    token_lists = tokenizer.encode_batch(texts, num_threads=num_threads)
    for toks in token_lists:
        # EOT placement: one EOT *after* each document, so each one is terminated (build-nanogpt prepends).
        toks.append(tokenizer.eot)
    doc_lens = np.array([len(toks) for toks in token_lists], dtype=np.int64)
    flat = itertools.chain.from_iterable(token_lists)
    tokens = np.fromiter(flat, dtype=np.int64, count=int(doc_lens.sum()))  # one C-level pass over the ids
    return to_storage(tokens, tokenizer.vocab_size), doc_lens, doc_hashes(texts)


def to_storage(tokens, vocab_size):
    """Cast token ids to storage_dtype(vocab_size) after checking 0 <= id < vocab_size, so a uint16 file can
    never hold a wrapped id. tokens: integer array. Raises DataError naming the offending id."""
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        bad = tokens.max() if tokens.max() >= vocab_size else tokens.min()
        dtype = np.dtype(storage_dtype(vocab_size)).name
        raise DataError(f"token id {bad} is outside the vocabulary [0, {vocab_size}); "
                        f"it would be stored wrongly as {dtype}")
    return tokens.astype(storage_dtype(vocab_size))


# ---------------------------------------------------------------------------------------------
# The pipeline: documents -> chunks -> worker processes -> train/val files

def iter_chunks(sources):
    """Yield (source_index, [doc, ...]) chunks of at most DOCS_PER_CHUNK non-empty documents, never mixing
    sources. Each source ends with an empty chunk, so the consumer knows, in order, when it was fully read.
    Raises DataError for a document that is not a str."""
    for source_index, (name, documents) in enumerate(sources):
        chunk = []
        for text in documents:
            if text is None:  # a null in a parquet column
                continue
            if not isinstance(text, str):
                raise DataError(f"{name}: a document is {type(text).__name__}, not str")
            if text.isspace() or not text:
                continue  # empty documents are dropped here: they must not produce a lone EOT
            chunk.append(text)
            if len(chunk) == DOCS_PER_CHUNK:
                yield source_index, chunk
                chunk = []
        if chunk:
            yield source_index, chunk
        yield source_index, []


class SplitWriter:
    """Appends tokenized documents to out_dir/train.bin.tmp or val.bin.tmp, each whole document routed by
    its hash, and keeps the counts that go into meta.json. commit() renames the files to *.bin;
    cleanup() deletes whatever *.tmp is left (after an error)."""

    def __init__(self, out_dir, dtype, val_fraction):
        self.dtype = dtype
        self.threshold = np.uint64(int(val_fraction * 2**64))  # to val when hash < val_fraction * 2**64
        self.paths = {split: out_dir / f"{split}.bin" for split in ("train", "val")}
        self.tmp = {split: out_dir / f"{split}.bin.tmp" for split in ("train", "val")}
        self.files = {split: open(path, "wb") for split, path in self.tmp.items()}
        self.tokens = {"train": 0, "val": 0}
        self.docs = {"train": 0, "val": 0}
        # The smallest hash seen in train and where its document(s) are: (token offset, token count).
        self.smallest_hash, self.smallest_docs = None, []

    def add(self, tokens, doc_lens, hashes):
        """Write one chunk: tokens (1-D, self.dtype), doc_lens (tokens per document incl. EOT), hashes."""
        is_val = hashes < self.threshold
        token_is_val = np.repeat(is_val, doc_lens)  # each document's decision, repeated over its tokens
        train_lens, train_hashes = doc_lens[~is_val], hashes[~is_val]
        if len(train_hashes) and (self.smallest_hash is None or train_hashes.min() <= self.smallest_hash):
            h = train_hashes.min()
            starts = self.tokens["train"] + np.cumsum(train_lens) - train_lens
            found = list(zip(starts[train_hashes == h].tolist(), train_lens[train_hashes == h].tolist()))
            self.smallest_docs = (self.smallest_docs if h == self.smallest_hash else []) + found
            self.smallest_hash = h
        self.files["train"].write(tokens[~token_is_val].tobytes())
        self.files["val"].write(tokens[token_is_val].tobytes())
        self.tokens["train"] += int(train_lens.sum())
        self.tokens["val"] += int(doc_lens[is_val].sum())
        self.docs["train"] += len(train_lens)
        self.docs["val"] += int(is_val.sum())

    def commit(self):
        """Make sure val is not empty, check the file sizes, and rename *.bin.tmp to *.bin."""
        for f in self.files.values():
            f.close()
        if self.docs["val"] == 0 and self.smallest_docs:
            # No document hashed into val (likely with few documents): move the smallest-hash one(s) there.
            moved = move_to_val(self.tmp["train"], self.tmp["val"], self.dtype, self.smallest_docs)
            self.tokens["train"] -= moved
            self.tokens["val"] += moved
            self.docs["train"] -= len(self.smallest_docs)
            self.docs["val"] += len(self.smallest_docs)
        if self.docs["train"] == 0:
            raise DataError(
                "every document landed in val (they are all copies of one text); add more documents"
            )
        for split in ("train", "val"):
            size = self.tmp[split].stat().st_size
            assert size == self.tokens[split] * np.dtype(self.dtype).itemsize, f"{split}: {size} bytes"
            os.replace(self.tmp[split], self.paths[split])

    def cleanup(self):
        """Close and delete the *.tmp files if they are still there."""
        for split, f in self.files.items():
            f.close()
            self.tmp[split].unlink(missing_ok=True)


def prepare(sources, tokenizer, out_dir, val_fraction=0.005, max_tokens=None, num_proc=1):
    """Tokenize `sources` into out_dir/{train.bin, val.bin, meta.json} and return the meta dict.

    sources: list of (description, iterable of str documents). tokenizer: from get_tokenizer().
    max_tokens: stop before the first document that would take train+val past this many tokens
    (EOTs included; None = read everything). num_proc: worker processes (1 = tokenize in this process).
    Raises DataError when a source has no non-empty document, when fewer than 2 documents remain, or for
    bad token ids. On any error the old meta.json is gone and no new output file is left behind.
    """
    if not 0 < val_fraction < 1:
        raise DataError(f"--val_fraction must be in (0, 1), got {val_fraction}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # First of all, remove the old meta.json: until the new one is written, train.py refuses this folder.
    (out_dir / "meta.json").unlink(missing_ok=True)
    dtype = storage_dtype(tokenizer.vocab_size)
    writer = SplitWriter(out_dir, dtype, val_fraction)
    docs_per_source = [0] * len(sources)
    finished = [False] * len(sources)
    total, stopped_early = 0, False
    pool = None
    try:
        if num_proc > 1:
            # Each task is a chunk of documents for one encode_batch call, so imap's own chunksize stays 1.
            # imap returns results in input order: the output does not depend on num_proc.
            # (Its feeder thread reads ahead; after an early stop it may still finish a shard download.)
            pool = mp.Pool(num_proc, initializer=_init_worker, initargs=(tokenizer.name, 1))
            results = pool.imap(_tokenize_chunk, iter_chunks(sources))
        else:  # same code path, in this process, with tiktoken's own threads
            _worker.update(tokenizer=tokenizer, num_threads=8)
            results = map(_tokenize_chunk, iter_chunks(sources))
        with tqdm(total=max_tokens, unit="tok", unit_scale=True, desc="tokenizing", disable=None) as bar:
            for source_index, tokens, doc_lens, hashes in results:
                if len(doc_lens) == 0:  # the end-of-source marker from iter_chunks
                    finished[source_index] = True
                    continue
                if max_tokens is not None and total + len(tokens) > max_tokens:
                    keep = np.searchsorted(np.cumsum(doc_lens), max_tokens - total, side="right")
                    tokens, doc_lens, hashes = tokens[: doc_lens[:keep].sum()], doc_lens[:keep], hashes[:keep]
                    stopped_early = True
                writer.add(tokens, doc_lens, hashes)
                docs_per_source[source_index] += len(doc_lens)
                total += len(tokens)
                bar.update(len(tokens))
                if stopped_early:
                    break
        # Checks with clear messages, before anything final is written.
        empty = [name for (name, _), done, n in zip(sources, finished, docs_per_source) if done and n == 0]
        if empty:
            raise DataError(f"no non-empty documents in: {', '.join(empty)}")
        if sum(docs_per_source) < 2:
            raise DataError(f"need at least 2 non-empty documents (one for train, one for val), found "
                            f"{sum(docs_per_source)} in: {', '.join(name for name, _ in sources)}")
        writer.commit()
        meta = {
            "tokenizer": tokenizer.name,
            "vocab_size": tokenizer.vocab_size,
            "eot": tokenizer.eot,
            "dtype": np.dtype(dtype).name,
            "train_tokens": writer.tokens["train"],
            "val_tokens": writer.tokens["val"],
            "train_docs": writer.docs["train"],
            "val_docs": writer.docs["val"],
            "sources": [name for (name, _), n in zip(sources, docs_per_source) if n > 0],
            "split": (
                "a document goes to val when blake2b-64(its UTF-8 text) / 2**64 < val_fraction, else to "
                "train; if no document does, the one(s) with the smallest hash go to val"
            ),
            "val_fraction": val_fraction,
            "layout": "documents in input order, one EOT token after each; empty documents skipped",
            "max_tokens": max_tokens,
        }
        write_meta(out_dir / "meta.json", meta)  # last: from here on train.py accepts the folder
        return meta
    finally:
        if pool is not None:
            pool.terminate()
        writer.cleanup()


def move_to_val(train_path, val_path, dtype, segments):
    """Move the documents at `segments` ([(token offset, token count), ...] sorted by offset) from the
    train file to the end of the val file, rewriting the train file without them. Returns tokens moved."""
    train = np.memmap(train_path, dtype=dtype, mode="r")
    rewritten = train_path.with_name(train_path.name + ".rewrite")
    try:
        with open(val_path, "ab") as f_val, open(rewritten, "wb") as f_train:
            start = 0
            for offset, length in segments:
                f_train.write(train[start:offset].tobytes())
                f_val.write(train[offset:offset + length].tobytes())
                start = offset + length
            f_train.write(train[start:].tobytes())
        del train  # close the memmap before replacing the file
        os.replace(rewritten, train_path)
    finally:
        rewritten.unlink(missing_ok=True)
    return sum(length for _, length in segments)


def write_meta(path, meta):
    """Write meta (a JSON-able dict) to path atomically: path.tmp, then os.replace."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# Command line

def parse_args(argv=None):
    """Parse the command line (argv: list[str], default sys.argv[1:]) into an argparse.Namespace."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    p.add_argument("--source", choices=["fineweb-edu", "pydoc"], default=None,
                   help="built-in source (fineweb-edu when neither --source nor --input is given)")
    p.add_argument("--input", nargs="+", default=None, metavar="FILE",
                   help=f"local files instead of a built-in source ({', '.join(INPUT_EXTENSIONS)}); "
                        f"jsonl/parquet use the 'text' field, a .txt file is one document")
    p.add_argument(
        "--tokenizer",
        default="gpt2",
        help="gpt2 (tiktoken, the default), byte, or hf:<hub id or folder> "
        "(a released model's tokenizer.json, e.g. hf:HuggingFaceTB/SmolLM2-135M)",
    )
    p.add_argument("--name", default=None,
                   help="dataset folder name (default: fineweb_edu, pydoc, or the first --input file's stem)")
    p.add_argument("--out_dir", default="data", help="outputs go to OUT_DIR/NAME/ (default: data)")
    p.add_argument("--max_tokens", type=int, default=None,
                   help="stop before the document that would exceed this many tokens (default: everything)")
    p.add_argument(
        "--val_fraction",
        type=float,
        default=None,
        help="expected fraction of documents in val (default 0.005; 0.05 for pydoc, whose 79 documents "
        "would otherwise leave one ~800-token topic, shorter than a 1024-token context)",
    )
    p.add_argument(
        "--num_proc",
        type=int,
        default=min(os.cpu_count() or 1, 8),
        help="tokenizer processes (default: min(cpu count, 8))",
    )
    return p.parse_args(argv)


def main(argv=None):
    """Run the command line (argv as for parse_args) and return the meta dict. Raises DataError."""
    args = parse_args(argv)
    if args.input and args.source:
        raise DataError("give either --source or --input, not both")
    if args.input:
        for path in args.input:  # check every file before any work
            input_kind(path)
            if not Path(path).is_file():
                raise DataError(f"input file not found: {path}")
        # before the old meta.json is deleted: a bad input must leave the old dataset usable.
        for path in args.input:
            # any() stops at the first non-empty document, so only an empty file is read to its end here.
            if not any(isinstance(text, str) and text.strip() for text in read_input_file(path)):
                raise DataError(f"no non-empty documents in: {path}")
    # fails early (e.g. no vocabulary files) before touching outputs
    tokenizer = get_tokenizer(args.tokenizer)
    if args.input:
        first = Path(args.input[0]).name
        name = args.name or first[: len(first) - len(input_kind(first))]  # "a/b.jsonl.gz" -> "b"
        sources = [(str(path), read_input_file(path)) for path in args.input]
    elif args.source == "pydoc":
        name = args.name or "pydoc"
        sources = [(f"pydoc_data.topics (Python {sys.version.split()[0]})", read_pydoc())]
    else:
        name = args.name or "fineweb_edu"
        cache = Path(args.out_dir) / "fineweb_edu_parquet"
        download_fineweb_shard(FINEWEB_SHARDS[0], cache)  # fail now, before the output folder is touched
        sources = [(f"{FINEWEB_REPO}/{shard}", read_fineweb_shard(shard, cache)) for shard in FINEWEB_SHARDS]
    val_fraction = args.val_fraction
    if val_fraction is None:
        val_fraction = 0.05 if args.source == "pydoc" else 0.005
    out_dir = Path(args.out_dir) / name
    meta = prepare(sources, tokenizer, out_dir, val_fraction, args.max_tokens, max(1, args.num_proc))
    print(f"wrote {out_dir}/train.bin ({meta['train_tokens']:,} tokens, {meta['train_docs']:,} docs), "
          f"val.bin ({meta['val_tokens']:,} tokens, {meta['val_docs']:,} docs), meta.json [{meta['dtype']}]")
    return meta


if __name__ == "__main__":  # the guard matters: worker processes import this file
    try:
        main()
    except DataError as e:
        sys.exit(f"error: {e}")
