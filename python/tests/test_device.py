"""Block tables and slot mappings as numpy arrays (device/block_table.hpp)."""

import numpy as np
import pytest

import pagedkv


def test_make_block_table():
    t = pagedkv.make_block_table([[3, 4, 5], np.array([7], dtype=np.int32), []])
    assert t.dtype == np.int32 and t.shape == (3, 3) and t.flags.c_contiguous
    assert t.tolist() == [[3, 4, 5], [7, 0, 0], [0, 0, 0]]
    assert pagedkv.make_block_table([[1]], max_blocks_per_seq=4, pad_block_id=9).tolist() == \
        [[1, 9, 9, 9]]
    t[0, 0] = 11   # owns its data: writable, independent of anything else
    assert t[0, 0] == 11
    with pytest.raises(pagedkv.Error):
        pagedkv.make_block_table([[1, 2, 3]], max_blocks_per_seq=2)
    with pytest.raises(pagedkv.Error):
        pagedkv.make_block_table([[-1]])


def test_slot_mapping_and_slot_of():
    s = pagedkv.slot_mapping([3, 8], 4, 2, 5)
    assert s.dtype == np.int64 and s.tolist() == [14, 15, 32, 33, 34]
    assert pagedkv.slot_of([3, 8], 4, 5) == 33
    with pytest.raises(pagedkv.Error) as e:
        pagedkv.slot_of([3, 8], 4, 8)
    assert e.value.code == pagedkv.ErrorCode.OUT_OF_RANGE
    assert pagedkv.SKIP_SLOT == -1


def test_validate_block_table():
    t = pagedkv.make_block_table([[1, 2], [3]])
    pagedkv.validate_block_table(t, [8, 3], 4, 4)
    with pytest.raises(pagedkv.Error):
        pagedkv.validate_block_table(t, [8, 3], 4, 3)      # block 3 outside a 3-block pool
    with pytest.raises(pagedkv.Error):
        pagedkv.validate_block_table(t, [9, 3], 4, 4)      # 9 tokens need a third column


def test_stubs_cover_the_module():
    """_pagedkv.pyi names every public class and function of the compiled module, and every
    public method of its classes, so editors complete what exists."""
    import ast
    import os

    import pagedkv._pagedkv as mod

    stub = os.path.join(os.path.dirname(pagedkv.__file__), "_pagedkv.pyi")
    tree = ast.parse(open(stub).read())
    names, members = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            members[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)} | {
                n.target.id for n in node.body if isinstance(n, ast.AnnAssign)} | {
                t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets}
        if isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
    public = {n for n in dir(mod) if not n.startswith("_")}
    assert public - names == set()
    # ...and names nothing the module lacks (the publisher exists only with the events layer).
    optional = set() if mod.HAS_EVENTS else {"KVEventPublisher", "KVEventPublisherStats"}
    aliases = {"Tokens", "SchemeLike", "RequestLike", "KVEvent", "__version__"}
    assert names - public - optional - aliases == set()
    assert {"TieredKVCacheManager", "TierPlan", "KVEventPublisher"} <= names
    for cls, got in members.items():
        obj = getattr(mod, cls)
        if isinstance(obj, type) and not issubclass(obj, BaseException):
            want = {n for n in vars(obj) if not n.startswith("_")}
            if hasattr(obj, "__members__"):
                want -= set(obj.__members__) | {"name", "value"}
            assert want - got == set(), cls
    assert set(pagedkv.__all__) <= public | {"__version__"}


@pytest.mark.parametrize("call", [
    lambda: pagedkv.make_block_table([[1, 2.5]]),
    lambda: pagedkv.make_block_table([[True]]),
    lambda: pagedkv.slot_of([1.0], 4, 0),
    lambda: pagedkv.slot_of(np.array([True, False]), 4, 0),
    lambda: pagedkv.slot_mapping([1, True], 4, 0, 2),
    lambda: pagedkv.validate_block_table(np.array([[1.5, 2.0]]), [8], 4, 4),
    lambda: pagedkv.validate_block_table([[1.0, 2.0]], [8], 4, 4),
    lambda: pagedkv.validate_block_table(np.array([[True, True]]), [8], 4, 4),
    lambda: pagedkv.validate_block_table(np.array([[1, 2]], dtype=np.int32), [8.0], 4, 4),
    lambda: pagedkv.validate_block_table(np.array([[1, 2]], dtype=np.int32), [True], 4, 4),
], ids=["table float", "table bool", "slot_of float", "slot_of bool", "slot_mapping bool",
        "validate float array", "validate float list", "validate bool", "validate float lens",
        "validate bool lens"])
def test_block_ids_refuse_floats_and_bools(call):
    with pytest.raises(pagedkv.Error) as e:
        call()
    assert e.value.code == pagedkv.ErrorCode.INVALID_ARGUMENT, str(e.value)
    assert "expected integers" in str(e.value)


def test_integer_tables_of_any_integer_dtype_validate():
    for t in (np.array([[1, 2]], dtype=np.int64), [[1, 2]], np.array([[1, 2]], dtype=np.uint8),
              np.asfortranarray(np.array([[1, 2]], dtype=np.int32))):
        pagedkv.validate_block_table(t, [8], 4, 4)
    with pytest.raises(pagedkv.Error):
        pagedkv.validate_block_table(np.array([[1, 2**40]]), [8], 4, 4)  # does not fit int32
