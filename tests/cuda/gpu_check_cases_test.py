#!/usr/bin/env python3
"""ctest gpu_check_cases: every test the one-shot GPU run names exists.

scripts/gpu-check run lists its compute-sanitizer cases (the CASES block: tool, program, gtest
filter) and runs the gpu tests of the build's gpu-tests.tsv (name, program, arguments). A gtest
filter that matches no test makes its program pass having run nothing, so a renamed test would
silently drop out of the only run that checks the kernels on a device, and a device test
that no gpu-tests.tsv entry selects never runs anywhere. This test lists each program's tests
(--gtest_list_tests: no device needed) and fails when a positive pattern of any filter matches
none, a filter selects nothing (after its negative patterns), a device test of a gpu program (one
not matching HOST_FILTER, the suites its <name>_host entry runs here) is selected by none of the
program's gpu-tests.tsv entries, a named program is not built, or a case names an unknown tool.

usage: gpu_check_cases_test.py GPU_CHECK_SCRIPT BUILD_TREE HOST_FILTER
  Checks the script's CASES against BUILD_TREE/tests/<program> and BUILD_TREE/gpu-tests.tsv
  (non-gtest programs, the tiny engine, are checked to exist in BUILD_TREE). Exit 0 = every
  pattern matches and every device test runs; 1 = problems (each printed); 2 = usage or parse
  error.

Self-test: gpu_check_cases_test.py --self-test checks the filter semantics on made-up names (a
pattern that matches nothing, negative patterns, '?' and '*').
"""
import fnmatch
import pathlib
import subprocess
import sys

TOOLS = {"memcheck", "racecheck", "synccheck", "initcheck"}


def gtest_names(program):
    """The program's tests as Suite.Name (parameterized: Prefix/Suite.Name/Param)."""
    run = subprocess.run([str(program), "--gtest_list_tests"], capture_output=True, text=True,
                         timeout=120, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"{program} --gtest_list_tests exited {run.returncode}")
    names, suite = [], None
    for line in run.stdout.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            suite = line.split()[0]
        elif suite is not None:
            names.append(suite + line.split()[0])
    return names


def split_filter(filter_text):
    """gtest's filter: 'POSITIVE[-NEGATIVE]', each ':'-separated; no positive part means '*'."""
    positive, _, negative = filter_text.partition("-")
    return ([p for p in positive.split(":") if p] or ["*"],
            [p for p in negative.split(":") if p])


def matches(name, patterns):
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def unmatched(filter_text, names):
    """Positive patterns of a gtest filter that match none of names."""
    positive, _ = split_filter(filter_text)
    return [p for p in positive if not any(fnmatch.fnmatchcase(n, p) for n in names)]


def selected(filter_text, names):
    """The tests a gtest filter runs (DISABLED_ tests never run)."""
    positive, negative = split_filter(filter_text)
    return [n for n in names if "DISABLED_" not in n and matches(n, positive) and
            not matches(n, negative)]


def cases_of(script_text):
    """The sanitizer cases of scripts/gpu-check: lists of words."""
    try:
        block = script_text.split("<<'CASES'\n", 1)[1].split("\nCASES\n", 1)[0]
    except IndexError as exc:
        raise RuntimeError("no CASES block in the gpu-check script") from exc
    return [line.split() for line in block.splitlines() if line.strip()]


def check(script, tree, host_filter):
    problems = []
    listed = {}
    covered = {}  # gpu program -> the tests its gpu-tests.tsv entries select

    def names_of(program):
        if program not in listed:
            path = tree / "tests" / program
            listed[program] = gtest_names(path) if path.exists() else None
        return listed[program]

    def check_run(where, program, args):
        if not program.endswith("_test"):
            found = list(tree.rglob(program))
            if not found:
                problems.append(f"{where}: program {program} not found under {tree}")
            return []
        names = names_of(program)
        if names is None:
            problems.append(f"{where}: {program} is not built in {tree / 'tests'}")
            return []
        filters = [a.split("=", 1)[1] for a in args if a.startswith("--gtest_filter=")]
        filter_text = filters[-1] if filters else "*"
        for pattern in unmatched(filter_text, names):
            problems.append(f"{where}: {program}: '{pattern}' matches no test")
        runs = selected(filter_text, names)
        if not runs:
            problems.append(f"{where}: {program}: the filter '{filter_text}' selects no test")
        return runs

    cases = cases_of(script.read_text())
    for i, words in enumerate(cases, 1):
        if len(words) < 2 or words[0] not in TOOLS:
            problems.append(f"case {i}: not '<tool> <program> ...': {' '.join(words)}")
            continue
        check_run(f"case {i} ({words[0]})", words[1], words[2:])
    tsv = tree / "gpu-tests.tsv"
    runs = [line.split("\t") for line in tsv.read_text().splitlines() if line.strip()]
    for fields in runs:
        chosen = check_run(f"gpu test {fields[0]}", fields[1], fields[2:])
        if fields[1].endswith("_test"):
            covered.setdefault(fields[1], set()).update(chosen)
    host = split_filter(host_filter)[0]
    for program, chosen in sorted(covered.items()):
        for name in names_of(program) or []:
            if "DISABLED_" not in name and not matches(name, host) and name not in chosen:
                problems.append(f"{program}: device test {name} is in no gpu-tests.tsv entry")
    return len(cases), len(runs), problems


def self_test():
    names = ["A.x", "A.y/Simt", "P/B.z/TensorCore", "P/B.z/TensorCoreWideMerge"]
    assert unmatched("A.x", names) == []
    assert unmatched("A.q", names) == ["A.q"]
    assert unmatched("*B.z/TensorCore:*B.z/Fused", names) == ["*B.z/Fused"]
    assert unmatched("A.?/Simt", names) == []
    assert unmatched("-A.x", names) == []
    assert unmatched("A.*-A.y*", names) == []
    assert unmatched("Nope.*-A.y*", names) == ["Nope.*"]
    assert selected("A.*-A.*", names) == []
    assert selected("-*/*", names) == ["A.x"]
    assert selected("*/TensorCore", names) == ["P/B.z/TensorCore"]
    assert selected("-*/*:A.x", names) == []
    assert selected("*", names + ["C.DISABLED_w"]) == names
    assert cases_of("x <<'CASES'\nmemcheck a_test --gtest_filter=A.x\n\nCASES\n") == [
        ["memcheck", "a_test", "--gtest_filter=A.x"]]
    print("self-test: ok")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        n_cases, n_runs, problems = check(pathlib.Path(argv[1]), pathlib.Path(argv[2]), argv[3])
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        print(f"gpu_check_cases: {exc}", file=sys.stderr)
        return 2
    for p in problems:
        print(p)
    print(f"{n_cases} sanitizer cases, {n_runs} gpu tests: "
          f"{'every named test exists, every device test runs' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
