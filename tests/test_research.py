"""The research scripts that stage notes rely on still show what the notes say they show."""

import subprocess
import sys
from pathlib import Path

RESEARCH = Path(__file__).resolve().parent.parent / "research"


def _run(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(RESEARCH / "ring_deadlock.py"), *args], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_old_producer_order_deadlocks_the_tile_id_ring():
    out = _run("--count", "500")
    hung = int(out.split(":")[1].split()[0])
    assert hung > 0, out
    assert "[0, 0, 3, 0, 0]" in out  # a tile with work, then two empty ones: the ring fills up


def test_the_fixed_order_never_deadlocks():
    out = _run("--fixed", "--count", "3000", "--seed", "11")
    assert out.startswith("fixed order: 0 of 3006 tile sequences deadlock"), out
