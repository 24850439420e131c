"""test_examples.py — examples/ucm_store.py and examples/mooncake_store.py
run as a user runs them (a fresh interpreter, PYTHONPATH as their top says)."""

import os
import subprocess
import sys

from conftest import ROOT


def run(script, pythonpath, *args, **extra_env):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, pythonpath), PYTHONDONTWRITEBYTECODE="1",
               **extra_env)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script)] + list(args),
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_ucm_example():
    out = run("ucm_store.py", "python")
    assert "ucm_store: hits=8/8 prefix=7 same=True" in out


def test_mooncake_example():
    out = run("mooncake_store.py", os.path.join("python", "compat"))
    assert "Hello, kvengine! | exists: [1, 0]" in out
    assert "batch_get_into: [1048576, 524288] bytes equal: True" in out
    assert "missing key reads as b'' and removes as -704" in out
    assert "removed 4 objects; hostname localhost health 0" in out


def test_mooncake_example_in_a_cluster(cluster):
    # The store's engine gets the cluster's token from the environment.
    out = run("mooncake_store.py", os.path.join("python", "compat"), cluster.master,
              KVENGINE_SETTINGS="cluster.token=%s cluster.node_ttl_ms=1000" % cluster.TOKEN)
    # The store joined: a host:port hostname and a healthy master.
    assert "removed 4 objects; hostname localhost:" in out and out.rstrip().endswith("health 0")
