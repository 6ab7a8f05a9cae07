"""CI (no GPU): tools/ncu_footprint.py reads an Nsight Compute source export and counts the
KB of SASS each launch executed, and the code one launch added over another."""
import pytest


@pytest.fixture(scope="module")
def nf(load_tool):
    return load_tool("ncu_footprint")


HEAD = '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","Thread Instructions Executed"\n'


def export(tmp_path, launches):
    text = ""
    for counts in launches:
        text += '"Kernel Name","dtmk_megakernel",\n' + HEAD
        text += "".join(f'"0x{16 * i:x}","  NOP","0","{c:,}","0"\n' for i, c in enumerate(counts))
    p = tmp_path / "src.csv"
    p.write_text(text)
    return p


def test_load_reads_each_launch_and_thousands_separators(nf, tmp_path):
    p = export(tmp_path, [[5, 0, 1200], [5, 7, 0, 2]])
    assert nf.load(p) == [[5, 0, 1200], [5, 7, 0, 2]]


def test_footprint_counts_instructions_at_or_above_the_threshold(nf):
    c = [0, 1, 999, 1000, 50000] + [3] * 60
    assert nf.footprint_kb(c) == 64 * 16 / 1024
    assert nf.footprint_kb(c, 1000) == 2 * 16 / 1024


def test_added_gives_runs_new_in_b_longest_first(nf):
    a = [1, 0, 0, 0, 1, 0, 0, 1, 0]
    b = [1, 4, 5, 6, 1, 0, 2, 1, 9]     # new: 1..3 (3), 6 (1), 8 (1, at the end)
    assert nf.added(a, b) == [(1, 3, 15), (6, 1, 2), (8, 1, 9)]
    assert nf.added(a, b, min_exec=5) == [(2, 2, 11), (8, 1, 9)]
    with pytest.raises(ValueError, match="different builds"):
        nf.added([1], [1, 2])


def test_bad_files_name_the_problem(nf, tmp_path):
    p = tmp_path / "x.csv"
    p.write_text('"Address","Source"\n')
    with pytest.raises(ValueError, match="no 'Kernel Name' row"):
        nf.load(p)
    p.write_text('"Kernel Name","k",\n"Address","Source"\n"0x0","NOP"\n')
    with pytest.raises(ValueError, match="SourceCounters"):
        nf.load(p)
    with pytest.raises(SystemExit) as e:           # argparse's error: exit status 2
        nf.main([str(tmp_path / "missing.csv")])
    assert e.value.code == 2


def test_per_function_sums_kb_and_refuses_another_build(nf):
    funcs = [("a.cuh", "f"), ("a.cuh", "g"), ("a.cuh", "f"), ("b.cu", "h")]
    kb = nf.per_function([5, 0, 2000, 9], funcs)
    assert kb == {("a.cuh", "f"): 2 * 16 / 1024, ("b.cu", "h"): 16 / 1024}
    assert nf.per_function([5, 0, 2000, 9], funcs, min_exec=1000) == {("a.cuh", "f"): 16 / 1024}
    assert nf.per_function([5, 0, 2000, 9], funcs, only={0, 3}) == {("a.cuh", "f"): 16 / 1024, ("b.cu", "h"): 16 / 1024}
    with pytest.raises(ValueError, match="not the profiled build"):
        nf.per_function([1, 2], funcs)


def test_parse_builds_maps_launches_and_names_bad_specs(nf):
    assert nf.parse_builds(["0=1b:DTMK_NO_HOOKS", "1,2=1b:DTMK_OBS_SM+DTMK_SM_WORKER"]) == {
        0: "1b:DTMK_NO_HOOKS", 1: "1b:DTMK_OBS_SM+DTMK_SM_WORKER", 2: "1b:DTMK_OBS_SM+DTMK_SM_WORKER"}
    with pytest.raises(ValueError, match="LAUNCHES=PRESET:DEF"):
        nf.parse_builds(["0:1b"])


def test_per_line_counts_the_named_functions_lines(nf):
    lines = [("a.cuh", "f", 10), ("a.cuh", "f", 10), ("a.cuh", "g", 20), ("a.cuh", "f", 11)]
    assert nf.per_line([3, 0, 5, 2000], lines, {"f"}) == {("f", "a.cuh", 10): 1, ("f", "a.cuh", 11): 1}
    assert nf.per_line([3, 0, 5, 2000], lines, {"f", "g"}, min_exec=4) == {("g", "a.cuh", 20): 1,
                                                                            ("f", "a.cuh", 11): 1}
    assert nf.per_line([3, 0, 5, 2000], lines, {"f"}, only={0}) == {("f", "a.cuh", 10): 1}


def test_cli_refuses_lines_without_a_build_and_launches_not_in_the_export(nf, tmp_path, capsys):
    p = export(tmp_path, [[5, 0], [5, 7]])
    for argv, msg in (([str(p), "--lines", "f"], "--lines needs --build"),
                      ([str(p), "--diff", "0:2"], "launches 0..1")):
        with pytest.raises(SystemExit) as e:
            nf.main(argv)
        assert e.value.code == 2 and msg in capsys.readouterr().err
    assert nf.main([str(p), "--diff", "0:1", "--min", "1"]) == 0
    out = capsys.readouterr().out
    assert "in 1 runs" in out and "instructions 1..1: 0.02 KB, executed 7" in out   # (instruction 1: 0 -> 7)


def test_lines_count_each_128_byte_line_once_and_new_lines_only_those_a_never_ran(nf):
    c = [0] * 32
    c[0] = c[1] = 5            # line 0 (instructions 0-7)
    c[9] = 2000                # line 1
    c[31] = 1                  # line 3
    assert nf.lines_kb(c) == 3 * 128 / 1024
    assert nf.lines_kb(c, 1000) == 128 / 1024
    assert nf.lines_kb(c, only={0, 31}) == 2 * 128 / 1024
    a = [0] * 32
    a[3] = 1                   # a ran line 0 (another instruction of it): b's line 0 is not new
    assert nf.new_lines_kb(a, c) == 2 * 128 / 1024
    assert nf.new_lines_kb(a, c, 1000) == 128 / 1024
    with pytest.raises(ValueError, match="different builds"):
        nf.new_lines_kb([1], [1, 2])


def test_new_lines_per_symbol_charges_each_new_line_to_its_sass_function(nf):
    syms = ["k"] * 16 + ["hook_flush"] * 16
    a = [0] * 32
    a[1] = 3                   # a ran line 0 (kernel)
    b = [0] * 32
    b[2] = 5000                # line 0: not new
    b[8] = 5000                # line 1 (kernel): new
    b[16] = b[17] = 1200       # line 2 (hook_flush): new, once
    b[31] = 1200               # line 3 (hook_flush): new
    b[24] = 10                 # line 3 again, under the threshold
    got = nf.new_lines_per_symbol(a, b, syms, 1000)
    assert got == {"k": 128 / 1024, "hook_flush": 2 * 128 / 1024}
    with pytest.raises(ValueError, match="not the profiled build"):
        nf.new_lines_per_symbol(a, b, syms[:-1])


def test_match_builds_names_launches_by_instruction_count_and_refuses_twins(nf):
    launches = [[0] * 3, [0] * 5, [0] * 4, [0] * 3]
    assert nf.match_builds(launches, {"nohooks": 3, "off": 5}) == ["nohooks", "off", None, "nohooks"]
    with pytest.raises(ValueError, match="nohooks and offxw both have 3 instructions"):
        nf.match_builds(launches, {"nohooks": 3, "offxw": 3})


def test_load_raw_reads_the_cache_metrics_per_launch_and_names_a_bad_file(nf, tmp_path):
    p = tmp_path / "raw.csv"
    p.write_text('"ID","Kernel Name","gpu__time_duration.sum","gcc__gcc2xbar_requests_type_instruction.sum","other"\n'
                 '"","","msecond","",""\n'
                 '"0","dtmk_megakernel","20.799744","182,864","1"\n'
                 '"1","dtmk_megakernel","21.334080","236,211","2"\n')
    raw = nf.load_raw(p)
    assert raw == [(0, {"gpu__time_duration.sum": 20.799744, "gcc__gcc2xbar_requests_type_instruction.sum": 182864.0}),
                   (1, {"gpu__time_duration.sum": 21.33408, "gcc__gcc2xbar_requests_type_instruction.sum": 236211.0})]
    for text, why in (('"Kernel Name","x"\n"",""\n', "not an ncu raw export"),
                      ('"ID","Kernel Name"\n"",""\n"0","k"\n', "none of gpu__time_duration.sum")):
        p.write_text(text)
        with pytest.raises(ValueError, match=why):
            nf.load_raw(p)


def test_stall_samples_load_by_column_and_sum_per_function(nf, tmp_path):
    p = tmp_path / "src.csv"
    p.write_text('"Kernel Name","dtmk_megakernel",\n'
                 '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_no_inst"\n'
                 '"0x0","  NOP","10","5","4"\n"0x10","  NOP","1,200","5","1,000"\n"0x20","  NOP","3","5","0"\n')
    assert nf.load(p, "stall_no_inst") == [[4, 1000, 0]]
    assert nf.load(p, nf.ALL_SAMPLES) == [[10, 1200, 3]]
    st = nf.samples_per_symbol([4, 1000, 0], ["wait_event", "run_body", "run_body"])
    assert st == {"wait_event": 4, "run_body": 1000}
    with pytest.raises(ValueError, match="the launch has 3 instructions, the build 2"):
        nf.samples_per_symbol([4, 1000, 0], ["a", "b"])
    with pytest.raises(ValueError, match="no 'stall_wait' column"):
        nf.load(p, "stall_wait")


def test_cli_refuses_stall_without_match(nf, tmp_path, capsys):
    p = export(tmp_path, [[5, 0, 1200]])
    with pytest.raises(SystemExit):
        nf.main([str(p), "--stall", "stall_no_inst"])
    assert "--stall needs --match" in capsys.readouterr().err


def test_set_overflow_counts_lines_beyond_each_sets_ways(nf):
    # 4 sets x 2 ways: set 0 holds lines 0, 4, 8 (one too many), set 1 lines 1, 5; a cyclic shift of
    # every line (where the module loads) changes nothing
    lines = {0, 4, 8, 1, 5}
    assert nf.set_overflow(lines, sets=4, ways=2) == 1
    assert nf.set_overflow({x + 3 for x in lines}, sets=4, ways=2) == 1
    assert nf.set_overflow(set(range(8)), sets=4, ways=2) == 0       # contiguous: every set exactly full
    assert nf.set_overflow(set(range(0, 64, 4)), sets=4, ways=2) == 14
    assert nf.hot_lines([0, 1000, 5] + [0] * 5 + [2000], 1000) == {0, 1}     # 8 instructions per line


def test_relayout_moves_hot_code_with_its_function_and_follows_renames(nf):
    # old build: f (16 instructions: lines 0-1), g (16: lines 2-3); hot: f's first, g's 9th
    syms = ["f"] * 16 + ["g"] * 16
    counts = [1000] + [0] * 15 + [0] * 8 + [1000] + [0] * 7
    # the new build places g first (renamed a0g), then 8 instructions of h, then f (17: one more)
    new = ["a0g"] * 16 + ["h"] * 8 + ["f"] * 17
    lines, gone, resized = nf.relayout(counts, syms, new, 1000, {"a0g": "g"})
    assert lines == {1, 3} and gone == set() and resized == {"f"}
    lines, gone, _ = nf.relayout(counts, syms, ["f"] * 16, 1000)
    assert lines == {0} and gone == {"g"}
    # a template instance keeps its arguments through the rename
    lines, gone, _ = nf.relayout([1000] * 8, ["k<1>"] * 8, ["x"] * 8 + ["a7k<1>"] * 8, 1000, {"a7k": "k"})
    assert lines == {1} and not gone
    # ... and a launch of the renamed build lays out in one without the renames (g back at 16: line 2)
    lines, gone, _ = nf.relayout([0] * 8 + [1000] * 8, ["f"] * 8 + ["a0g"] * 8, ["f"] * 16 + ["g"] * 8, 1000,
                                 {"a0g": "g"})
    assert lines == {2} and not gone


def test_hot_first_alias_is_the_kernels_list(nf):
    alias = nf.hot_first_alias()
    assert alias["a1run_body"] == "run_body" and alias["a6wait_evt"] == "wait_event"
    assert alias["a7attnstgd"] == "op_attn_staged" and len(alias) == 23
    # -DDTMK_OFF_COPY's copy 0 is the wait a task runs while nothing observes, renamed a6wait_evt or not
    assert alias["wait_event_off"] == "wait_event"
    # (and -DDTMK_HOT_OBS's seven: the observer-SM build's hot functions, b5vmrunrec the last;
    # -DDTMK_HOT_TINY's six: the standard lowering's task functions, c0mv_rownl the last)
    assert alias["a9osqflush"] == "osq_defer_flush" and alias["b3hookflsh"] == "hook_flush"
    assert alias["a9op_projx"] == "op_proj" and alias["c0mv_rownl"] == "mv_row_nl"
    renames = [k for k in alias if k != "wait_event_off"]
    assert len(renames) == 22 and all(len(k) == 10 and k < "c1" for k in renames)   # (_Z10a... / _Z10b...: first)
    assert nf.canonical("a7attnstgd<1>", alias) == "op_attn_staged<1>" and nf.canonical("hook_flush", alias) == "hook_flush"
