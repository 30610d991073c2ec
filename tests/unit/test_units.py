"""Sizes typed by users become exact bytes; bad sizes are one-line UsageErrors."""

from __future__ import annotations

import pytest
from memtrace.errors import UsageError
from memtrace.units import format_bytes, format_gib, parse_fraction, parse_size, parse_sizes, parse_threshold


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
