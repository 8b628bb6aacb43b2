#!/usr/bin/env python3
"""Compares the machine code of functions between two builds, function by function.

A source file split or a code move should leave the hot paths' code as it was: when the
instructions of a function are the same before and after, its speed is too, whatever the
machine's noise. This tool disassembles every function of the given object files (objdump), drops
what moves with layout alone (addresses, relocation offsets, the order of functions and the
files they sit in), and reports each function that is new, gone, or different.

usage: bench/codegen_diff.py --before A.o [B.o ...] --after C.o [D.o ...] [--only REGEX]
                             [--show NAME]
Exit status: 0 when every compared function is the same, 1 otherwise.
"""
import argparse
import re
import subprocess
import sys

FUNC = re.compile(r"^[0-9a-f]+ <(.+)>:$")
# An instruction line: "  1f:\tmov    %rax,%rbx" (raw bytes are not shown).
INSN = re.compile(r"^\s*[0-9a-f]+:\s*(.*)$")
RELOC = re.compile(r"^\s*[0-9a-f]+:\s*(R_X86_64_\S+)\s+(.*)$")


def normalize_operand(text):
    # Jump targets inside the function print as "<name+0x1f>"; the offsets are the same when the
    # code is, but the absolute address before them is not.
    text = re.sub(r"\b[0-9a-f]+ <", "<", text)
    text = re.sub(r"\.LC\d+", ".LC", text)
    return text.strip()


def functions(objects):
    out = {}

    def put(name, body):  # a name seen twice (e.g. in two objects) keeps both, numbered
        key, k = name, 2
        while key in out:
            key, k = f"{name} #{k}", k + 1
        out[key] = body

    for obj in objects:
        dump = subprocess.run(["objdump", "-d", "-r", "--no-show-raw-insn", "-C", obj],
                              check=True, capture_output=True, text=True).stdout
        name, body = None, []
        for line in dump.splitlines():
            m = FUNC.match(line)
            if m:
                if name is not None:
                    put(name, body)
                name, body = m.group(1), []
                continue
            if name is None:
                continue
            r = RELOC.match(line)
            if r:
                # The relocation's symbol matters (which function is called), its addend's
                # exact value only when it is not a section-relative constant-pool offset.
                target = re.sub(r"\.(text|rodata)[.\w]*(\+0x[0-9a-f]+|-0x[0-9a-f]+)?", r".\1",
                                r.group(2))
                # Local constants are numbered per file (.LC37 in one build is .LC29 in another).
                target = re.sub(r"\.LC\d+", ".LC", target)
                body.append("reloc " + r.group(1) + " " + target)
                continue
            m = INSN.match(line)
            if m and m.group(1):
                body.append(normalize_operand(m.group(1)))
        if name is not None:
            put(name, body)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", nargs="+", required=True)
    p.add_argument("--after", nargs="+", required=True)
    p.add_argument("--only", default=None, help="compare only functions matching this regex")
    p.add_argument("--show", default=None, help="print both versions of the functions matching")
    a = p.parse_args()
    before, after = functions(a.before), functions(a.after)
    only = re.compile(a.only) if a.only else None
    names = sorted(set(before) | set(after))
    same = differ = 0
    for n in names:
        if only and not only.search(n):
            continue
        b, f = before.get(n), after.get(n)
        if b is None:
            print(f"new       {len(f):5d} insns  {n}")
            differ += 1
        elif f is None:
            print(f"gone      {len(b):5d} insns  {n}")
            differ += 1
        elif b != f:
            print(f"different {len(b):5d} -> {len(f):5d} insns  {n}")
            differ += 1
        else:
            same += 1
        if a.show and re.search(a.show, n) and b != f:
            print("--- before\n" + "\n".join(b or []) + "\n--- after\n" + "\n".join(f or []))
    print(f"{same} functions the same, {differ} new, gone or different")
    return 0 if differ == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
