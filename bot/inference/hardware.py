"""What this machine's CPU can do, from /proc/cpuinfo's flags (Linux; elsewhere: nothing)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def read_cpuinfo() -> str:
    """The text of /proc/cpuinfo, empty where there is none (tests replace this)."""
    try:
        return CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


@functools.cache
def _flags(text: str) -> frozenset[str]:
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_flags() -> frozenset[str]:
    """The first CPU's feature flags (avx512_vnni, amx_bf16, ...)."""
    return _flags(read_cpuinfo())


def has_bf16() -> bool:
    """Native bf16 arithmetic: AMX tiles or AVX-512 bf16 instructions."""
    return bool(cpu_flags() & {"amx_bf16", "avx512_bf16"})


# FBGEMM_ENABLE_INSTRUCTIONS picks FBGEMM's int8 kernels whatever the CPU has (FBGEMM reads it
# upper-cased); these three sum pairs of products in 16 bits, as on a CPU without VNNI.
FBGEMM_ISA_ENV = "FBGEMM_ENABLE_INSTRUCTIONS"
FBGEMM_PAIR_SUM_ISAS = frozenset({"AVX2", "AVX512", "AVX512_256"})


def has_int8_dot() -> bool:
    """int8 dot products accumulated in int32 (VNNI or AMX): no 16-bit saturation, so int8
    activations may use their full range. False where FBGEMM is told to use a kernel without
    them (FBGEMM_ENABLE_INSTRUCTIONS=AVX2, AVX512 or AVX512_256), even on a CPU that has them."""
    if os.environ.get(FBGEMM_ISA_ENV, "").strip().upper() in FBGEMM_PAIR_SUM_ISAS:
        return False
    return bool(cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})
