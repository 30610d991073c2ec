"""Sizes typed by users become exact bytes; bad sizes are one-line UsageErrors."""

from __future__ import annotations

import pytest
from memtrace.errors import UsageError
from memtrace.units import (
    GiB,
    format_bytes,
    format_gib,
    gib_number,
    gib_or_dash,
    parse_fraction,
    parse_size,
    parse_sizes,
    parse_threshold,
    signed_gib_number,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("32GiB", 32 * 1024**3),
        ("512MiB", 512 * 1024**2),
        ("96 GB", 96 * 10**9),
        ("1.5gib", 3 * 1024**3 // 2),
        ("123456", 123456),
        ("16Gi", 16 * 1024**3),
        (7, 7),
    ],
)
def test_sizes_with_units_become_bytes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "12 parsecs", "-1GiB", "1e9"])
def test_unreadable_or_negative_sizes_are_usage_errors(text):
    with pytest.raises(UsageError) as err:
        parse_size(text)
    assert "\n" not in str(err.value)


def test_a_list_of_capacities_is_read_in_order():
    assert parse_sizes("16GiB,32GiB") == [16 * 1024**3, 32 * 1024**3]


def test_percent_thresholds_apply_to_their_reference_and_byte_thresholds_do_not():
    assert parse_threshold("2%").of(1000) == 20
    assert parse_threshold("512MiB").of(1000) == 512 * 1024**2


def test_fractions_accept_decimal_and_percent_and_refuse_out_of_range():
    assert parse_fraction("0.92") == 0.92
    assert parse_fraction("92%") == pytest.approx(0.92)
    with pytest.raises(UsageError):
        parse_fraction("1.5")


def test_formatting_picks_gib_for_plots_and_the_largest_unit_for_prose():
    assert format_gib(91.8 * 1024**3, 1) == "91.8 GiB"
    assert format_bytes(512 * 1024**2) == "512.0 MiB"
    assert format_bytes(-3 * 1024**3) == "-3.0 GiB"
    assert format_bytes(12) == "12 B"


def test_a_figure_too_small_for_the_gib_decimals_reads_in_its_own_unit_and_the_rest_stays_gib():
    # the CPU profiler's peaks (tests/data/vllm-cpu-profiler: 9,460 B) once read "0.00 GiB"
    assert format_gib(9_460) == gib_or_dash(9_460) == "9.24 KiB" and gib_number(9_460) == "9.24 KiB"
    assert signed_gib_number(9_460) == "+9.24 KiB" and signed_gib_number(-1_024) == "-1.00 KiB"
    assert format_gib(4) == "4 B" and format_gib(1_068_928) == "1.02 MiB"
    assert format_gib(9_460, 1) == "9.2 KiB"  # the decimals asked for, in the smaller unit
    # what two decimals of GiB can show stays GiB, as in every GPU report: 0.01 GiB and up, and zero itself
    assert format_gib(GiB // 100) == "0.01 GiB" and gib_number(GiB // 100) == "0.01"
    assert format_gib(0.005 * GiB) == "0.01 GiB" and signed_gib_number(GiB // 100) == "+0.01"
    assert format_gib(0) == "0.00 GiB" and gib_number(0) == "0.00" and signed_gib_number(0) == "+0.00"
    assert format_gib(91.8 * GiB, 1) == "91.8 GiB" and format_gib(None) == "—" and gib_or_dash(None) == "-"


def test_a_size_column_reads_in_its_headers_unit_and_a_tiny_figure_never_as_zero_nor_in_another_unit():
    """Issue 41: "+96.29 KiB" and "68 B" stood in GiB columns (moe-ext's kv_cache_init row, a serving window's
    holders); a CPU profiler trace's columns of KiB were headed GiB."""
    from memtrace.units import size_column

    gpu = size_column([10 * GiB, 98_600, -68, None])
    assert gpu.unit == "GiB" and gpu.cell(10 * GiB) == "10.00" and gpu.cell(None) == "-"
    assert gpu.cell(98_600, signed=True) == "+<0.01" and gpu.cell(-68, signed=True) == "-<0.01"
    assert gpu.cell(68) == "<0.01" and gpu.cell(0, signed=True) == "+0.00"
    cpu = size_column([4_332, 4_106, 4])
    assert cpu.unit == "KiB" and [cpu.cell(b) for b in (4_332, 4_106, 4)] == ["4.23", "4.01", "<0.01"]
    assert size_column([]).unit == "GiB" and size_column([3 * 1024**2]).unit == "MiB"
