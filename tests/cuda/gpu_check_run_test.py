#!/usr/bin/env python3
"""ctest gpu_check_run: parts of `scripts/gpu-check run` that need no GPU, on stand-ins.

pack-dumps, which packs the failing GPU cases' dumps (*.pkvdump, tests/util/attention_dump.hpp)
into the one archive a device call brings back.

Checks, with incompressible made-up dumps and small limits: the smallest dumps are kept, halving
the count until the archive fits; other files are left out; nothing is written (and any old
archive is removed) when no dump fits or there is none; a missing folder means none. Then
`gpu-check run` (tests step only) on a made-up gpu-check folder whose gpu_info and test programs
are shell scripts: failing tests that wrote dumps into PAGEDKV_TEST_DUMP_DIR give dumps.tgz and
a summary line; passing tests leave neither the archive nor the dump folder. And the
compute-sanitizer step, with a stand-in compute-sanitizer on PATH that logs when each case starts
and ends: every case of the script's CASES block is reported once, in the block's order, with its
exit status and wall time; a failing case fails the step and is named in the summary; at most
PAGEDKV_GPU_SANITIZER_JOBS cases run at once, and with 3 allowed, several do.

usage: gpu_check_run_test.py GPU_CHECK_SCRIPT   (exit 0 = pass)
"""
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile


def pack(script, src, archive, limit):
    env = dict(os.environ, PAGEDKV_GPU_DUMPS_MAX_BYTES=str(limit))
    run = subprocess.run(["bash", script, "pack-dumps", str(src), str(archive)], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    return run.returncode, (run.stdout + run.stderr).strip()


def run_with_fakes(script, root, expect):
    """gpu-check run's tests step on shell-script stand-ins for gpu_info and the test programs."""
    (root / "bin").mkdir(parents=True)
    (root / "BUILD_INFO").write_text("made-up build\n")
    scripts = {
        "gpu_info": "#!/bin/sh\necho 'device 0: Made-up GPU, cc 9.0'\necho 'CUDA driver 13.0'\n",
        # Writes a dump named after its argument, then fails, as a failing extend case does.
        "failing_test": "#!/bin/sh\nhead -c 5000 /dev/urandom "
                        "> \"$PAGEDKV_TEST_DUMP_DIR/Case_$1-seed1-0.pkvdump\"\n"
                        "echo \"fingerprint: 7 of 9 rows over 0.01 ($1)\"\n"
                        "echo \"[  FAILED  ] Made.Up/$1\"\nexit 1\n",
        "passing_test": "#!/bin/sh\necho '[  PASSED  ] 1 test.'\nexit 0\n",
        # One of the programs the SASS step hands to cuobjdump (which fails on it below).
        "cuda_fp8_test": "#!/bin/sh\nexit 0\n",
    }
    for name, text in scripts.items():
        path = root / "bin" / name
        path.write_text(text)
        path.chmod(0o755)

    # A cuobjdump that fails (as on a GPU machine whose toolkit cannot read a program): the SASS
    # step must report, not end the run.
    tools = root / "tools"
    tools.mkdir()
    (tools / "cuobjdump").write_text("#!/bin/sh\necho 'cuobjdump: cannot read' >&2\nexit 1\n")
    (tools / "cuobjdump").chmod(0o755)

    def run(tsv, cuobjdump=False):
        (root / "tests.tsv").write_text(tsv)
        out = root / "out"
        subprocess.run(["rm", "-rf", str(out)], check=True)
        out.mkdir()
        env = dict(os.environ, OUT=str(out), PAGEDKV_GPU_CHECK_STEPS="tests")
        if cuobjdump:
            env["PATH"] = f"{tools}:{os.environ.get('PATH', '')}"
        env.pop("PAGEDKV_TEST_DUMP_DIR", None)
        done = subprocess.run(["bash", script, "run", str(root)], env=env, capture_output=True,
                              text=True, timeout=120, check=False)
        return done.returncode, out

    rc, out = run("a\tfailing_test\tA\nb\tfailing_test\tB\nok\tpassing_test\n", cuobjdump=True)
    summary = (out / "summary.txt").read_text() if (out / "summary.txt").is_file() else ""
    expect(rc != 0 and "VERDICT: FAIL" in summary, f"failing run: exit {rc}, summary:\n{summary}")
    expect("dumps: 2 of 2 failing cases in dumps.tgz" in summary, f"summary:\n{summary}")
    expect("    fingerprint: 7 of 9 rows over 0.01 (A)" in summary.splitlines(),
           f"no fingerprint line in the summary:\n{summary}")
    if (out / "dumps.tgz").is_file():
        with tarfile.open(out / "dumps.tgz") as t:
            names = sorted(m.name for m in t.getmembers())
        expect(names == ["Case_A-seed1-0.pkvdump", "Case_B-seed1-0.pkvdump"],
               f"dumps.tgz holds {names}")
    else:
        failures_note = "no dumps.tgz after failing tests that wrote dumps"
        expect(False, failures_note)
    expect(sorted(p.name for p in out.iterdir()) ==
           ["device.txt", "dumps.tgz", "log.txt", "summary.txt", "tests.txt"],
           f"files left in the results: {sorted(p.name for p in out.iterdir())}")
    expect("SASS: no attention kernel found" in summary, f"the SASS step reported:\n{summary}")

    rc, out = run("ok\tpassing_test\n")
    summary = (out / "summary.txt").read_text() if (out / "summary.txt").is_file() else ""
    expect(rc == 0 and "VERDICT: PASS" in summary, f"passing run: exit {rc}, summary:\n{summary}")
    expect(sorted(p.name for p in out.iterdir()) == ["device.txt", "log.txt", "summary.txt",
                                                     "tests.txt"],
           f"a passing run's files: {sorted(p.name for p in out.iterdir())}")


def sanitizer_with_fakes(script, root, expect):
    """gpu-check run's sanitizer step with a stand-in compute-sanitizer."""
    text = pathlib.Path(script).read_text()
    cases = [c for c in text.split("<<'CASES'\n", 1)[1].split("\nCASES\n", 1)[0].splitlines()
             if c.strip()]
    expect(len(cases) >= 10, f"only {len(cases)} sanitizer cases found in the script")
    failing = cases[1].split()  # tool, program, gtest filter (unique in the list)
    expect(len(failing) == 3 and sum(c.split()[2:3] == failing[2:3] for c in cases) == 1,
           f"the second case is not a unique tool / program / filter line: {cases[1]}")
    (root / "bin").mkdir(parents=True)
    (root / "BUILD_INFO").write_text("made-up build\n")
    gpu_info = root / "bin" / "gpu_info"
    gpu_info.write_text("#!/bin/sh\necho 'device 0: Made-up GPU, cc 9.0'\n")
    gpu_info.chmod(0o755)
    (root / "tests.tsv").write_text("")
    tools = root / "tools"
    tools.mkdir()
    log = root / "starts.log"
    # --tool T --error-exitcode 3 PROGRAM ARGS...: logs start and end (nanoseconds), sleeps, and
    # fails the one case whose first argument names the made-up failing filter.
    fake = tools / "compute-sanitizer"
    fake.write_text(
        "#!/bin/bash\n"
        "[ \"$1\" = --version ] && { echo 'made-up sanitizer'; exit 0; }\n"
        f"echo \"start $(date +%s%N)\" >> {log}\n"
        "sleep 0.15\n"
        f"echo \"end $(date +%s%N)\" >> {log}\n"
        "echo \"ran $*\"\n"
        f"[ \"$2\" = '{failing[0]}' ] && [ \"$6\" = '{failing[2]}' ] && exit 3\n"
        "exit 0\n")
    fake.chmod(0o755)
    out = root / "out"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), PAGEDKV_GPU_CHECK_STEPS="sanitizer",
               PAGEDKV_GPU_SANITIZER_JOBS="3", PATH=f"{tools}:{os.environ.get('PATH', '')}")
    done = subprocess.run(["bash", script, "run", str(root)], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    report = (out / "sanitizer.txt").read_text() if (out / "sanitizer.txt").is_file() else ""
    summary = (out / "summary.txt").read_text() if (out / "summary.txt").is_file() else ""
    heads = [line[len("===== "):].rstrip() for line in report.splitlines()
             if line.startswith("===== ") and " exit " not in line]
    expect(heads == [c.split()[0] + ": " + " ".join(c.split()[1:]) for c in cases],
           f"reports not in the CASES order: {heads[:3]}...")
    exits = [line for line in report.splitlines() if line.startswith("===== ") and " exit " in line]
    expect(len(exits) == len(cases), f"{len(exits)} exit lines for {len(cases)} cases")
    bad = [e for e in exits if " exit 0 (" not in e]
    expect(len(bad) == 1 and " exit 3 (" in bad[0] and bad[0] == exits[1],
           f"failing cases reported: {bad}")
    expect(done.returncode != 0 and f"1 of {len(cases)} runs reported errors" in summary,
           f"exit {done.returncode}, summary:\n{summary}")
    # Concurrency from the start / end log: never more than 3 at once, and more than 1.
    events = []
    for line in (log.read_text().splitlines() if log.is_file() else []):
        kind, ns = line.split()
        events.append((int(ns), 1 if kind == "start" else -1))
    events.sort(key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    expect(len(events) == 2 * len(cases), f"{len(events)} start / end events")
    expect(1 < peak <= 3, f"at most {peak} cases ran at once (3 allowed)")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    script = sys.argv[1]
    failures = []

    def expect(cond, what):
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        src = tmp / "dumps"
        src.mkdir()
        sizes = {"a-seed1-0.pkvdump": 1000, "b-seed2-0.pkvdump": 3000,
                 "c-seed3-0.pkvdump": 9000, "d-seed4-0.pkvdump": 20000}
        for name, size in sizes.items():
            (src / name).write_bytes(os.urandom(size))
        (src / "notes.txt").write_bytes(os.urandom(100))
        archive = tmp / "dumps.tgz"

        # All four: about 33 KB of random bytes. A limit of 14,000 keeps two (4,000 bytes).
        rc, out = pack(script, src, archive, 14000)
        expect(rc == 0, f"pack-dumps exited {rc}: {out}")
        expect(out.startswith("dumps: 2 of 4 failing cases in dumps.tgz"), f"message: {out}")
        expect(archive.is_file() and archive.stat().st_size <= 14000, "archive over the limit")
        if archive.is_file():
            with tarfile.open(archive) as t:
                names = sorted(m.name for m in t.getmembers())
            expect(names == ["a-seed1-0.pkvdump", "b-seed2-0.pkvdump"], f"archive holds {names}")
            with tarfile.open(archive) as t:
                data = t.extractfile("b-seed2-0.pkvdump").read()
            expect(data == (src / "b-seed2-0.pkvdump").read_bytes(), "a dump changed in the archive")

        # A generous limit keeps every dump (and no other file).
        rc, out = pack(script, src, archive, 1 << 20)
        expect(rc == 0 and out.startswith("dumps: 4 of 4 failing cases"), f"message: {out}")
        if archive.is_file():
            with tarfile.open(archive) as t:
                names = sorted(m.name for m in t.getmembers())
            expect(names == sorted(sizes), f"archive holds {names}")

        # None fits: no archive (the old one removed).
        rc, out = pack(script, src, archive, 500)
        expect(rc == 0, f"pack-dumps exited {rc}: {out}")
        expect("4 failing cases dumped, none fits in 500 bytes" in out, f"message: {out}")
        expect(not archive.exists(), "an archive was left although none fits")

        # No dump, or no folder: none, nothing written.
        empty = tmp / "empty"
        empty.mkdir()
        rc, out = pack(script, empty, archive, 14000)
        expect(rc == 0 and out == "dumps: none" and not archive.exists(), f"empty folder: {out}")
        rc, out = pack(script, tmp / "missing", archive, 14000)
        expect(rc == 0 and out == "dumps: none" and not archive.exists(), f"missing folder: {out}")

        run_with_fakes(script, tmp / "fake", expect)
        sanitizer_with_fakes(script, tmp / "sanitizer", expect)

    for f in failures:
        print("FAIL:", f)
    print("gpu_check_run:", "PASS" if not failures else f"{len(failures)} failures")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
