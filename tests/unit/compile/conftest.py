"""Shared fixtures of the compiler tests: one kernel cache per test session, one thread for torch,
no default schedule search."""

from __future__ import annotations

import pytest
import torch

from lumos.compile.runtime.kernel_cache import KernelCache


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory) -> KernelCache:
    return KernelCache(tmp_path_factory.mktemp("kernels"), "cpu")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors gain nothing from intra-op threads on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def no_default_search(monkeypatch):
    """compile_module and the torch.compile backend search schedules by default (seconds per
    kernel): tests that do not test the search compile without it, so the suite stays fast."""
    monkeypatch.setenv("LUMOS_SEARCH_BUDGET", "0")
