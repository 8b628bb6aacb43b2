"""Hashing from Python equals the C++ known-answer vectors (tests/hash/hash_vectors.txt)."""

import hashlib
import os

import numpy as np
import pytest

import pagedkv

VECTORS = os.environ.get(
    "PAGEDKV_HASH_VECTORS",
    os.path.join(os.path.dirname(__file__), "..", "..", "tests", "hash", "hash_vectors.txt"))


def load_vectors():
    out = []
    with open(VECTORS) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            scheme, seed, bs, toks, lora, salt, mm, hashes = line.split("|")
            items = []
            if mm != "-":
                for item in mm.split(";"):
                    ident, off, length = item.rsplit(":", 2)
                    items.append((ident, int(off), int(length)))
            out.append(dict(scheme=scheme, seed=seed, block_size=int(bs),
                            tokens=[int(t) for t in toks.split(",")] if toks else [],
                            lora=None if lora == "-" else lora, salt=None if salt == "-" else salt,
                            mm=items, hashes=hashes.split(",") if hashes else []))
    return out


def test_vectors_file_is_not_empty():
    vectors = load_vectors()
    assert len(vectors) >= 20
    assert {v["scheme"] for v in vectors} == {"sha256", "sha256_cbor_vllm", "xxh3_128"}


@pytest.mark.parametrize("v", load_vectors(), ids=lambda v: f"{v['scheme']}-{v['block_size']}")
def test_hash_vectors(v):
    h = pagedkv.BlockHasher(v["scheme"], v["seed"])
    got = h.hash_blocks(np.asarray(v["tokens"], dtype=np.int32), v["block_size"],
                        cache_salt=v["salt"], lora_name=v["lora"], mm_items=v["mm"])
    assert [d.hex() for d in got] == v["hashes"]
    # A Request hashes the same, whether the prompt comes at once or a token at a time.
    r = pagedkv.Request(1, v["tokens"], h, v["block_size"], cache_salt=v["salt"],
                        lora_name=v["lora"], mm_items=v["mm"])
    assert [d.hex() for d in r.block_hashes] == v["hashes"]
    r2 = pagedkv.Request(2, v["tokens"][:1], h, v["block_size"], cache_salt=v["salt"],
                         lora_name=v["lora"], mm_items=v["mm"])
    for t in v["tokens"][1:]:
        r2.append_token(t)
    assert r2.block_hashes == r.block_hashes


def test_vllm_reference_vector_and_chain():
    h = pagedkv.BlockHasher(pagedkv.HashScheme.SHA256_CBOR_VLLM)  # default seed vllm-none-hash
    b0 = h.hash_block(None, range(16))
    b1 = h.hash_block(b0, range(16, 32))
    assert b0.hex() == "dc918a88b139e5afe60b88eda27508d4aee16c10fdc354791efea06206ac0749"
    assert b1.hex() == "c300ec275d7bf08af8fc63e76cdc0086911bbc7091e03c5cf892553bef84ef0c"
    # The bytes hashed are the documented CBOR, and the digest is their plain SHA-256.
    enc = h.encode_block(None, range(16))
    assert enc[:1] == b"\x83" and hashlib.sha256(enc).digest() == b0
    assert pagedkv.raw_digest("sha256_cbor_vllm", enc) == b0


def test_event_id_is_last_eight_bytes_big_endian():
    d = bytes(range(32))
    assert pagedkv.event_id(d) == int.from_bytes(d[-8:], "big")
    assert pagedkv.event_id(bytes(range(16))) == int.from_bytes(bytes(range(8, 16)), "big")
    with pytest.raises(pagedkv.Error) as e:
        pagedkv.event_id(b"short")
    assert e.value.code == pagedkv.ErrorCode.INVALID_ARGUMENT


def test_salt_and_lora_change_every_hash():
    h = pagedkv.BlockHasher("sha256", "s")
    plain = h.hash_blocks(range(64), 16)
    salted = h.hash_blocks(range(64), 16, cache_salt="tenant")
    lora = h.hash_blocks(range(64), 16, lora_name="adapter")
    assert len(plain) == 4
    assert all(a != b for a, b in zip(plain, salted))
    assert all(a != b for a, b in zip(plain, lora))
    assert h.hash_blocks(range(63), 16) == plain[:3]  # the partial tail is never hashed


def test_seeds_and_schemes():
    assert pagedkv.BlockHasher("sha256", "a") == pagedkv.BlockHasher("sha256", "a")
    assert pagedkv.BlockHasher("sha256", "a").none_hash != pagedkv.BlockHasher("sha256", "b").none_hash
    assert pagedkv.BlockHasher("sha256").none_hash != pagedkv.BlockHasher("sha256").none_hash
    assert pagedkv.BlockHasher("xxh3_128", "a").digest_size == 16
    assert pagedkv.digest_size(pagedkv.HashScheme.SHA256) == 32
    with pytest.raises(pagedkv.Error) as e:
        pagedkv.BlockHasher("md5")
    assert e.value.code == pagedkv.ErrorCode.PARSE_ERROR


@pytest.mark.parametrize("bad", [[2**31], [-1], [1.5], np.array([2**40], dtype=np.int64),
                                 np.array([2**63], dtype=np.uint64), [[1, 2]],
                                 [True, 2], (1, False), [1, np.True_], np.array([True]),
                                 np.array([1.0]), [1, "2"]])
def test_bad_tokens_raise_never_wrap(bad):
    h = pagedkv.BlockHasher("sha256", "s")
    with pytest.raises(pagedkv.Error) as e:
        h.hash_blocks(bad, 1)
    assert e.value.code == pagedkv.ErrorCode.INVALID_ARGUMENT
    assert isinstance(e.value, RuntimeError)


def test_token_inputs_of_any_integer_type_agree():
    h = pagedkv.BlockHasher("xxh3_128", "s")
    ref = h.hash_blocks(np.arange(48, dtype=np.int32), 16)
    for t in (list(range(48)), range(48), np.arange(48, dtype=np.int64),
              np.arange(48, dtype=np.uint16), np.arange(96, dtype=np.int32)[::2] // 2):
        assert h.hash_blocks(t, 16) == ref


def test_token_list_changed_by_an_items_index_is_read_safely():
    """A hostile item's __index__ empties the list being converted: no read past its end."""
    class Shrinking:
        def __init__(self, target):
            self.target = target

        def __index__(self):
            self.target.clear()
            return 1

    toks = [0, 1, 2, 3]
    toks[1] = Shrinking(toks)
    h = pagedkv.BlockHasher("sha256", "s")
    assert len(h.hash_blocks(toks, 1)) == 2   # 0 and the shrinking item's 1, then the list ended
