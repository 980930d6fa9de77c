"""KV storage is committed as it is written: a generous kv_cache_gb costs resident memory only for what is in
use, and the storage reads as zeros until then."""
from __future__ import annotations

import torch

from infragent.engine.kv_cache import KVCache, zeros_on_demand

MB = 1 << 20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_storage_reads_zero_and_is_resident_only_once_written():
    before = _rss()
    store = zeros_on_demand((64, 1024, 256), torch.float32)  # 64 MB
    assert _rss() - before < 8 * MB
    assert store.shape == (64, 1024, 256) and store.dtype == torch.float32
    assert not store[::7].any()
    store[:16].fill_(1.0)  # a quarter of it
    assert 12 * MB < _rss() - before < 28 * MB
    assert store.sum().item() == 16 * 1024 * 256 and not store[16:].any()
    small = zeros_on_demand((3, 5), torch.bfloat16)
    assert small.dtype == torch.bfloat16 and not small.any()


def test_a_paged_cache_sized_at_half_a_gigabyte_costs_almost_nothing_until_used():
    before = _rss()
    cache = KVCache(30, 1024, 16, 3, 64, torch.float32, "paged")  # 30 layers x 2 x 12.6 MB = 755 MB
    assert _rss() - before < 32 * MB
    cache.k[0][5].fill_(2.0)
    assert cache.k[0][5].sum().item() == 2.0 * 3 * 16 * 64 and not cache.k[0][4].any() and not cache.v[29].any()
