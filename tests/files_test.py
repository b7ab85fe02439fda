"""One way to write a file atomically: old or new bytes, whole; no temp file left; first writer wins."""
import json
import os
import threading

import pytest

from mecefo_jax.host import files


def test_write_replaces_the_file_whole_and_leaves_no_temp_file(tmp_path):
    path = str(tmp_path / 'record.json')
    files.write_json(path, {'a': 1})
    files.write_json(path, {'a': 2, 'b': [1, 2]})
    with open(path) as f:
        assert json.load(f) == {'a': 2, 'b': [1, 2]}
    assert os.listdir(tmp_path) == ['record.json']


def test_a_failed_write_keeps_the_old_file_and_removes_its_temp(tmp_path, monkeypatch):
    path = str(tmp_path / 'data.bin')
    files.write_bytes(path, b'old')

    def broken_replace(src, dst):
        raise OSError('disk full')
    monkeypatch.setattr(os, 'replace', broken_replace)
    with pytest.raises(OSError, match='disk full'):
        files.write_bytes(path, b'new')
    with open(path, 'rb') as f:
        assert f.read() == b'old'
    assert os.listdir(tmp_path) == ['data.bin']


def test_concurrent_writers_use_distinct_temp_files_and_one_whole_version_wins(tmp_path):
    """A fixed `.tmp` name let two writers interleave into one temp file."""
    path = str(tmp_path / 'shared.txt')
    payloads = [bytes([65 + i]) * 200_000 for i in range(8)]
    threads = [threading.Thread(target=files.write_bytes, args=(path, p)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(path, 'rb') as f:
        assert f.read() in payloads
    assert os.listdir(tmp_path) == ['shared.txt']


def test_create_only_if_absent_the_first_writer_wins(tmp_path):
    path = str(tmp_path / 'lock')
    assert files.create_bytes(path, b'first') is True
    assert files.create_bytes(path, b'second') is False
    with open(path, 'rb') as f:
        assert f.read() == b'first'
    assert os.listdir(tmp_path) == ['lock']


def test_create_without_hard_links_raises_unless_the_last_writer_may_win(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise PermissionError('links not supported')
    monkeypatch.setattr(os, 'link', no_links)
    path = str(tmp_path / 'model')
    with pytest.raises(PermissionError):
        files.create_bytes(path, b'x')
    assert not os.path.exists(path)
    assert files.create_bytes(path, b'y', replace_without_links=True) is True
    with open(path, 'rb') as f:
        assert f.read() == b'y'
    assert os.listdir(tmp_path) == ['model']
