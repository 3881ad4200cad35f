"""run/memory_snapshot.py's reading of an allocator snapshot (no GPU: a snapshot dict written here,
shaped like torch.cuda.memory._snapshot()'s): the live set at the window's highest point, grouped by
the allocating code line."""

from ds_longctx.run.memory_snapshot import format_table, origin, peak_table, stream_table

MIB = 2**20


def frame(path: str, line: int, name: str) -> dict:
    return {"filename": path, "line": line, "name": name}


TORCH = frame("/site/torch/nn/functional.py", 10, "linear")
DSL = frame("/site/ds_longctx/levers/offload.py", 42, "slot")
HF = frame("/site/transformers/models/qwen3/modeling_qwen3.py", 7, "forward")
DS = frame("/site/deepspeed/runtime/zero/stage3.py", 99, "step")


def snapshot() -> dict:
    """Segment at 0x1000: X (100 MiB, alive the whole window: allocated before it) then C (30 MiB,
    alive at the end). Events: A 50 alloc; B 200 alloc; B freed; C 30 alloc; A freed; Y (40,
    allocated before the window) freed."""
    x_addr, c_addr = 0x1000, 0x1000 + 100 * MIB
    a, b, y = 0x90000000, 0xA0000000, 0xB0000000
    return {
        "segments": [
            {
                "device": 0,
                "address": x_addr,
                "blocks": [
                    {"size": 100 * MIB, "state": "active_allocated", "frames": [TORCH, DSL]},
                    {"size": 30 * MIB, "state": "active_allocated", "frames": [HF]},
                    {"size": 10 * MIB, "state": "inactive", "frames": []},
                ],
            }
        ],
        "device_traces": [
            [
                {"action": "alloc", "addr": a, "size": 50 * MIB, "frames": [TORCH, HF]},
                {"action": "alloc", "addr": b, "size": 200 * MIB, "frames": [DS]},
                {"action": "segment_alloc", "addr": 0x5000, "size": 512 * MIB, "frames": []},
                {"action": "free_requested", "addr": b, "size": 200 * MIB, "frames": []},
                {"action": "free_completed", "addr": b, "size": 200 * MIB, "frames": []},
                {"action": "alloc", "addr": c_addr, "size": 30 * MIB, "frames": [HF]},
                {"action": "free_completed", "addr": a, "size": 50 * MIB, "frames": []},
                {"action": "free_completed", "addr": y, "size": 40 * MIB, "frames": [DS]},
            ]
        ],
    }


def test_the_peak_is_the_most_bytes_alive_and_names_who_allocated_them():
    t = peak_table(snapshot())
    # before B's free: X 100 + Y 40 (freed last, allocated before the window) + A 50 + B 200 = 390
    # MiB
    assert t["peak_bytes"] == 390 * MIB
    assert t["events"] == 8 and t["event"] in (2, 3, 4)  # after B's alloc, before its free
    assert t["groups"] == [
        ("deepspeed/runtime/zero/stage3.py:99 in step", 240 * MIB, 2),
        ("ds_longctx/levers/offload.py:42 in slot", 100 * MIB, 1),
        ("transformers/models/qwen3/modeling_qwen3.py:7 in forward", 50 * MIB, 1),
    ]


def test_without_events_the_peak_is_what_is_alive_now():
    s = snapshot()
    s["device_traces"] = [[]]
    t = peak_table(s)
    assert t["peak_bytes"] == 130 * MIB and [g[1] for g in t["groups"]] == [100 * MIB, 30 * MIB]


def test_origin_prefers_our_libraries_and_says_when_nothing_was_recorded():
    assert origin([TORCH, HF, DSL]) == "transformers/models/qwen3/modeling_qwen3.py:7 in forward"
    assert origin([TORCH]) == "/site/torch/nn/functional.py:10 in linear"
    assert origin([]) == "(allocated before recording began)"


def test_table_lists_the_largest_first_and_folds_the_rest():
    text = format_table(peak_table(snapshot()), rank=1, steps=2, top=2)
    lines = text.splitlines()
    assert "rank 1" in lines[0] and "0.38 GiB" in lines[0] and "first 2 step(s)" in lines[0]
    assert (
        "deepspeed/runtime/zero/stage3.py:99" in lines[2]
        and "ds_longctx/levers/offload.py:42" in lines[3]
    )
    assert "(1 more places)" in lines[4] and "0.049" in lines[4]


def pending_snapshot() -> dict:
    """P (64 MiB) is freed by its caller but used on a side stream (record_stream): free_requested,
    then Q (64 MiB) is allocated (P's memory is not reusable yet: Q gets new memory), then P's free
    completes. Allocated never exceeds 64 MiB; held reaches 128 MiB."""
    p, q = 0x10000000, 0x20000000
    return {
        "segments": [
            {
                "device": 0,
                "address": q,
                "stream": 0,
                "total_size": 96 * MIB,
                "allocated_size": 64 * MIB,
                "blocks": [
                    {"size": 64 * MIB, "state": "active_allocated", "frames": [HF]},
                    {"size": 32 * MIB, "state": "inactive", "frames": []},
                ],
            },
            {
                "device": 0,
                "address": p,
                "stream": 7,
                "total_size": 64 * MIB,
                "allocated_size": 0,
                "blocks": [{"size": 64 * MIB, "state": "inactive", "frames": []}],
            },
        ],
        "device_traces": [
            [
                {"action": "alloc", "addr": p, "size": 64 * MIB, "frames": [DS], "stream": 7},
                {"action": "free_requested", "addr": p, "size": 64 * MIB, "frames": []},
                {"action": "alloc", "addr": q, "size": 64 * MIB, "frames": [HF]},
                {"action": "free_completed", "addr": p, "size": 64 * MIB, "frames": []},
            ]
        ],
    }


def test_allocated_ends_at_the_free_request_held_at_its_completion():
    allocated = peak_table(pending_snapshot())
    assert allocated["peak_bytes"] == 64 * MIB  # what max_memory_allocated reports
    held = peak_table(pending_snapshot(), held=True)
    assert (
        held["peak_bytes"] == 128 * MIB and held["event"] == 3
    )  # P waiting on the side stream + Q
    assert sorted(g[1] for g in held["groups"]) == [64 * MIB, 64 * MIB]


def test_a_block_freed_without_a_request_event_ends_at_its_completion():
    # the first snapshot has no free_requested for A and Y: both semantics agree there
    assert (
        peak_table(snapshot())["peak_bytes"]
        == peak_table(snapshot(), held=True)["peak_bytes"]
        == 390 * MIB
    )


def test_streams_are_listed_by_reserved_bytes_with_their_main_allocator():
    # stream 7 holds nothing alive at the end: its allocator is read off the window's alloc events
    rows = stream_table(pending_snapshot())
    assert rows == [
        (0, 96 * MIB, 64 * MIB, 1, "transformers/models/qwen3/modeling_qwen3.py:7 in forward"),
        (7, 64 * MIB, 0, 1, "deepspeed/runtime/zero/stage3.py:99 in step"),
    ]
    text = format_table(
        peak_table(pending_snapshot()),
        rank=0,
        steps=1,
        held=peak_table(pending_snapshot(), held=True),
        streams=rows,
    )
    assert "held" in text and "0.12 GiB" in text and "reserved by stream" in text
    assert text.splitlines()[-1].split()[:4] == ["7", "0.062", "0.000", "1"]
