"""Device, threads, RNG state and autocast: strict one-line checks, separate from torch's settings."""

from __future__ import annotations

import platform
import random
import subprocess
import sys

import pytest
import torch

from posbench import runtime
from posbench.errors import PosbenchError
from posbench.runtime import autocast, check_threads, resolve_device, rng_states, set_rng_states, set_threads


@pytest.fixture
def cuda(monkeypatch):
    """cuda(available, count): pretend this machine has ``count`` CUDA devices (or none)."""

    def _cuda(available: bool, count: int = 0):
        monkeypatch.setattr(runtime.torch.cuda, "is_available", lambda: available)
        monkeypatch.setattr(runtime.torch.cuda, "device_count", lambda: count)

    return _cuda


@pytest.mark.parametrize("name", ["banana", "gpu", "CUDA", "cuda:", "cuda:x", "cpu:0", "mps", ""])
def test_unknown_device_names_are_one_line_errors(name, cuda):
    cuda(True, 1)
    with pytest.raises(PosbenchError, match=f"device must be auto, cpu, cuda or cuda:N, got '{name}'"):
        resolve_device(name)


@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_cuda_without_cuda_says_to_use_cpu_or_auto(name, cuda):
    cuda(False)
    with pytest.raises(
        PosbenchError, match=f"device={name} but this torch build or machine has no CUDA; use device=cpu"
    ):
        resolve_device(name)


def test_auto_cpu_and_cuda_resolve(cuda):
    cuda(False)
    assert resolve_device("auto") == resolve_device("cpu") == torch.device("cpu")
    cuda(True, 2)
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(PosbenchError, match="device=cuda:2 but this machine has 2 CUDA device"):
        resolve_device("cuda:2")


@pytest.mark.parametrize("n", [None, 1, 3])
def test_threads_null_or_positive_pass(n):
    check_threads(n)


@pytest.mark.parametrize("n", [0, -1, True, False, 2.5, "4"])
def test_threads_zero_negative_or_not_an_int_are_one_line_errors(n):
    with pytest.raises(PosbenchError, match=f"threads must be a positive integer or null, got {n}"):
        check_threads(n)


def test_set_threads_sets_torch_threads_and_null_leaves_them():
    before = torch.get_num_threads()
    try:
        set_threads(None)
        assert torch.get_num_threads() == before
        set_threads(1)
        assert torch.get_num_threads() == 1
        with pytest.raises(PosbenchError):
            set_threads(0)
        assert torch.get_num_threads() == 1  # checked before anything changes
    finally:
        torch.set_num_threads(before)


def test_rng_states_put_back_give_the_same_draws():
    states = rng_states()
    first = (torch.rand(3), random.random())
    set_rng_states(states)
    second = (torch.rand(3), random.random())
    assert torch.equal(first[0], second[0]) and first[1] == second[1]


def test_autocast_is_bf16_for_bf16_only():
    a = torch.randn(4, 4)
    with autocast("cpu", "fp32"):
        assert (a @ a).dtype == torch.float32
    with autocast("cpu", "bf16"):
        assert (a @ a).dtype == torch.bfloat16


MAPPED_BYTES_OF_A_64MIB_TENSOR = """
import ctypes, torch
from posbench.runtime import freed_memory_kept
class MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
def mapped():  # bytes glibc serves from mappings of their own (hblkhd) while a 64 MiB tensor lives
    before = libc.mallinfo2().hblkhd
    tensor = torch.ones(16 << 20)
    return libc.mallinfo2().hblkhd - before
outside = mapped()
with freed_memory_kept():
    inside = mapped()
print(outside, inside, mapped())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")
def test_freed_memory_kept_serves_big_blocks_from_the_heap_then_hands_glibc_its_settings_back():
    # A fresh process: this one's heap may already hold a free 64 MiB chunk from earlier tests. glibc's own
    # bookkeeping, not page faults: whether freed pages stay resident is also up to the kernel.
    done = subprocess.run([sys.executable, "-c", MAPPED_BYTES_OF_A_64MIB_TENSOR], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    outside, inside, after = (int(n) for n in done.stdout.split())
    assert outside >= 64 << 20  # glibc alone maps a block this big on its own, and unmaps it when freed
    assert inside == 0  # kept: from the heap, where a freed block stays for the next step
    assert after >= 64 << 20
