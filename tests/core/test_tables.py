"""core/tables.py: cells round as they measure (what a reader pastes), '-' for none."""

import pytest

from core.tables import cell, markdown


@pytest.mark.parametrize("value,text", [
    (None, "-"), (379.0, "379"), (1.0, "1"), (0.0, "0"), (83.989, "83.99"),
    (21.5361, "21.54"), (0.2513, "0.251"), (7.927, "7.927"), (365.29, "365.3"),
    (1234.56, "1235"), (47_211.4, "47211"), (-0.5, "-0.500"), (2.5, "2.500"),
    (0.0004, "0.000"), (12, "12"), ("yes", "yes"), (float("nan"), "nan"),
])
def test_a_cell_rounds_as_it_measures(value, text):
    assert cell(value) == text


def test_a_table_of_counts_has_no_decimals():
    table = markdown(["rung", "launches", "step GPU ms"], [["baseline", 379.0, 21.536]],
                     left={"rung"})
    assert table.splitlines()[-1] == "| baseline | 379 | 21.54 |"
