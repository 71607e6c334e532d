"""A device loads a kernel's module when a task first asks for it, in a fresh process as a
deployment's ClientApp is: a masked task's plain kernel too, even when the secure sum's
module (which registers every masked kernel) was loaded first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import fedcluster.client.app  # as a ClientApp process starts: the secure sum's device side loaded
from fedcluster import protocol
from fedcluster.device import kernel
from fedcluster.kernel import KERNELS
for name in protocol.SECURE_TASKS:  # every masked kernel registered, no plain one loaded yet
    assert protocol.secure_name(name) in KERNELS and name not in KERNELS, name
for name in protocol.SECURE_TASKS:
    kernel(protocol.secure_name(name))
    assert name in KERNELS, name
print("ok", len(protocol.SECURE_TASKS))
"""


def test_a_masked_task_in_a_fresh_process_loads_the_kernel_it_wraps():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().startswith("ok") and int(done.stdout.split()[-1]) >= 3
