#!/usr/bin/env python3
"""scripts/check-layers accepts a tree whose includes go down and rejects one that goes up."""
import pathlib
import subprocess
import sys
import tempfile


def tree(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def run(checker, files):
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        tree(root, files)
        p = subprocess.run([sys.executable, checker, str(root)], capture_output=True, text=True)
        return p.returncode, p.stdout


def main():
    checker = sys.argv[1]
    base = {
        "include/pagedkv/base/error.hpp": "#pragma once\n",
        "include/pagedkv/hash/block_hash.hpp": '#include "pagedkv/base/error.hpp"\n',
        "include/pagedkv/pool/block_pool.hpp": '#include "pagedkv/hash/block_hash.hpp"\n',
        "src/pool/block_pool.cpp": '#include "pagedkv/pool/block_pool.hpp"\n',
        "include/pagedkv/remote/redis_store.hpp": '#include "pagedkv/hash/block_hash.hpp"\n',
        "include/pagedkv/tier/host_tier.hpp": '#include "pagedkv/remote/redis_store.hpp"\n',
    }
    failures = []
    rc, out = run(checker, base)
    if rc != 0:
        failures.append(f"clean tree rejected: {out}")
    cases = {
        "header includes upward": {"include/pagedkv/hash/block_hash.hpp":
                                   '#include "pagedkv/pool/block_pool.hpp"\n'},
        "source includes upward": {"src/hash/block_hash.cpp":
                                   '#include <pagedkv/pool/block_pool.hpp>\n'},
        "device includes pool": {"include/pagedkv/device/block_table.hpp":
                                 '#include "pagedkv/pool/block_pool.hpp"\n'},
        "missing header": {"src/pool/x.cpp": '#include "pagedkv/pool/nope.hpp"\n'},
        "unknown layer": {"include/pagedkv/misc/x.hpp": "#pragma once\n"},
        "kernel includes pool": {"kernels/decode_attention.cu":
                                 '#include "pagedkv/pool/block_pool.hpp"\n'},
        "kernel's internal header includes pool": {"kernels/internal/tiles.hpp":
                                                   '#include "pagedkv/pool/block_pool.hpp"\n'},
        "remote includes tier": {"include/pagedkv/tier/host_tier.hpp": "#pragma once\n",
                                 "src/remote/redis_store.cpp":
                                 '#include "pagedkv/tier/host_tier.hpp"\n'},
    }
    for name, extra in cases.items():
        rc, out = run(checker, {**base, **extra})
        if rc != 1:
            failures.append(f"{name}: accepted (rc {rc}): {out}")
    for f in failures:
        print("FAIL:", f)
    print(f"{1 + len(cases) - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
