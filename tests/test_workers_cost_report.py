"""``tests/perf/bench.py --workers-bench``'s split of a worker's CPU per request (issue #35):
user space into instructions and time per instruction, the kernel apart, and the estimate."""

from __future__ import annotations

import pytest

from tests.perf.workers_cost import FILES, LONE, Control, Split, perf_counts, report

RUN = Split(
    cpu_ms={1: 0.250, 2: 0.300},
    kernel_ms={1: 0.050, 2: 0.060},
    instructions={"1 worker": 800_000.0, FILES: 832_000.0, LONE: 840_000.0, "2 workers": 880_000.0},
    control=Control(alone_us=4.0, beside_us=4.4),
)
"""Round numbers: user 0.200 -> 0.240 ms, instructions +10% (+5% of it worker mode, 4% of that
the metric files)."""


def test_user_time_is_split_into_work_and_time_per_instruction() -> None:
    assert RUN.cpu_ratio == pytest.approx(1.2)
    assert RUN.instruction_ratio == pytest.approx(1.1)
    assert RUN.per_instruction == pytest.approx(1.2 / 1.1)


def test_the_parts_of_the_rise_add_up_to_it() -> None:
    parts = RUN.rise_ms()
    assert parts == pytest.approx(
        {
            "the metric files": 0.008,
            "the rest of worker mode": 0.002,
            "a second worker's extra instructions": 0.010,
            "the same instructions run slower": 0.240 - 0.220,
            "the kernel (sockets, epoll)": 0.010,
        }
    )
    assert sum(parts.values()) == pytest.approx(RUN.cpu_ms[2] - RUN.cpu_ms[1])


def test_efficiency_counts_the_extra_instructions_then_the_kernels_rise() -> None:
    user_only, with_kernel = RUN.efficiency()
    assert user_only == pytest.approx(0.250 / (0.200 * 1.1 + 0.050))  # 0.93
    assert with_kernel == pytest.approx(0.250 / (0.200 * 1.1 + 0.060))  # 0.89


def test_report_prints_each_configuration_and_the_split() -> None:
    lines = report(RUN)
    assert lines[1].split()[-1] == "1.000"
    assert lines[2].startswith(FILES) and lines[2].split()[-1] == "1.040"
    assert lines[4].startswith("2 workers") and lines[4].split()[-1] == "1.100"
    text = "\n".join(lines)
    assert "(1.10x)" in text  # the control
    assert "instructions 1.100x, time per instruction 1.09x" in text
    assert "+50 us per request" in text
    assert "0.93 x N one worker's throughput with the extra instructions, 0.89 x N" in text


def test_perf_counts_adds_both_loop_waits_and_skips_what_was_not_counted() -> None:
    output = (
        "12000,,raw_syscalls:sys_enter,8001,100.00,,\n"
        "300,,syscalls:sys_enter_epoll_wait,8001,100.00,,\n"
        "200,,syscalls:sys_enter_epoll_pwait,8001,100.00,,\n"
        "4000,,syscalls:sys_enter_getpid,8001,100.00,,\n"
        "<not counted>,,syscalls:sys_enter_epoll_pwait,0,0.00,,\n"
    )
    assert perf_counts(output) == {"syscalls": 12000.0, "loop waits": 500.0, "getpid": 4000.0}
    assert perf_counts("<not supported>,,raw_syscalls:sys_enter,0,0.00,,\n") == {}
