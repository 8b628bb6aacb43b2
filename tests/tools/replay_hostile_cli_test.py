#!/usr/bin/env python3
"""pagedkv-replay against hostile command lines and file names (a reviewer's findings, each of
which this test failed on before its fix):

- a name that reaches the gnuplot script (--plot's file, a trace file's name) stays data: before,
  the script was run through a shell and the names were pasted into it unquoted, so
  `--plot "x';touch F;'.png"` ran `touch F`, and so did a trace file named
  `t'; system("touch F"); x='.jsonl` through gnuplot's own system();
- the JSON line escapes the trace's name (a quote in it made the line invalid JSON) and hides a
  store URL's password;
- bad flags exit 2 naming the flag, and what is not a pagedkv::Error (out of memory for a pool
  this large, a port past 65535) exits 1 with a message, not an abort (rc 134; --out-of-memory);
- a trace with no requests is an error, not a run over nothing;
- a single-value flag given twice, and a flag that does not apply to the run's input (--trace,
  --generate W) or mode (--mode, --schedule), exit 2 naming the flag (they were ignored, or the
  last value kept, silently);
- a gzip trace followed by bytes that are not gzip is an error naming the file (gzread ignored
  them), while concatenated gzip members are read as one trace.

Usage: replay_hostile_cli_test.py PAGEDKV_REPLAY
       replay_hostile_cli_test.py --out-of-memory PAGEDKV_REPLAY
The second form runs only the out-of-memory case (its own ctest test): a pool far above 4 GB of
address space must exit 1 with "out of memory". It exits 77 (ctest: skipped) for a binary built
with AddressSanitizer, whose allocator aborts on a failed allocation instead of throwing
std::bad_alloc and cannot run under an address-space limit.
"""
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile

LINE = '{"timestamp":%d,"input_length":1024,"output_length":4,"hash_ids":[1,2]}\n'


def run(binary, args, cwd, limit_memory=False):
    def cap():  # 4 GB of address space: a pool past it fails inside the process
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    return subprocess.run([binary] + args, cwd=cwd, capture_output=True, text=True, timeout=120,
                          preexec_fn=cap if limit_memory else None)


def expect_error(binary, args, cwd, rc, message, limit_memory=False):
    p = run(binary, args, cwd, limit_memory)
    assert p.returncode == rc, f"{args}: rc {p.returncode}, expected {rc}\n{p.stderr[-2000:]}"
    assert message in p.stderr, f"{args}: {message!r} not in stderr:\n{p.stderr[-2000:]}"


def write_trace(d):
    ok = os.path.join(d, "ok.jsonl")
    with open(ok, "w") as f:
        for t in range(8):
            f.write(LINE % t)
    return ok


def out_of_memory(binary):
    with open(binary, "rb") as f:
        if b"__asan_init" in f.read():
            print("built with AddressSanitizer: the out-of-memory case cannot run (skipped)")
            sys.exit(77)
    with tempfile.TemporaryDirectory() as d:
        # Not a pagedkv::Error: a message and exit 1, never an abort (rc 134 before).
        expect_error(binary, ["--trace", write_trace(d), "--num-blocks", "1900000000"], d, 1,
                     "out of memory", limit_memory=True)
    print("replay_hostile_cli --out-of-memory: as expected")


def main():
    if sys.argv[1] == "--out-of-memory":
        out_of_memory(os.path.abspath(sys.argv[2]))
        return
    binary = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as d:
        ok = write_trace(d)

        # --plot's own name, quoted into the script: no shell runs it.
        if shutil.which("gnuplot"):
            png = "x';touch marker1;'.png"
            p = run(binary, ["--trace", ok, "--num-blocks", "10", "20", "--plot", png], d)
            assert p.returncode == 0, p.stderr
            assert not os.path.exists(os.path.join(d, "marker1")), "--plot's name ran a command"
            assert os.path.exists(os.path.join(d, png)), os.listdir(d)
            # A trace file's name in the plot's title: gnuplot's system() is not reached.
            evil = os.path.join(d, "t'; system(\"touch marker2\"); x='.jsonl")
            shutil.copy(ok, evil)
            p = run(binary, ["--trace", evil, "--num-blocks", "10", "20", "--plot", "p.png"], d)
            assert p.returncode == 0, p.stderr
            assert not os.path.exists(os.path.join(d, "marker2")), "a trace name ran a command"
        else:
            print("gnuplot not installed: the --plot cases did not run")

        # The JSON line: a quote and a backslash in the trace's name, escaped.
        odd = os.path.join(d, 'we"ird\\name.jsonl')
        shutil.copy(ok, odd)
        p = run(binary, ["--trace", odd, "--num-blocks", "10"], d)
        assert p.returncode == 0, p.stderr
        row = json.loads(p.stdout.strip().splitlines()[-1])
        assert row["trace"].endswith('we"ird\\name.jsonl'), row["trace"]

        # Flags: exit 2 naming the flag.
        expect_error(binary, ["--trace", "--num-blocks", "10"], d, 2,
                     "--trace needs a value (got the flag '--num-blocks')")
        expect_error(binary, ["--trace", ok, "--block-size", " +16", "--num-blocks", "10"], d, 2,
                     "--block-size: ' +16' is not a whole number")
        expect_error(binary, ["--trace", ok, "--num-blocks", "10", "--kv-bytes-per-token",
                              str(1 << 40)], d, 2, "--kv-bytes-per-token")
        expect_error(binary, ["--trace", ok, "--num-blocks", "10", "--arrival-rate-scale",
                              "1e-320"], d, 2, "--arrival-rate-scale")

        # A single-value flag given twice exits 2 naming it (the last value used to win
        # silently); the list flags (--num-blocks, --kv-memory-gib, --host-blocks) append.
        for flag, args in [("--block-size", ["--block-size", "16", "--block-size", "32"]),
                           ("--trace", ["--trace", ok]),
                           ("--hash", ["--hash", "sha256", "--hash", "xxh3_128"]),
                           ("--table", ["--table", "--table"])]:
            expect_error(binary, ["--trace", ok, "--num-blocks", "10"] + args, d, 2,
                         f"{flag} given twice")
        p = run(binary, ["--trace", ok, "--num-blocks", "10", "--num-blocks", "20"], d)
        assert p.returncode == 0, p.stderr
        assert len(p.stdout.strip().splitlines()) == 2, p.stdout

        # A flag that does not apply to the run's input or mode exits 2 naming the flag and the
        # mode (each was ignored silently).
        trace = ["--trace", ok, "--num-blocks", "10"]
        engine = trace + ["--mode", "engine"]
        chat = ["--generate", "chat", "--requests", "20", "--num-blocks", "10"]
        flood = ["--generate", "flood", "--num-blocks", "101"]
        seq = "engine mode only (--mode engine), not --mode sequential"
        for args, message in [
                (trace + ["--max-running", "4"], "--max-running: " + seq),
                (trace + ["--max-batched-tokens", "512"], "--max-batched-tokens: " + seq),
                (trace + ["--step-ms", "5"], "--step-ms: " + seq),
                (trace + ["--schedule", "fcfs"], "--schedule: " + seq),
                (trace + ["--host-blocks", "10", "--host-gbps", "5"], "--host-gbps: " + seq),
                (trace + ["--arrival-rate-scale", "2"], "--arrival-rate-scale: " + seq),
                (trace + ["--mode", "sequential", "--step-ms", "5"], "--step-ms: " + seq),
                (engine + ["--threads", "1"], "--threads: sequential mode only, not --mode engine"),
                (engine + ["--max-candidates", "8"],
                 "--max-candidates: only with --schedule prefix (--mode engine), not --schedule "
                 "fcfs"),
                (engine + ["--schedule", "fcfs", "--max-passed-over", "8"],
                 "--max-passed-over: only with --schedule prefix"),
                (chat + ["--no-retention"],
                 "--no-retention: applies to --generate flood only, not to --generate chat"),
                (trace + ["--retention-priority", "50"],
                 "--retention-priority: applies to --generate flood only, not to --trace"),
                (chat + ["--retention-duration", "5"],
                 "--retention-duration: applies to --generate flood only"),
                (trace + ["--requests", "5"],
                 "--requests: applies to --generate only, not to --trace"),
                (trace + ["--seed", "3"], "--seed: applies to --generate only, not to --trace"),
                (trace + ["--tenants", "3"],
                 "--tenants: applies to --generate only, not to --trace"),
                (chat + ["--tenants", "3"],
                 "--tenants: applies to --generate tenants only, not to --generate chat"),
                (flood + ["--requests", "5"], "--requests: does not apply to --generate flood"),
                (flood + ["--limit", "5"], "--limit: does not apply to --generate flood"),
                (chat + ["--format", "azure"],
                 "--format: applies to --trace only, not to --generate chat"),
                (chat + ["--source-block-size", "64"],
                 "--source-block-size: applies to --trace only, not to --generate chat"),
                (flood + ["--skip-bad"],
                 "--skip-bad: applies to --trace only, not to --generate flood")]:
            expect_error(binary, args, d, 2, message)
        # Where they apply, they run.
        for args in [engine + ["--max-running", "4", "--step-ms", "5", "--arrival-rate-scale", "2"],
                     engine + ["--schedule", "prefix", "--max-candidates", "8"],
                     trace + ["--threads", "1", "--skip-bad", "--source-block-size", "64",
                              "--format", "hashids", "--limit", "3"],
                     ["--generate", "tenants", "--tenants", "3", "--requests", "30", "--seed", "4",
                      "--limit", "7", "--num-blocks", "10"],
                     flood + ["--seed", "2", "--no-retention"]]:
            p = run(binary, args, d)
            assert p.returncode == 0, f"{args}: rc {p.returncode}\n{p.stderr[-2000:]}"

        # Engine k publishes on port + k (built with pagedkv::events only).
        if "--engines" in run(binary, ["--help"], d).stdout:
            expect_error(binary, ["--trace", ok, "--num-blocks", "10", "--engines", "2",
                                  "--kv-events", "tcp://127.0.0.1:65535"], d, 1,
                         "is not a TCP port")

        # gzip: concatenated members are one trace (as gzip -d reads them); bytes after the last
        # member that are not gzip are an error naming the file (zlib's gzread ignored them).
        with open(ok, "rb") as f:
            member = gzip.compress(f.read())
        two = os.path.join(d, "two.jsonl.gz")
        with open(two, "wb") as f:
            f.write(member + member)
        p = run(binary, ["--trace", two, "--num-blocks", "10"], d)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout.strip().splitlines()[-1])["requests"] == 16, p.stdout
        junk = os.path.join(d, "junk.jsonl.gz")
        with open(junk, "wb") as f:
            f.write(member + b"garbage\n")
        expect_error(binary, ["--trace", junk, "--num-blocks", "10"], d, 1,
                     f"trace file '{junk}': the bytes after the gzip stream's end at byte "
                     f"{len(member)} are not gzip data")
        expect_error(binary, ["--trace", junk, "--num-blocks", "10", "--skip-bad"], d, 1,
                     "are not gzip data")

        # No requests.
        empty = os.path.join(d, "empty.jsonl")
        open(empty, "w").close()
        expect_error(binary, ["--trace", empty, "--num-blocks", "10"], d, 1, "no requests")
    print("replay_hostile_cli: every case as expected")


if __name__ == "__main__":
    main()
