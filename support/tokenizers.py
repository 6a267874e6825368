"""
Tokenizers: the one place that turns a tokenizer's name into an object. prepare_data.py stores ids
with it, sample.py and support/harness.py decode with the name a checkpoint recorded.

    tok = get_tokenizer("gpt2")     # "gpt2" (tiktoken), "byte" or "hf:<hub id or folder>"
    ids = tok.encode("Hello world") + [tok.eot]
    tok.decode(ids)                 # 'Hello world<|endoftext|>'

Every tokenizer has .name, .vocab_size, .eot (ints), .encode(str) -> list[int],
.encode_batch(list[str]) -> list[list[int]] and .decode(list[int]) -> str. encode never adds special
tokens: the EOT is appended by the caller (prepare_data.py puts one after every document).
"""

import json
import os
from pathlib import Path


class DataError(ValueError):
    """A problem with the inputs or the environment; the command lines print it as one line and exit
    non-zero."""


class ByteTokenizer:
    """UTF-8 bytes as tokens 0..255 plus EOT = 256. Needs no files; suits CPU-scale runs and
    tests."""

    name = "byte"
    eot = 256
    vocab_size = 257

    def encode(self, text):
        """str -> list[int] of UTF-8 byte values (no EOT)."""
        return list(text.encode("utf-8"))

    def encode_batch(self, texts, num_threads=None):
        """list[str] -> list[list[int]]; num_threads is accepted for symmetry with tiktoken and
        ignored."""
        return [list(t.encode("utf-8")) for t in texts]

    def decode(self, ids):
        """list[int] -> str. EOT becomes "<|endoftext|>" (as with GPT-2); invalid UTF-8 becomes
        U+FFFD.

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
                raise ValueError(
                    f"token id {i} is outside the byte vocabulary [0, {self.vocab_size})")
        parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)


class TiktokenTokenizer:
    """GPT-2 BPE via tiktoken (vocab 50257, EOT 50256). Encodes "ordinary" text: special-token
    strings such as "<|endoftext|>" inside a document are encoded as plain text, never as the EOT
    id."""

    def __init__(self, encoding):
        self._enc = encoding
        self.name = "gpt2"
        self.eot = encoding.eot_token
        self.vocab_size = encoding.n_vocab

    def encode(self, text):
        """str -> list[int] (no special tokens, no EOT)."""
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts, num_threads=8):
        """list[str] -> list[list[int]], encoded on num_threads threads (tiktoken's default: 8)."""
        return self._enc.encode_ordinary_batch(texts, num_threads=num_threads)

    def decode(self, ids):
        """list[int] -> str; bytes that are not valid UTF-8 become U+FFFD. Raises for an id >=
        vocab_size."""
        return self._enc.decode([int(i) for i in ids], errors="replace")


class HFTokenizer:
    """A released model's own tokenizer (its tokenizer.json) through the `tokenizers` library, named
    "hf:<hub id or folder>". EOT is the model's end-of-text token: tokenizer_config.json's
    eos_token, else config.json's eos_token_id. Encodes ordinary text, with no special tokens added
    (no BOS)."""

    def __init__(self, name, tokenizer, eot):
        self.name, self._tok, self.eot = name, tokenizer, eot
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text):
        """str -> list[int] (no special tokens, no EOT)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts, num_threads=None):
        """list[str] -> list[list[int]]; the library parallelises by itself (num_threads is
        ignored)."""
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids):
        """list[int] -> str, special tokens (e.g. the EOT) included as text."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


_HF_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json")


def hf_tokenizer(name):
    """HFTokenizer for "hf:<hub id or folder>": tokenizer.json (and tokenizer_config.json /
    config.json for the EOS) from a local folder, or from the hub through huggingface_hub. Raises
    DataError naming what is missing."""
    source = name[3:]
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DataError(
            f"the tokenizer {name!r} needs the tokenizers library: pip install tokenizers"
        ) from None
    files = {file: path for file, path in _hf_files(source).items() if path.is_file()}
    if "tokenizer.json" not in files:
        where = ("the folder" if Path(source).is_dir()
                 else "no local folder of that name, and the hub did not provide it")
        raise DataError(f"no tokenizer.json for {source!r} ({where}): give a folder holding "
                        f"tokenizer.json, or a hub id (online)")
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


def _hf_files(source):
    """{file name: path} of _HF_FILES in the folder `source`, or, when it is not a folder, in the
    hub snapshot of the repository `source` (fetched in one call; offline or an unknown repository
    leaves the paths missing). Raises DataError when a hub id needs huggingface_hub."""
    folder = Path(source)
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download
        except ImportError:
            raise DataError(f"{source!r} is not a local folder, and fetching it from the hub needs "
                            f"huggingface_hub: pip install huggingface_hub") from None
        try:
            folder = Path(snapshot_download(source, allow_patterns=list(_HF_FILES)))
        except Exception:  # offline, unknown repo: the caller reports no tokenizer.json
            pass
    return {file: folder / file for file in _HF_FILES}


def get_tokenizer(name):
    """Return the tokenizer called `name`: "gpt2" (tiktoken), "byte" (UTF-8 bytes) or
    "hf:<hub id or folder>" (a released model's own tokenizer.json, see hf_tokenizer).

    Raises DataError for an unknown name, a missing tiktoken package, or when tiktoken cannot get
    the GPT-2 vocabulary files (no network): the message says to set TIKTOKEN_CACHE_DIR.
    """
    if name == "byte":
        return ByteTokenizer()
    if name.startswith("hf:") and len(name) > 3:
        return hf_tokenizer(name)
    if name != "gpt2":
        raise DataError(
            f"unknown tokenizer {name!r}; choose 'gpt2', 'byte' or 'hf:<hub id or folder>'")
    try:
        import tiktoken
    except ImportError:
        raise DataError(
            "the gpt2 tokenizer needs tiktoken: pip install tiktoken (or use --tokenizer byte)")
    try:
        encoding = tiktoken.get_encoding("gpt2")
    except Exception as e:  # offline: a requests ConnectionError to tiktoken's file host
        cache = os.environ.get("TIKTOKEN_CACHE_DIR", "<unset>")
        reason = " ".join(str(e).split())[:160]
        fill = "python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\""
        raise DataError(
            f"tiktoken could not load the gpt2 vocabulary (offline?): online, `{fill}` downloads it once; "
            f"offline, run `TIKTOKEN_CACHE_DIR=$PWD/tiktoken_cache {fill}` on a machine with internet, copy "
            f"that folder here and set TIKTOKEN_CACHE_DIR to its absolute path (now TIKTOKEN_CACHE_DIR="
            f"{cache}); or use --tokenizer byte [{type(e).__name__}: {reason}]"
        ) from e
    return TiktokenTokenizer(encoding)
