import json

import pytest

from dtrace_mk.abi import schema as s


def _doc():
    return s.default_schema("tiny", n_layers=2, moe_layers=[1]).to_dict()


def test_round_trip_and_hash_stable(tmp_path):
    sch = s.default_schema("tiny", n_layers=2, moe_layers=[1])
    p = tmp_path / "schema.json"
    sch.dump(p)
    back = s.load_schema(p)
    assert back.hash == sch.hash == json.loads(p.read_text())["hash"]
    assert back.class_id("attn") == 3 and back.class_name(3) == "attn"
    assert back.comm_op_id("allreduce_mlp") == 1
    assert [l.kind for l in back.layers] == ["dense", "moe"]


def test_standard_class_ids_are_fixed():
    names = [c.name for c in s.standard_classes()]
    assert names[:11] == ["rmsnorm", "qkv", "rope_kv_append", "attn", "attn_o", "mlp_gate_up",
                          "mlp_down", "moe_router", "moe_expert", "lm_head", "argmax"]


def test_near_matches():
    sch = s.default_schema()
    assert sch.near_matches("task_class", "atn") == ["attn", "attn_o"] or "attn" in sch.near_matches("task_class", "atn")
    assert "allreduce_attn" in sch.near_matches("comm_op", "allreduce_atn")


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(schema_version=2), "schema_version: expected 1, got 2"),
    (lambda d: d.update(abi_version=7), "abi_version: expected 1 (this dtrace_mk's hook ABI), got 7"),
    (lambda d: d["task_classes"][3].update(id=5), "task_classes[3].id: expected 3 (ids are dense and in order), got 5"),
    (lambda d: d["task_classes"][2].update(name="rope"), 'task_classes[2].name: expected "rope_kv_append" (standard class ids are fixed), got "rope"'),
    (lambda d: d["task_classes"][0].update(region_class="sparse"), 'task_classes[0].region_class: expected one of dense, moe, head, comm, got "sparse"'),
    (lambda d: d["task_classes"][0].pop("device_function"), "task_classes[0].device_function: missing"),
    (lambda d: d.update(colour="red"), "colour: unknown field"),
    (lambda d: d["comm_ops"][1].update(name="allreduce_attn"), 'comm_ops[1].name: duplicate name "allreduce_attn"'),
    (lambda d: d["layers"][0].update(kind="sparse"), 'layers[0].kind: expected one of dense, moe, got "sparse"'),
    (lambda d: d.update(model=3), "model: expected a string, got 3"),
])
def test_bad_schema_names_field_and_expected_value(mutate, message):
    d = _doc()
    d.pop("hash")
    mutate(d)
    with pytest.raises(s.SchemaError) as e:
        s.TaskSchema.from_dict(d, "bad.json")
    assert f"bad.json: {message}" in str(e.value)


def test_edited_file_fails_hash(tmp_path):
    d = _doc()
    d["model"] = "tinier"
    p = tmp_path / "schema.json"
    p.write_text(json.dumps(d))
    with pytest.raises(s.SchemaError, match=r"hash: expected sha256:[0-9a-f]{64} \(hash of the content\)"):
        s.load_schema(p)


def test_mismatched_expected_hash(tmp_path):
    p = tmp_path / "schema.json"
    s.default_schema("tiny").dump(p)
    with pytest.raises(s.SchemaError, match="hash: expected sha256:abc .*compiled against"):
        s.load_schema(p, expect_hash="sha256:abc")


def test_unreadable_and_invalid_json(tmp_path):
    with pytest.raises(s.SchemaError, match="cannot read task schema"):
        s.load_schema(tmp_path / "nope.json")
    p = tmp_path / "broken.json"
    p.write_text('{"schema_version": 1,,}')
    with pytest.raises(s.SchemaError, match=r"broken.json:1:\d+: not valid JSON"):
        s.load_schema(p)
