"""Triton's driver helper built at setup and linked into each request's own Triton cache
(kz_worker.triton_helpers): what is linked, that Triton's own cache lookup finds it, and that a
machine without a GPU driver gets no half-made helpers dir."""
import os

import pytest

from kz_worker import triton_helpers


def make_helpers(root):
    helpers = root / "helpers"
    (helpers / "KEYA").mkdir(parents=True)
    (helpers / "KEYA" / "cuda_utils.so").write_bytes(b"the helper")
    (helpers / "KEYA" / "nested").mkdir()
    (helpers / "KEYA" / "a-link.so").symlink_to(helpers / "KEYA" / "cuda_utils.so")
    (helpers / triton_helpers.COMPLETE).write_text("")
    return helpers


def test_links_the_helpers_files_where_tritons_own_lookup_finds_them(tmp_path, monkeypatch):
    helpers = make_helpers(tmp_path)
    cache = tmp_path / "request" / "triton"
    monkeypatch.setenv("KZ_TRITON_HELPERS_DIR", str(helpers))
    assert triton_helpers.link_into(str(cache)) == 1
    assert sorted(os.listdir(cache / "KEYA")) == ["cuda_utils.so"]  # no symlink, no directory, no marker
    assert os.readlink(cache / "KEYA" / "cuda_utils.so") == str(helpers / "KEYA" / "cuda_utils.so")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    from triton.runtime.cache import FileCacheManager
    found = FileCacheManager("KEYA").get_file("cuda_utils.so")
    assert found is not None and open(found, "rb").read() == b"the helper"


def test_links_nothing_without_helpers(tmp_path, monkeypatch):
    monkeypatch.delenv("KZ_TRITON_HELPERS_DIR", raising=False)
    assert triton_helpers.link_into(str(tmp_path / "triton")) == 0
    assert not (tmp_path / "triton").exists()


def test_prepare_leaves_no_dir_where_it_cannot_build(tmp_path, monkeypatch):
    # A CPU machine (no libcuda to link against): no helpers dir, so the supervisor hands over none.
    # Where the driver is there (the GPU host), the helper is built under Triton's key.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "unused"))
    out = tmp_path / "triton-helpers"
    try:
        triton_helpers.prepare(str(out))
    except Exception:
        assert not out.exists() and not (tmp_path / "triton-helpers.partial").exists()
        return
    assert (out / triton_helpers.COMPLETE).exists()
    assert any(name.startswith("cuda_utils") for _, _, files in os.walk(out) for name in files)
