"""The Perfetto encoder: the bytes decode with the protobuf library against the subset
of Perfetto's schema we write (field numbers and types from upstream's .proto files,
declared here as descriptors, no generated code), with no unknown fields; tracks, slices,
flows and counters add up for a 2-rank run and for the sim's full task trace."""
from collections import Counter

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.unknown_fields import UnknownFieldSet

from dtrace_mk.exporters import protowire as W
from dtrace_mk.exporters.batch import build_batch
from dtrace_mk.exporters.perfetto import (build_perfetto, queue_depth_sink, task_trace_from_chrome,
                                          task_trace_from_sim)

from exporter_helpers import tiny_batch, two_rank_batch, two_rank_run

F = descriptor_pb2.FieldDescriptorProto
OPT, REP = F.LABEL_OPTIONAL, F.LABEL_REPEATED
T = {"u64": F.TYPE_UINT64, "u32": F.TYPE_UINT32, "i32": F.TYPE_INT32, "i64": F.TYPE_INT64,
     "str": F.TYPE_STRING, "bool": F.TYPE_BOOL, "f64": F.TYPE_FIXED64, "dbl": F.TYPE_DOUBLE,
     "enum": F.TYPE_INT32, "msg": F.TYPE_MESSAGE}

# (message, [(name, number, type, label, message type)])  -- perfetto/protos/perfetto/trace/*
SCHEMA = [
    ("Trace", [("packet", 1, "msg", REP, "TracePacket")]),
    ("TracePacket", [("timestamp", 8, "u64", OPT, None), ("trusted_packet_sequence_id", 10, "u32", OPT, None),
                     ("track_event", 11, "msg", OPT, "TrackEvent"), ("sequence_flags", 13, "u32", OPT, None),
                     ("track_descriptor", 60, "msg", OPT, "TrackDescriptor")]),
    ("TrackDescriptor", [("uuid", 1, "u64", OPT, None), ("name", 2, "str", OPT, None),
                         ("process", 3, "msg", OPT, "ProcessDescriptor"),
                         ("thread", 4, "msg", OPT, "ThreadDescriptor"), ("parent_uuid", 5, "u64", OPT, None),
                         ("counter", 8, "msg", OPT, "CounterDescriptor")]),
    ("ProcessDescriptor", [("pid", 1, "i32", OPT, None), ("process_name", 6, "str", OPT, None)]),
    ("ThreadDescriptor", [("pid", 1, "i32", OPT, None), ("tid", 2, "i32", OPT, None),
                          ("thread_name", 5, "str", OPT, None)]),
    ("CounterDescriptor", [("unit", 3, "enum", OPT, None)]),
    ("TrackEvent", [("debug_annotations", 4, "msg", REP, "DebugAnnotation"), ("type", 9, "enum", OPT, None),
                    ("track_uuid", 11, "u64", OPT, None), ("categories", 22, "str", REP, None),
                    ("name", 23, "str", OPT, None), ("counter_value", 30, "i64", OPT, None),
                    ("flow_ids", 47, "f64", REP, None), ("terminating_flow_ids", 48, "f64", REP, None)]),
    ("DebugAnnotation", [("bool_value", 2, "bool", OPT, None), ("uint_value", 3, "u64", OPT, None),
                         ("int_value", 4, "i64", OPT, None), ("double_value", 5, "dbl", OPT, None),
                         ("string_value", 6, "str", OPT, None), ("name", 10, "str", OPT, None)]),
]


def _trace_class():
    fd = descriptor_pb2.FileDescriptorProto(name="perfetto_subset.proto", package="perfetto.protos",
                                            syntax="proto2")
    for mname, flds in SCHEMA:
        m = fd.message_type.add(name=mname)
        for name, num, typ, label, mtype in flds:
            f = m.field.add(name=name, number=num, type=T[typ], label=label)
            if mtype:
                f.type_name = ".perfetto.protos." + mtype
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("perfetto.protos.Trace"))


TraceMsg = _trace_class()


def decode(data: bytes):
    tr = TraceMsg()
    tr.ParseFromString(data)
    # nothing we wrote is outside the declared schema
    def no_unknown(m):
        assert len(UnknownFieldSet(m)) == 0, (type(m).__name__, m)
        for fd, v in m.ListFields():
            if fd.type == F.TYPE_MESSAGE:
                for x in (v if fd.is_repeated else [v]):
                    no_unknown(x)
    no_unknown(tr)
    return tr


def summarize(tr):
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet if p.HasField("track_descriptor")}
    events = [p for p in tr.packet if p.HasField("track_event")]
    return tracks, events


def check_well_formed(tr):
    tracks, events = summarize(tr)
    assert tr.packet[0].sequence_flags == 1
    assert all(p.trusted_packet_sequence_id == 1 for p in tr.packet)
    ts = [p.timestamp for p in events]
    assert ts == sorted(ts)
    open_: Counter = Counter()
    for p in events:
        e = p.track_event
        assert e.track_uuid in tracks
        if e.type == 1:
            open_[e.track_uuid] += 1
        elif e.type == 2:
            open_[e.track_uuid] -= 1
            assert open_[e.track_uuid] >= 0
        elif e.type == 4:
            assert tracks[e.track_uuid].HasField("counter")
    assert all(v == 0 for v in open_.values())
    # flows: every terminating id was started by an earlier event
    started = set()
    for p in events:
        started.update(p.track_event.flow_ids)
        for f in p.track_event.terminating_flow_ids:
            assert f in started
    return tracks, events


def test_wire_reader_and_writer_roundtrip():
    m = W.Msg().uint(1, 300).int64(2, -5).string(3, "é").fixed64(4, 2**63 + 1).double(5, 0.5)
    m.msg(6, W.Msg().uint(1, 0))
    got = W.parse(bytes(m))
    assert [(f, wt) for f, wt, _ in got] == [(1, 0), (2, 0), (3, 2), (4, 1), (5, 1), (6, 2)]
    assert got[0][2] == 300 and W.signed(got[1][2]) == -5 and got[2][2] == "é".encode()
    assert got[3][2] == 2**63 + 1 and W.fields(got[5][2]) == {1: [0]}
    with pytest.raises(W.WireError, match="truncated"):
        W.parse(bytes(m)[:-1])


def test_two_rank_trace_decodes_with_flows_and_counters():
    batch = two_rank_batch()
    data, counts = build_perfetto(batch)
    tracks, events = check_well_formed(decode(data))
    procs = {t.process.pid: t.process.process_name for t in tracks.values() if t.HasField("process")}
    assert procs == {1: "rank 0 (node-a, GPU 0)", 2: "rank 1 (node-a, GPU 1)"}
    names = Counter(t.name for t in tracks.values())
    assert names["decode steps"] == 2 and names["comm signals"] == 2 and names["queue depth max"] == 2
    assert names["comm wait <- rank 0"] == 1 and names["comm wait <- rank 1"] == 1
    begins = [p.track_event for p in events if p.track_event.type == 1]
    # 8 step slices + 32 joined waits + finding slices
    n_find = sum(len(f["steps"]) for f in batch.result["findings"])
    assert len(begins) == 8 + 32 + n_find == counts["slices"]
    flows_out = [f for p in events for f in p.track_event.flow_ids]
    flows_in = [f for p in events for f in p.track_event.terminating_flow_ids]
    assert len(flows_out) == len(set(flows_out)) == 32 and sorted(flows_in) == sorted(flows_out)
    assert counts["flows"] == 32 and counts["counters"] == 8
    # a wait slice carries its identity; its flow starts on the other rank's signal track
    w = next(e for e in begins if e.name == "wait allreduce_attn")
    ann = {a.name: a for a in w.debug_annotations}
    assert {"comm_op", "comm_gen", "peer", "layer", "step", "tiles"} <= set(ann)
    rel = next(p.track_event for p in events if p.track_event.name == "release allreduce_attn"
               and p.track_event.track_uuid == w.track_uuid)
    sig = next(p.track_event for p in events if rel.terminating_flow_ids[0] in p.track_event.flow_ids)
    assert tracks[sig.track_uuid].parent_uuid != tracks[w.track_uuid].parent_uuid
    assert sig.name == "signal allreduce_attn -> rank 0" or sig.name == "signal allreduce_attn -> rank 1"
    assert counts["instants"] == 64                   # 32 signals + 32 releases


def test_sim_task_trace_one_track_per_worker_and_queue_counters():
    from dtrace_mk.megakernel.graph import build_graph
    from dtrace_mk.megakernel.presets import PRESETS
    from dtrace_mk.megakernel.sim import Sim
    g = build_graph(PRESETS["tiny"], batch=2, num_workers=4)
    samples = []
    res = Sim(g, 2, sink=queue_depth_sink(samples), collect_trace=True).run()
    tt = task_trace_from_sim(g, res, queue_depth=samples)
    assert samples and len(tt.slices) == len(res.trace) > 0
    res_, tr = two_rank_run(steps=2, faults=())
    batch = build_batch({"findings": []}, [], task_traces=[tt])
    data, counts = build_perfetto(batch)
    tracks, events = check_well_formed(decode(data))
    threads = [t for t in tracks.values() if t.HasField("thread")]
    assert sorted(t.thread.thread_name for t in threads) == [f"worker {w} (SM {w})" for w in range(4)]
    assert all(t.thread.pid == 1 for t in threads)
    task_begins = [p.track_event for p in events if p.track_event.type == 1
                   and p.track_event.categories == ["task"]]
    assert len(task_begins) == len(res.trace)
    e = task_begins[0]
    ann = {a.name for a in e.debug_annotations}
    assert {"task_index", "step", "tile"} <= ann and e.name
    counters = [p for p in events if p.track_event.type == 4]
    assert counters and counts["counters"] == len(counters)
    attn = [e for e in task_begins if e.name == "attn"]
    assert attn and all("request_slot" in {a.name for a in e.debug_annotations} for e in attn)
    steps = [p.track_event for p in events if p.track_event.categories == ["step"] and p.track_event.type == 1]
    assert len(steps) == 2


def test_chrome_trace_import_roundtrip():
    from dtrace_mk.megakernel.graph import build_graph
    from dtrace_mk.megakernel.presets import PRESETS
    from dtrace_mk.megakernel.sim import Sim, chrome_trace
    g = build_graph(PRESETS["tiny"], batch=2, num_workers=4)
    res = Sim(g, 1, collect_trace=True).run()
    (tt,) = task_trace_from_chrome(chrome_trace(g, res))
    assert tt.workers == 4 and len(tt.slices) == len(res.trace) and len(tt.steps) == 1
    direct = task_trace_from_sim(g, res)
    assert [(s.worker, s.name, s.begin_ns, s.end_ns) for s in tt.slices] == \
        [(s.worker, s.name, s.begin_ns, s.end_ns) for s in direct.slices]


def test_tiny_batch_evidence_and_findings_tracks():
    data, counts = build_perfetto(tiny_batch())
    tracks, events = check_well_formed(decode(data))
    names = Counter(t.name for t in tracks.values())
    assert names["evidence"] == 1 and names["findings"] == 2
    ev = [p for p in events if p.track_event.categories == ["evidence"]]
    assert len(ev) == 1 and ev[0].timestamp == 1_250_000
    # the unjoined wait has a slice but no flow
    assert counts["flows"] == 4


def test_gpu_trace_records_become_worker_slices_on_the_aligned_clock():
    import numpy as np
    from dtrace_mk.collectors.records import ClockSample
    from dtrace_mk.exporters.perfetto import task_trace_from_gpu
    from dtrace_mk.megakernel.gpu import TRACE_DTYPE
    from dtrace_mk.megakernel.graph import build_graph
    from dtrace_mk.megakernel.presets import PRESETS
    g = build_graph(PRESETS["tiny"], batch=2, num_workers=4)
    dev0 = 1_700_000_000_000_000_000            # %globaltimer: ns since the epoch
    rec = np.zeros(3, TRACE_DTYPE)
    rec["t_dispatch"] = [dev0, dev0 + 5_000, dev0 + 9_000]
    rec["wait_ns"] = [100, 0, 50]
    rec["dur_ns"] = [1_000, 2_000, 3_000]
    rec["task_index"] = [0, 1, 2]
    rec["worker"] = [0, 1, 1]
    rec["sm"] = [7, 9, 9]
    tt = task_trace_from_gpu(rec, g, rank=1)
    assert [(s.worker, s.begin_ns, s.end_ns) for s in tt.slices] == \
        [(0, dev0 + 100, dev0 + 1_100), (1, dev0 + 5_000, dev0 + 7_000), (1, dev0 + 9_050, dev0 + 12_050)]
    assert tt.sms == {0: 7, 1: 9}
    # the rank's device clock runs 1 ms ahead of its host clock: slices move back by 1 ms
    samples = [ClockSample(1, dev0 + i * 10**8, dev0 - 10**6 + i * 10**8) for i in range(5)]
    data, counts = build_perfetto(build_batch({"findings": []}, samples, task_traces=[tt]))
    tracks, events = check_well_formed(decode(data))
    assert sorted(t.thread.thread_name for t in tracks.values() if t.HasField("thread")) == \
        ["worker 0 (SM 7)", "worker 1 (SM 9)", "worker 2 (SM 2)", "worker 3 (SM 3)"]
    begins = [p for p in events if p.track_event.type == 1]
    assert [p.timestamp for p in begins] == [dev0 - 10**6 + 100, dev0 - 10**6 + 5_000, dev0 - 10**6 + 9_050]
    assert [p.track_event.name for p in begins] == [g.tasks[i].class_name for i in range(3)]
