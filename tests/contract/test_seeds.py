"""Test models are the same in every process: their weights come from seeds that do not depend
on PYTHONHASHSEED (a test that passes once must pass again with the same bytes)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

from helpers import TESTS, conv_net

DIGEST = """
import hashlib, sys
sys.path.insert(0, sys.argv[1])
from helpers import conv_net
print(hashlib.sha256(conv_net().SerializeToString()).hexdigest())
"""


def test_test_weights_do_not_depend_on_the_hash_seed():
    digests = set()
    for seed in ("1", "2", "random"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        done = subprocess.run([sys.executable, "-c", DIGEST, str(TESTS)], env=env, capture_output=True, text=True,
                              check=True)
        digests.add(done.stdout.strip())
    assert len(digests) == 1, digests
    assert digests == {hashlib.sha256(conv_net().SerializeToString()).hexdigest()}
