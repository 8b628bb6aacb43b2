"""The benchmark scripts' trace readers (python/bench/mooncake.py, and bench/trace_turns.py through
it) check every line: a malformed one is an error naming the file and line, never a traceback
from deep inside the replay or a silently wrong figure. No trace file needed."""

import gzip
import os
import subprocess
import sys

import pytest

import mooncake

TRACE_TURNS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                           "trace_turns.py")
GOOD = '{"timestamp":%d,"input_length":1024,"output_length":4,"hash_ids":[1,%d]}'


def write(tmp_path, lines, name="t.jsonl", compress=False):
    path = tmp_path / name
    data = ("\n".join(lines) + "\n").encode() if isinstance(lines, list) else lines
    path.write_bytes(gzip.compress(data) if compress else data)
    return str(path)


@pytest.mark.parametrize("compress", [False, True])
def test_a_good_trace_loads(tmp_path, compress):
    path = write(tmp_path, [GOOD % (0, 2), "", GOOD % (5, 3), '{"input_length":1.0e3,'
                            '"hash_ids":[7,8.0],"extra":{"nested":[1,2]}}'], compress=compress)
    assert mooncake.load(path) == [(1024, [1, 2]), (1024, [1, 3]), (1000, [7, 8])]
    assert mooncake.load(path, limit=2) == [(1024, [1, 2]), (1024, [1, 3])]
    records = mooncake.read_trace(path, required=mooncake.FIELDS, limit=1)
    assert records == [{"timestamp": 0, "input_length": 1024, "output_length": 4,
                        "hash_ids": [1, 2]}]


# (line 3 of the file, what the error says); lines 1 and 2 are good and blank.
BAD = [
    ('{"input_length":1024,"hash_ids":[1,2]', "not JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('"text"', "expected a JSON object, got str"),
    ('{"input_length":1024}', "field 'hash_ids' is missing"),
    ('{"hash_ids":[1,2]}', "field 'input_length' is missing"),
    ('{"input_length":1024,"hash_ids":["7"]}', "field 'hash_ids': id 0 is '7'"),
    ('{"input_length":1024,"hash_ids":[1,-1]}', "field 'hash_ids': id 1 is -1"),
    ('{"input_length":1024,"hash_ids":[1.5]}', "field 'hash_ids': id 0 is 1.5"),
    ('{"input_length":1024,"hash_ids":[true]}', "field 'hash_ids': id 0 is True"),
    ('{"input_length":1024,"hash_ids":[4294967296]}', "expected an integer in [0, 4294967295]"),
    ('{"input_length":1024,"hash_ids":[null]}', "field 'hash_ids': id 0 is None"),
    ('{"input_length":1024,"hash_ids":7}', "field 'hash_ids': expected an array, got int"),
    ('{"input_length":1024,"hash_ids":[1,2,3]}', "3 ids for 1024 tokens at source block size 512"),
    ('{"input_length":1073741824,"hash_ids":[1]}',
     "field 'input_length': 1073741824 tokens is more than the limit of 16777216"),
    ('{"input_length":1e300,"hash_ids":[1]}', "tokens is more than the limit"),
    ('{"input_length":-5,"hash_ids":[1]}', "field 'input_length': expected a non-negative integer"),
    ('{"input_length":"1024","hash_ids":[1]}', "field 'input_length': expected a non-negative"),
    ('{"input_length":0,"hash_ids":[]}', "a prompt has at least one token"),
    ('{"input_length":10,"output_length":-1,"hash_ids":[1]}', "field 'output_length'"),
    ('{"input_length":10,"input_length":20,"hash_ids":[1]}', "field 'input_length' appears twice"),
    ('{"timestamp":NaN,"input_length":10,"hash_ids":[1]}', "'NaN' is not a number"),
    ('{"timestamp":1e16,"input_length":10,"hash_ids":[1]}', "outside [-1e15, 1e15] ms"),
    ('{"timestamp":"noon","input_length":10,"hash_ids":[1]}', "field 'timestamp': expected a num"),
    ("[" * 100000 + "]" * 100000, "not JSON"),
]


@pytest.mark.parametrize("line,message", BAD)
def test_a_malformed_line_is_an_error_naming_it(tmp_path, line, message):
    path = write(tmp_path, [GOOD % (0, 2), "", line, GOOD % (9, 3)])
    with pytest.raises(mooncake.TraceError) as e:
        mooncake.load(path)
    assert str(e.value).startswith(f"{path}:3: "), str(e.value)
    assert message in str(e.value), str(e.value)
    # Past the limit, the bad line is not read.
    assert mooncake.load(path, limit=1) == [(1024, [1, 2])]


def test_bytes_that_are_not_utf8_or_not_gzip(tmp_path):
    path = write(tmp_path, (GOOD % (0, 2) + "\n" + '{"input_length":5,"hash_ids":[1]}\xff\n')
                 .encode("latin-1"))
    with pytest.raises(mooncake.TraceError, match=r":2: not UTF-8"):
        mooncake.load(path)
    cut = gzip.compress(((GOOD % (0, 2) + "\n") * 1000).encode())[:-40]
    path = write(tmp_path, cut, name="cut.jsonl.gz")
    with pytest.raises(mooncake.TraceError, match="cannot read"):
        mooncake.load(path)


def test_a_line_past_the_length_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(mooncake, "MAX_LINE_BYTES", 100)  # 64 MiB, as trace.cpp's
    line = GOOD % (0, 2)
    path = write(tmp_path, [line.ljust(100), line.ljust(101)])  # 100 bytes pass, 101 do not
    with pytest.raises(mooncake.TraceError, match=r":2: line longer than 100 bytes"):
        mooncake.load(path)


def run_trace_turns(path):
    return subprocess.run([sys.executable, TRACE_TURNS, path], capture_output=True, text=True,
                          timeout=120)


def test_trace_turns_reads_through_the_checked_reader(tmp_path):
    ok = write(tmp_path, [GOOD % (0, 2), GOOD % (1500, 3), "", GOOD % (4000, 4)], compress=True)
    p = run_trace_turns(ok)
    assert p.returncode == 0, p.stderr
    assert "turn  requests  P(next turn)" in p.stdout
    # A float timestamp is a number like any other (int() before bit_length()).
    floats = write(tmp_path, [GOOD % (0, 2), '{"timestamp":2500.5,"input_length":1536,'
                              '"output_length":4,"hash_ids":[1,2,3]}'], name="f.jsonl")
    p = run_trace_turns(floats)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("line,message", [
    ('{"timestamp":1,"input_length":1024,"output_length":4,"hash_ids":[1,-2]}',
     "field 'hash_ids': id 1 is -2"),
    ('{"timestamp":1,"input_length":1024,"hash_ids":[1,2]}', "field 'output_length' is missing"),
    ('{"input_length":1024,"output_length":4,"hash_ids":[1,2]}', "field 'timestamp' is missing"),
    ('{"timestamp":1,"input_length":99999999,"output_length":4,"hash_ids":[1]}',
     "99999999 tokens is more than the limit"),
    ("not json", "not JSON"),
])
def test_trace_turns_names_the_bad_line(tmp_path, line, message):
    path = write(tmp_path, [GOOD % (0, 2), GOOD % (1, 3), line])
    p = run_trace_turns(path)
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    assert f"trace_turns.py: {path}:3: " in p.stderr, p.stderr
    assert message in p.stderr, p.stderr


def test_trace_turns_on_an_empty_or_missing_trace(tmp_path):
    p = run_trace_turns(write(tmp_path, b""))
    assert p.returncode == 1 and "no requests" in p.stderr, p.stderr
    p = run_trace_turns(str(tmp_path / "absent.jsonl"))
    assert p.returncode == 1 and "No such file" in p.stderr and "Traceback" not in p.stderr
