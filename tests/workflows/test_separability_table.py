"""The separability table stays one line per reset however many groups a reset takes down."""

from lightning_unlearn.workflows.lacuna.separability import format_separability


def _report(failures: list[str]) -> dict:
    groups = [str(g) for g in range(6)]
    rates = {g: {"rate": 0.8, "hits": 16, "trials": 20} for g in groups}
    reset = {"extraction": {g: {"rate": 0.0} for g in groups}, "groups": [0], "met": not failures, "failures": failures}
    return {
        "extraction": rates,
        "resets": {"group 0": reset},
        "utility": {"pre": 5.0, "inj": 5.2, "delta": 0.2, "uniform": 9.2, "met": True},
        "thresholds": {"utility_max_delta": 0.5},
    }


def test_a_reset_row_names_two_failures_and_counts_the_rest():
    failures = [f"group {g} falls to 0.00 < 0.9×0.80" for g in range(1, 6)]
    row = format_separability(_report(failures)).splitlines()[4]
    assert row.endswith("FAILS: group 1 falls to 0.00 < 0.9×0.80; group 2 falls to 0.00 < 0.9×0.80; 3 more")


def test_a_reset_row_with_two_failures_names_both():
    failures = ["group 1 falls to 0.00 < 0.9×0.80", "group 2 falls to 0.10 < 0.9×0.80"]
    row = format_separability(_report(failures)).splitlines()[4]
    assert row.endswith("FAILS: group 1 falls to 0.00 < 0.9×0.80; group 2 falls to 0.10 < 0.9×0.80")
    assert format_separability(_report([])).splitlines()[4].endswith("ok")
