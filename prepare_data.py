"""
Turn text into the token files train.py reads, OUT_DIR/NAME/{train,val}.bin and meta.json
(their layout and what they guarantee: docs/data.md).

    python prepare_data.py                                  # FineWeb-Edu sample-10BT (online)
    python prepare_data.py --max_tokens 100_000_000         # ... only the first 100M tokens
    python prepare_data.py --source pydoc --tokenizer byte  # CPU quick start, works on any machine
    python prepare_data.py --input a.jsonl b.parquet --name mydata  # local files, offline
"""

import argparse
import gzip
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import shutil
import sys
import urllib.request
from pathlib import Path

import numpy as np
from tqdm import tqdm

from support.process import keeps_process_state
from support.tokenizers import DataError, get_tokenizer

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
SPLIT_RULE = ("a document goes to val when blake2b-64(its UTF-8 text) / 2**64 < val_fraction, "
              "else to train; if no document does, the one(s) with the smallest hash go to val")
LAYOUT = "documents in input order, one EOT token after each; empty documents skipped"
_worker = {}  # per-process state of the tokenizing: the tokenizer and how many threads it uses


def input_kind(path):
    for ext in INPUT_EXTENSIONS:
        if str(path).lower().endswith(ext):
            return ext
    raise DataError(f"unsupported input file {path}: extension must be one of {', '.join(INPUT_EXTENSIONS)}")


def read_input_file(path):
    """The "text" of each .jsonl(.gz) line or .parquet row, or a whole .txt; DataError if bad."""
    path, kind = Path(path), input_kind(path)
    try:
        if kind == ".parquet":
            yield from read_parquet_texts(path)
        elif kind == ".txt":
            yield path.read_text(encoding="utf-8")
        else:
            with (gzip.open if kind == ".jsonl.gz" else open)(path, "rt", encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    try:
                        if line.strip():
                            yield json.loads(line)["text"]
                    except (json.JSONDecodeError, KeyError, TypeError) as e:
                        raise DataError(f"{path}:{n}: expected a JSON object with a 'text' field ({e!r})")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not valid UTF-8 ({e})")
    except (OSError, EOFError) as e:  # includes a truncated or corrupt .gz
        raise DataError(f"{path}: cannot read ({e})")


def read_parquet_texts(path):
    """The "text" column of a parquet file, batch by batch (never the whole file in memory)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError("reading parquet (FineWeb-Edu or --input *.parquet) needs pyarrow: pip install pyarrow")
    try:
        parquet = pq.ParquetFile(path)
        if "text" in parquet.schema_arrow.names:
            for batch in parquet.iter_batches(batch_size=1024, columns=["text"]):
                yield from batch.column(0).to_pylist()
            return
    except Exception as e:  # pyarrow raises its own error types for corrupt files
        raise DataError(f"{path}: cannot read parquet ({type(e).__name__}: {e})")
    raise DataError(f"{path}: no 'text' column (columns: {', '.join(parquet.schema_arrow.names)})")


def read_pydoc():
    """The topics of the Python manual shipped with CPython, by name: ~465 KB of English."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise DataError("this Python has no pydoc_data module (some distributions strip it); use --input FILE")
    yield from (topics[key] for key in sorted(topics))


def read_fineweb_shard(shard, cache):
    yield from read_parquet_texts(download_fineweb_shard(shard, cache))


def download_fineweb_shard(shard, cache):
    """The local path of a FineWeb-Edu shard, downloaded into the folder cache if not there."""
    url, dest, part = FINEWEB_URL.format(shard=shard), Path(cache) / shard, Path(cache) / f"{shard}.part"
    try:
        if hf_hub_download is not None:
            return Path(hf_hub_download(FINEWEB_REPO, shard, repo_type="dataset", local_dir=cache))
        if not dest.exists():
            with urllib.request.urlopen(url, timeout=60) as response:  # nothing made if it fails
                dest.parent.mkdir(parents=True, exist_ok=True)
                with open(part, "wb") as f:
                    shutil.copyfileobj(response, f, 1 << 20)
            os.replace(part, dest)
        return dest
    except Exception as e:
        reason = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
        raise DataError(f"could not download FineWeb-Edu shard {shard} from {url} ({reason}); without internet, "
                        "use local files: python prepare_data.py --input FILE.jsonl|.jsonl.gz|.parquet|.txt") from e
    finally:
        part.unlink(missing_ok=True)  # what an interrupted download left


def _init_worker(tokenizer_name, num_threads):
    _worker.update(tokenizer=get_tokenizer(tokenizer_name), num_threads=num_threads)


def _tokenize_chunk(chunk):
    """(source_index, the texts' tokens, one EOT after each, their token counts, their hashes)."""
    (source_index, texts), tokenizer = chunk, _worker["tokenizer"]
    token_lists = tokenizer.encode_batch(texts, num_threads=_worker["num_threads"])
    flat = itertools.chain.from_iterable(itertools.chain(t, [tokenizer.eot]) for t in token_lists)
    doc_lens = np.array([len(t) + 1 for t in token_lists], dtype=np.int64)  # with the EOT after
    tokens = np.fromiter(flat, dtype=np.int64, count=int(doc_lens.sum()))  # one C-level pass
    digests = (hashlib.blake2b(t.encode("utf-8"), digest_size=8).digest() for t in texts)
    hashes = np.array([int.from_bytes(d, "little") for d in digests], dtype=np.uint64)
    return source_index, to_storage(tokens, tokenizer.vocab_size), doc_lens, hashes


def storage_dtype(vocab_size):
    return np.uint16 if vocab_size <= 2**16 else np.uint32


def to_storage(tokens, vocab_size):
    """tokens as storage_dtype(vocab_size) if 0 <= id < vocab_size: a uint16 file never wraps."""
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        bad = tokens.max() if tokens.max() >= vocab_size else tokens.min()
        raise DataError(f"token id {bad} is outside the vocabulary [0, {vocab_size}); it would "
                        f"be stored wrongly as {np.dtype(storage_dtype(vocab_size)).name}")
    return tokens.astype(storage_dtype(vocab_size))


def iter_chunks(sources):
    """(source_index, texts): up to DOCS_PER_CHUNK non-empty documents of one source at a time."""
    for source_index, (name, documents) in enumerate(sources):
        chunk = []
        for text in documents:
            if text is not None and not isinstance(text, str):  # None: a null in a parquet column
                raise DataError(f"{name}: a document is {type(text).__name__}, not str")
            if text and not text.isspace():  # an empty document must not produce a lone EOT
                chunk.append(text)
            if len(chunk) == DOCS_PER_CHUNK:
                yield source_index, chunk
                chunk = []
        if chunk:
            yield source_index, chunk


class SplitWriter:
    """Appends each document to train.bin.tmp or val.bin.tmp as its hash says; commit() renames."""

    def __init__(self, out_dir, vocab_size, val_fraction):
        self.dtype, self.threshold = storage_dtype(vocab_size), np.uint64(int(val_fraction * 2**64))
        self.tmp = {split: out_dir / f"{split}.bin.tmp" for split in ("train", "val")}
        self.files = {split: open(path, "wb") for split, path in self.tmp.items()}
        self.counts = dict.fromkeys(["train_tokens", "val_tokens", "train_docs", "val_docs"], 0)
        self.max_token_id, self.index = 0, []  # the chunks' (hashes, doc_lens) while val is empty

    def add(self, tokens, doc_lens, hashes):
        if self.counts["val_docs"] == 0:
            self.index.append((hashes, doc_lens))
        self.write(tokens, doc_lens, hashes < self.threshold)  # hash / 2**64 < val_fraction

    def write(self, tokens, doc_lens, is_val):
        token_is_val = np.repeat(is_val, doc_lens)
        for split, docs, toks in (("train", ~is_val, ~token_is_val), ("val", is_val, token_is_val)):
            self.files[split].write(tokens[toks].tobytes())
            self.counts[f"{split}_tokens"] += int(doc_lens[docs].sum())
            self.counts[f"{split}_docs"] += int(docs.sum())
        self.max_token_id = max(self.max_token_id, int(tokens.max(initial=0)))

    def commit(self):
        for f in self.files.values():
            f.close()
        if self.counts["val_docs"] == 0:  # val must not be empty
            self.resplit()
        if self.counts["train_docs"] == 0:
            raise DataError("every document landed in val (they are all copies of one text); add more documents")
        for path in self.tmp.values():  # train.bin.tmp -> train.bin
            os.replace(path, path.with_suffix(""))

    def resplit(self):
        """No document hashed into val: split train again, its smallest-hash documents to val."""
        smallest = np.concatenate([hashes for hashes, _ in self.index]).min()
        train = np.memmap(self.tmp["train"], dtype=self.dtype, mode="r")
        rewritten = self.tmp["train"].with_name("train.bin.tmp.rewrite")
        self.counts, start = dict.fromkeys(self.counts, 0), 0
        try:
            with open(rewritten, "wb") as f_train, open(self.tmp["val"], "wb") as f_val:
                self.files = {"train": f_train, "val": f_val}
                for hashes, lens in self.index:
                    self.write(train[start:start + lens.sum()], lens, hashes == smallest)
                    start += lens.sum()
            del train  # close the memmap before replacing the file
            os.replace(rewritten, self.tmp["train"])
        finally:
            rewritten.unlink(missing_ok=True)

    def cleanup(self):
        for split, f in self.files.items():
            f.close()
            self.tmp[split].unlink(missing_ok=True)


def write_chunks(results, writer, n_sources, limit):
    """Write chunks up to limit tokens; return (documents per source, sources read to the end)."""
    docs, total = [0] * n_sources, 0
    with tqdm(total=limit, unit="tok", unit_scale=True, desc="tokenizing", disable=None) as bar:
        for source_index, tokens, doc_lens, hashes in results:
            full = limit is not None and total + len(tokens) > limit
            if full:  # keep the whole documents that fit
                n = np.searchsorted(np.cumsum(doc_lens), limit - total, side="right")
                tokens, doc_lens, hashes = tokens[:doc_lens[:n].sum()], doc_lens[:n], hashes[:n]
            writer.add(tokens, doc_lens, hashes)
            docs[source_index] += len(doc_lens)
            total += len(tokens)
            bar.update(len(tokens))
            if full:
                return docs, source_index
    return docs, n_sources


def prepare(sources, tokenizer, out_dir, val_fraction=0.005, max_tokens=None, num_proc=1):
    """Tokenize sources, [(description, iterable of str)], into out_dir; return meta.json's dict.
    max_tokens counts EOTs (None = everything); num_proc 1 tokenizes in this process."""
    if not 0 < val_fraction < 1:
        raise DataError(f"--val_fraction must be in (0, 1), got {val_fraction}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "meta.json").unlink(missing_ok=True)  # first: train.py refuses the folder meanwhile
    writer, pool = SplitWriter(out_dir, tokenizer.vocab_size, val_fraction), None
    try:
        _worker.update(tokenizer=tokenizer, num_threads=8)  # num_proc 1: here, on 8 threads
        # workers start from a fresh server process, never forked from this one: a fork copies the locks
        # that this process's threads (torch's, the tokenizer's, a notebook's) may hold, forever taken
        context = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
        pool = context.Pool(num_proc, _init_worker, (tokenizer.name, 1)) if num_proc > 1 else None
        results = (pool.imap if pool else map)(_tokenize_chunk, iter_chunks(sources))  # in order
        docs, n_read = write_chunks(results, writer, len(sources), max_tokens)
        names = [name for name, _ in sources]
        if empty := [name for name, n in zip(names[:n_read], docs) if n == 0]:
            raise DataError(f"no non-empty documents in: {', '.join(empty)}")
        if sum(docs) < 2:
            raise DataError(f"need at least 2 non-empty documents (one for train, one for val), found {sum(docs)} "
                            f"in: {', '.join(names)}")
        writer.commit()
        meta = {"tokenizer": tokenizer.name, "vocab_size": tokenizer.vocab_size, "eot": tokenizer.eot,
                "dtype": np.dtype(writer.dtype).name, "max_token_id": writer.max_token_id, **writer.counts,
                "sources": [name for name, n in zip(names, docs) if n > 0], "split": SPLIT_RULE,
                "val_fraction": val_fraction, "layout": LAYOUT, "max_tokens": max_tokens,
                "files": bin_fingerprints(out_dir)}   # max_token_id holds while these are unchanged
        write_meta(out_dir / "meta.json", meta)  # last: from here on train.py accepts the folder
        return meta
    finally:
        if pool is not None:
            pool.terminate()
        writer.cleanup()


def bin_fingerprints(out_dir):
    """{"train.bin": [size, mtime in ns], "val.bin": [...]}: a .bin file changed since is scanned (support.data)."""
    return {name: [(st := os.stat(Path(out_dir) / name)).st_size, st.st_mtime_ns]
            for name in ("train.bin", "val.bin")}


def write_meta(path, meta):
    (tmp := path.with_name(path.name + ".tmp")).write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, path)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    p.add_argument("--source", choices=["fineweb-edu", "pydoc"], help="default: fineweb-edu")
    p.add_argument("--input", nargs="+", metavar="FILE",
                   help="local files instead: .jsonl, .jsonl.gz, .parquet (their 'text' field) or .txt (one document)")
    p.add_argument("--tokenizer", default="gpt2", help="gpt2 (tiktoken, the default), byte, or "
                   "hf:<hub id or folder> (a released model's tokenizer.json)")
    p.add_argument("--name", help="dataset folder (default: fineweb_edu, pydoc or input stem)")
    p.add_argument("--out_dir", default="data", help="outputs go to OUT_DIR/NAME/ (default: data)")
    p.add_argument("--max_tokens", type=int, help="stop before the document that would exceed it")
    p.add_argument("--val_fraction", type=float, help="expected fraction of documents in val "
                   "(default 0.005; 0.05 for pydoc, whose val should outlast a 1024-token context)")
    p.add_argument("--num_proc", type=int, default=min(os.cpu_count() or 1, 8),
                   help="tokenizer processes (default: min(cpu count, 8))")
    return p.parse_args(argv)


def choose_sources(args):
    """(dataset name, [(description, documents)]) for --input, --source pydoc or FineWeb-Edu."""
    if args.input:
        stem = Path(args.input[0]).name[: -len(input_kind(args.input[0]))]
        return args.name or stem, [(str(path), read_input_file(path)) for path in args.input]
    if args.source == "pydoc":
        return args.name or "pydoc", [(f"pydoc_data.topics (Python {sys.version.split()[0]})", read_pydoc())]
    cache = Path(args.out_dir) / "fineweb_edu_parquet"
    download_fineweb_shard(FINEWEB_SHARDS[0], cache)  # fail before the output folder is touched
    shards = [(f"{FINEWEB_REPO}/{s}", read_fineweb_shard(s, cache)) for s in FINEWEB_SHARDS]
    return args.name or "fineweb_edu", shards


@keeps_process_state
def main(argv=None):
    """Run the command line (argv as for parse_args) and return the meta dict. Raises DataError."""
    args = parse_args(argv)
    if args.input and args.source:
        raise DataError("give either --source or --input, not both")
    for path in args.input or []:  # bad inputs fail before any work: the old dataset stays usable
        if input_kind(path) and not Path(path).is_file():     # (input_kind refuses an unknown extension)
            raise DataError(f"input file not found: {path}")
    for path in args.input or []:  # any() stops at the first non-empty document
        if not any(isinstance(text, str) and text.strip() for text in read_input_file(path)):
            raise DataError(f"no non-empty documents in: {path}")
    tokenizer = get_tokenizer(args.tokenizer)  # fails early (e.g. no vocabulary files)
    name, sources = choose_sources(args)
    default_fraction = 0.05 if args.source == "pydoc" else 0.005  # pydoc: 79 documents
    val_fraction = default_fraction if args.val_fraction is None else args.val_fraction
    out_dir = Path(args.out_dir) / name
    meta = prepare(sources, tokenizer, out_dir, val_fraction, args.max_tokens, args.num_proc)
    print(f"wrote {out_dir}/train.bin ({meta['train_tokens']:,} tokens, {meta['train_docs']:,} docs), val.bin "
          f"({meta['val_tokens']:,} tokens, {meta['val_docs']:,} docs), meta.json [{meta['dtype']}]")
    return meta


if __name__ == "__main__":  # the guard matters: worker processes import this file
    try:
        main()
    except DataError as e:
        sys.exit(f"error: {e}")
