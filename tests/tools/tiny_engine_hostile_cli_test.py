#!/usr/bin/env python3
"""pagedkv-tiny-engine against sizes it cannot serve and strings that reach its JSON (each case
failed before its fix):

- sizes in range but impossible on any machine (a KV pool or host tier of terabytes) are a usage
  error before anything is allocated: exit 2 naming the flags and the bytes (before: exit 1 with
  a bare "std::bad_alloc", or an attempt to fill terabytes where memory is overcommitted);
- sizes a machine could hold but this process cannot allocate (--out-of-memory: under a 512 MiB
  address-space limit) exit 1 with "out of memory" naming the flags and the bytes (before: the
  same bare "std::bad_alloc");
- --remote's namespace reaches the JSON report escaped (--json-escaping: a quote, a backslash,
  control characters and a byte that is not UTF-8 made the line invalid JSON).

Usage: tiny_engine_hostile_cli_test.py PAGEDKV_TINY_ENGINE
       tiny_engine_hostile_cli_test.py --out-of-memory PAGEDKV_TINY_ENGINE
       tiny_engine_hostile_cli_test.py --json-escaping PAGEDKV_TINY_ENGINE
--out-of-memory exits 77 (ctest: skipped) for a binary built with AddressSanitizer, which cannot
run under an address-space limit (its shadow memory alone is past it). --json-escaping exits 77
for a build without RedisStore (--remote redis:// is refused there; the namespace of --disk is
fixed).
"""
import json
import os
import resource
import subprocess
import sys
import tempfile

SMALL = ["--workload", "chat", "--sessions", "1", "--system-tokens", "16"]


def run(binary, args, limit_memory=False):
    def cap():  # 512 MiB of address space; a small run needs under 128 MiB
        resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))
    return subprocess.run([binary] + args, capture_output=True, timeout=300,
                          preexec_fn=cap if limit_memory else None)


def expect_error(binary, args, rc, parts, limit_memory=False):
    p = run(binary, args, limit_memory)
    err = p.stderr.decode(errors="replace")
    assert p.returncode == rc, f"{args}: rc {p.returncode}, expected {rc}\n{err[-2000:]}"
    for part in parts:
        assert part in err, f"{args}: {part!r} not in stderr:\n{err[-2000:]}"
    assert "std::bad_alloc\n" not in err.replace("(std::bad_alloc)", ""), err


def impossible_sizes(binary):
    # 4194304 blocks of 256 tokens x 2 KV heads x 256 dims x 2 bytes x 8 planes: 8 TiB.
    expect_error(binary, ["--num-blocks", "4194304", "--block-size", "256", "--head-dim", "256"],
                 2, ["pagedkv-tiny-engine: the KV pool needs 8796093022208 bytes",
                     "--num-blocks 4194304 blocks of 2097152 bytes", "--block-size 256",
                     "--head-dim 256", "--kv-dtype bf16", "of memory and swap", "(see --help)"])
    # The host tier: 4194304 + 1 slots of 2 MiB.
    expect_error(binary, ["--host-blocks", "4194304", "--block-size", "256", "--head-dim", "256"]
                 + SMALL, 2, ["the host tier needs 8796095119360 bytes",
                              "--host-blocks 4194304 + 1 slots", "of memory and swap"])
    # FP8 with per-(token, KV head) scales: 1-byte codes plus 4 bytes of scale per token and head.
    expect_error(binary, ["--num-blocks", "4194304", "--block-size", "256", "--head-dim", "256",
                          "--kv-dtype", "fp8_e4m3"], 2,
                 ["--num-blocks 4194304 blocks of 1064960 bytes", "--kv-dtype fp8_e4m3"])
    # In range and small: still served.
    p = run(binary, ["--json", "--num-blocks", "64"] + SMALL)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    assert json.loads(p.stdout)["num_blocks"] == 64
    print("tiny_engine_hostile_cli: impossible sizes as expected")


def out_of_memory(binary):
    with open(binary, "rb") as f:
        if b"__asan_init" in f.read():
            print("built with AddressSanitizer: the out-of-memory case cannot run (skipped)")
            sys.exit(77)
    # 100000 blocks of 16384 bytes: 1.6 GB, past the 512 MiB limit, below any machine's memory.
    expect_error(binary, ["--num-blocks", "100000"] + SMALL, 1,
                 ["pagedkv-tiny-engine: out of memory (std::bad_alloc): the KV pool needs "
                  "1638400000 bytes", "--num-blocks 100000 blocks of 16384 bytes",
                  "lower --num-blocks or --host-blocks"], limit_memory=True)
    expect_error(binary, ["--host-blocks", "100000", "--compare", "--json"] + SMALL, 1,
                 ["out of memory (std::bad_alloc)", "the host tier needs 1638416384 bytes",
                  "--host-blocks 100000 + 1 slots",
                  "--compare, --check-against-cpu and --vs-bf16 build further engines"],
                 limit_memory=True)
    print("tiny_engine_hostile_cli --out-of-memory: as expected")


def json_escaping(binary):
    # Port 1 on the loopback: nothing listens, every remote operation is a counted miss.
    namespace = b'we"ird\\name\x01\x1f\t\n\x7f\xff\xc3\xa9/x'
    with tempfile.TemporaryDirectory() as d:
        for mode in [[], ["--compare"]]:
            p = subprocess.run([binary.encode(), b"--json", b"--remote",
                                b"redis://127.0.0.1:1/" + namespace, b"--host-blocks", b"8"]
                               + [a.encode() for a in mode + SMALL],
                               capture_output=True, timeout=300, cwd=d)
            err = p.stderr.decode(errors="replace")
            if p.returncode == 2 and "no RedisStore" in err:
                print("this build has no RedisStore: --remote redis:// cannot run (skipped)")
                sys.exit(77)
            assert p.returncode == 0, err
            lines = p.stdout.splitlines()
            assert len(lines) == 1, p.stdout  # one line: the newline in the name is escaped
            p.stdout.decode("utf-8")  # strict: the byte 0xff is replaced, not copied
            row = json.loads(lines[0])
            key = "remote_namespace_on" if mode else "remote_namespace"
            # Everything but the byte that is no UTF-8 comes back as it was (0xff: U+FFFD).
            assert row[key] == 'we"ird\\name\x01\x1f\t\n\x7f\ufffd\u00e9/x', repr(row[key])
            assert row["workload"] == "chat" and row["device"] == "cpu", row
    print("tiny_engine_hostile_cli --json-escaping: as expected")


def main():
    if sys.argv[1] == "--out-of-memory":
        out_of_memory(os.path.abspath(sys.argv[2]))
    elif sys.argv[1] == "--json-escaping":
        json_escaping(os.path.abspath(sys.argv[2]))
    else:
        impossible_sizes(os.path.abspath(sys.argv[1]))


if __name__ == "__main__":
    main()
