"""Party processes give freed memory back (parties.memory): a fragmenting allocation pattern (many
blocks, most freed, every tenth kept) leaves the RSS near its start with the settings."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from parties.memory import return_freed_memory
applied = return_freed_memory() if sys.argv[2] == "on" else {}
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) // 1024
base = rss()
blocks = [bytearray(100_000) for _ in range(3000)]      # 300 MB in 100 kB blocks
kept = blocks[::10]
del blocks
print(json.dumps({"applied": applied, "growth_mb": rss() - base}))
"""


def _probe(mode: str, env=None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | (env or {})
    out = subprocess.run([sys.executable, "-c", PROBE, str(ROOT), mode], capture_output=True, text=True,
                         env=env, check=True).stdout
    return json.loads(out)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_freed_blocks_go_back_to_the_system_with_the_settings():
    on, off = _probe("on"), _probe("off")
    assert on["applied"] == {"MALLOC_ARENA_MAX": 2, "MALLOC_TRIM_THRESHOLD_": 65536, "MALLOC_MMAP_THRESHOLD_": 65536,
                             "ARROW_DEFAULT_MEMORY_POOL": "system"}
    assert on["growth_mb"] < 60, (on, off)           # ~30 MB kept of 300 MB allocated
    assert off["growth_mb"] > on["growth_mb"] + 100, (on, off)


def test_the_users_environment_wins():
    got = _probe("on", {"MALLOC_ARENA_MAX": "4"})
    assert "MALLOC_ARENA_MAX" not in got["applied"]
