"""
Token data that is not what meta.json says (support/data.py, CPU, a few seconds): a broken or incomplete
meta.json is one line naming the file and what is wrong; check_token_ids finds a token id the tokenizer
cannot produce (from meta.json's max_token_id, or by scanning the files in chunks); get_batch refuses a file
rewritten since load_meta checked it.

    python -m pytest -q tests/test_robust_data.py
"""

import json
import time
import os

import numpy as np
import pytest

from support.data import check_token_ids, get_batch, load_meta
from support.runtime import RunError
from test_train import write_dataset

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
